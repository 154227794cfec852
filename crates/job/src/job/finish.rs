//! The start-up description of a job and its end: the whole model gathered,
//! the summary lines, the Hugging Face export and the sample.

use std::time::Instant;

use ferrotron_engine::backend::BackendKind;
use ferrotron_engine::data::{self, Tokenizer};
use ferrotron_engine::metrics;
use ferrotron_engine::params::{load_named_tensors, named_tensors};
use ferrotron_models::hf::{save_hf_dir, ExportOptions, SpecialTokens};
use ferrotron_models::ops::{KernelBackend, TrainBackend};
use ferrotron_models::{generate, Decoder, SamplingConfig};
use ferrotron_parallel::train::RunSummary;

use super::train::TrainTask;
use super::Report;
use crate::parallelize::Parallelized;
use crate::validate::ValidJob;

/// The lines that describe the job once its trainer is built.
pub(super) fn describe_run<B: TrainBackend>(
    job: &ValidJob,
    kind: BackendKind,
    trainer: &Parallelized<B>,
) -> String {
    let (c, mc) = (&job.config, &job.model);
    let s = &c.schedule;
    let dp = job.mesh.dp;
    let mut text = format!(
        "model {} ({:.2} M parameters) on {kind}; global batch {} x {} tokens = dp {dp} x micro batch {} x grad-accum {}\nZeRO stage {}; recompute {}; memory per rank: {}",
        c.model.name,
        mc.num_params() as f64 / 1e6,
        dp * s.micro_batch * s.grad_accum,
        s.seq_len,
        s.micro_batch,
        s.grad_accum,
        c.parallelism.zero,
        trainer.recompute(),
        trainer.planned_memory().describe()
    );
    if let Some(g) = c.goldfish() {
        text += &format!(
            "\ngoldfish loss: about 1 training target in {} dropped, hashed on the {} tokens before it (validation unmasked)",
            g.k(),
            g.context()
        );
    }
    text
}

/// Rank 0's energy counter: the GPU's (NVML, ROCm SMI) on cuda and rocm,
/// RAPL's on a CPU backend and on wgpu (whose adapter is not matched to an
/// NVML or ROCm SMI device; on lavapipe the CPU package is the device),
/// under `FERROTRON_POWERCAP_ROOT` if set. Reports the source, or one line
/// naming what is missing.
pub(super) fn open_energy(
    kind: BackendKind,
    gpu: usize,
    report: &mut dyn Report,
) -> Option<metrics::EnergyMeter> {
    let on_gpu = matches!(kind, BackendKind::Cuda | BackendKind::Rocm);
    let mut probe = metrics::EnergyProbe::system(on_gpu.then_some(gpu as u32));
    if let Some(root) = std::env::var_os("FERROTRON_POWERCAP_ROOT") {
        probe.rapl_root = root.into();
    }
    match probe.open() {
        Ok(meter) => {
            report.line(&format!("energy: measured by {meter}"));
            Some(meter)
        }
        Err(why) => {
            report.line(&format!("energy: not measured ({why})"));
            None
        }
    }
}

/// After the loop: every rank takes part in gathering the whole model;
/// rank 0 then reports the run, writes the export and samples.
pub(super) fn finish<B: TrainBackend>(
    task: &mut TrainTask<'_>,
    trainer: Parallelized<B>,
    summary: &RunSummary,
    t0: Instant,
    device: &B::Device,
) -> anyhow::Result<()> {
    // The whole model (gathered over the DP, TP and PP groups).
    let whole = trainer.whole_parameters()?;
    if task.comm.rank() != 0 {
        return Ok(());
    }
    let (c, mc) = (&task.job.config, &task.job.model);
    let model = load_named_tensors(
        Decoder::<B::InnerBackend>::new(mc, c.schedule.seed, device)?,
        whole.into_iter().collect(),
        "the trained model",
    )?;
    let report = &mut *task.report;
    if let (Some(&(s0, first)), Some(&(s1, last))) =
        (summary.validations.first(), summary.validations.last())
    {
        report.line(&format!(
            "done in {:.0} s: val_loss {first:.4} at step {s0} -> {last:.4} at step {s1} ({:.0}% lower)",
            t0.elapsed().as_secs_f64(),
            100.0 * (1.0 - last / first)
        ));
    }
    if let Some(j) = summary.energy_j() {
        let tokens: f64 = summary
            .steps
            .iter()
            .map(|r| r.tokens_per_s * r.step_time_s)
            .sum();
        report.line(&format!(
            "energy: {:.1} kJ over {} steps ({:.1} tokens/J)",
            j / 1e3,
            summary.steps.len(),
            tokens / j
        ));
    }
    let tokenizer = &task.prepared.tokenizer;
    if let Some(dir) = &c.checkpoint.hf_out {
        let options = ExportOptions {
            special: task
                .prepared
                .special
                .clone()
                .unwrap_or_else(|| SpecialTokens::from_tokenizer(tokenizer)),
            ..ExportOptions::default()
        };
        save_hf_dir(
            dir,
            mc,
            &named_tensors(&model),
            Some(&task.job.out.join("tokenizer.json")),
            &options,
        )?;
        report.line(&format!("Hugging Face model written to {}", dir.display()));
    }
    let m = &c.metrics;
    if m.sample_tokens > 0 {
        let sampling = SamplingConfig {
            temperature: 0.8,
            top_k: 40,
            seed: c.schedule.seed,
        };
        let text = sample(
            &model,
            tokenizer,
            &m.sample_prompt,
            m.sample_tokens,
            &sampling,
            &[],
            device,
        )?;
        report.line(&format!("--- sample ---\n{text}\n--------------"));
    }
    Ok(())
}

/// Continues `prompt` by up to `n` sampled tokens (stopping after any id of
/// `stop`) and returns the whole text.
pub fn sample<B: KernelBackend>(
    model: &Decoder<B>,
    tokenizer: &Tokenizer,
    prompt: &str,
    n: usize,
    sampling: &SamplingConfig,
    stop: &[u32],
    device: &B::Device,
) -> anyhow::Result<String> {
    let ids = data::encode(tokenizer, prompt)?;
    let new = generate(model, &ids, n, sampling, stop, true, device);
    let all: Vec<u32> = ids.into_iter().chain(new).collect();
    tokenizer
        .decode(&all, false)
        .map_err(|e| anyhow::anyhow!("decoding the sample: {e}"))
}
