//! The start-up description of a job and its end: the summary lines, the
//! Hugging Face export streamed from a gather per parameter, and the sample.

use std::time::Instant;

use ferrotron_engine::backend::BackendKind;
use ferrotron_engine::data::{self, Tokenizer};
use ferrotron_engine::metrics;
use ferrotron_engine::params::load_named_tensors;
use ferrotron_models::hf::{export_order, stream_hf_dir, ExportOptions, HfError, SpecialTokens};
use ferrotron_models::ops::{KernelBackend, TrainBackend};
use ferrotron_models::{generate, Decoder, SamplingConfig};
use ferrotron_parallel::train::RunSummary;
use ferrotron_parallel::zero::ZeroStage;

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
        c.model.label(),
        mc.num_params() as f64 / 1e6,
        dp * s.micro_batch * s.grad_accum,
        s.seq_len,
        s.micro_batch,
        s.grad_accum,
        c.parallelism.zero,
        trainer.recompute(),
        trainer.planned_memory().describe()
    );
    if job.world.world_size > 1 {
        text += &format!("\ncollectives: {}", job.transport.describe());
    }
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

/// After the loop: rank 0 reports the run; every rank takes part in
/// gathering the model one parameter at a time while rank 0 streams the
/// Hugging Face export (`--hf-out`) and, for the sample, builds the whole
/// model (the only whole copy, on rank 0, only when a sample is asked for
/// and only where every rank holds the whole model anyway: see
/// [`sample_skipped`]).
pub(super) fn finish<B: TrainBackend>(
    task: &mut TrainTask<'_>,
    trainer: Parallelized<B>,
    summary: &RunSummary,
    t0: Instant,
    device: &B::Device,
) -> anyhow::Result<()> {
    let lead = task.comm.rank() == 0;
    if lead {
        report_summary(&mut *task.report, summary, t0);
    }
    let whole = trainer.whole_parameters_one_by_one();
    let (c, mc) = (&task.job.config, &task.job.model);
    if let Some(dir) = &c.checkpoint.hf_out {
        if lead {
            let options = ExportOptions {
                special: task
                    .prepared
                    .special
                    .clone()
                    .unwrap_or_else(|| SpecialTokens::from_tokenizer(&task.prepared.tokenizer)),
                ..ExportOptions::default()
            };
            // A failed gather keeps its own error (not the writer's word for it).
            let mut gather_error = None;
            let mut source = |name: &str| {
                whole.get(name).map_err(|e| {
                    let message = format!("gathering parameter '{name}': {e}");
                    gather_error = Some(e);
                    HfError::NotExportable(message)
                })
            };
            let tokenizer = task.job.out.join("tokenizer.json");
            let written = stream_hf_dir(dir, mc, &mut source, Some(&tokenizer), &options);
            if let Some(e) = gather_error {
                return Err(e.into());
            }
            written?;
            task.report
                .line(&format!("Hugging Face model written to {}", dir.display()));
        } else {
            for (name, _) in export_order(mc)? {
                whole.get(&name)?;
            }
        }
    }
    let m = &c.metrics;
    if m.sample_tokens == 0 {
        return Ok(());
    }
    if let Some(why) = sample_skipped(&task.job) {
        if lead {
            task.report.line(&why);
        }
        return Ok(());
    }
    let mut named = std::collections::BTreeMap::new();
    for (name, _) in whole.shapes()? {
        let data = whole.get(&name)?;
        if lead {
            named.insert(name, data);
        }
    }
    if !lead {
        return Ok(());
    }
    let model = load_named_tensors(
        Decoder::<B::InnerBackend>::new(mc, c.schedule.seed, device)?,
        named,
        "the trained model",
    )?;
    let sampling = SamplingConfig {
        temperature: 0.8,
        top_k: 40,
        seed: c.schedule.seed,
    };
    let text = sample(
        &model,
        &task.prepared.tokenizer,
        &m.sample_prompt,
        m.sample_tokens,
        &sampling,
        &[],
        device,
    )?;
    task.report
        .line(&format!("--- sample ---\n{text}\n--------------"));
    Ok(())
}

/// Why the end-of-run sample is not drawn on `job`'s layout (`None`: it
/// is): a sample needs the whole model in one process, and no rank of a
/// run with tp, pp or ZeRO-3 over more than one rank may hold it (issue
/// 30). Megatron-LM and torchtitan print no sample either;
/// `ferrotron generate --run` samples from the run directory's weights.
fn sample_skipped(job: &ValidJob) -> Option<String> {
    let mesh = &job.mesh;
    let zero3 = job.config.parallelism.zero == ZeroStage::Three && mesh.dp * mesh.cp > 1;
    let sharded: Vec<String> = [("tp", mesh.tp), ("pp", mesh.pp)]
        .into_iter()
        .filter(|&(_, n)| n > 1)
        .map(|(name, n)| format!("{name} {n}"))
        .chain(zero3.then(|| format!("ZeRO-3 over {} ranks", mesh.dp * mesh.cp)))
        .collect();
    (!sharded.is_empty()).then(|| {
        format!(
            "sample: not drawn, since under {} no rank holds the whole model; sample the trained model with: ferrotron generate --run {}",
            sharded.join(" x "),
            job.out.display()
        )
    })
}

/// Rank 0's closing lines: the validation loss's progress and the energy.
fn report_summary(report: &mut dyn Report, summary: &RunSummary, t0: Instant) {
    if let (Some(&(s0, first)), Some(&(s1, last))) =
        (summary.validations.first(), summary.validations.last())
    {
        report.line(&format!(
            "done in {:.0} s: val_loss {first:.4} at step {s0} -> {last:.4} at step {s1} ({:.0}% lower)",
            t0.elapsed().as_secs_f64(),
            100.0 * (1.0 - last / first)
        ));
    }
    if let (Some(j), Some(per_joule)) = (summary.energy_j(), summary.tokens_per_joule()) {
        report.line(&format!(
            "energy: {:.1} kJ over {} steps ({per_joule:.1} tokens/J)",
            j / 1e3,
            summary.steps.len(),
        ));
    }
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
