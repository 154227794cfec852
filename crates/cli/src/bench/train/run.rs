//! One `bench train` measurement: the backends to run, and the timed
//! steps on each.

use std::time::Instant;

use ferrotron_engine::backend::{BackendKind, ALL_BACKENDS};
use ferrotron_engine::data::Batch;
use ferrotron_engine::metrics::{device_spec, measure_matmul_flops, DeviceSpec, HeapWindow};
use ferrotron_engine::precision::Precision;
use ferrotron_models::ops::{choose_kernels, HeadLoss, TrainBackend};
use ferrotron_models::{Decoder, DecoderConfig};
use ferrotron_parallel::groups::ProcessGroups;
use ferrotron_parallel::recompute::Recompute;

use super::args::TrainBenchArgs;
use super::record::{Record, ResultFile, Skipped, SCHEMA};
use super::{host, model, table, write_outputs};
use crate::error::usage;
use ferrotron_job::config::AttentionKernelChoice;
use ferrotron_job::error::usage_lines;
use ferrotron_job::{check_ready, dispatch, parallelize, BackendTask, JobConfig, World};

/// Side of the square f32 matmul whose measured rate is a CPU's peak.
const GEMM_N: usize = 1024;

/// Measures every selected backend, prints the table, writes the outputs.
pub fn run(args: &TrainBenchArgs) -> anyhow::Result<()> {
    for (flag, v) in [
        ("--batch", args.batch),
        ("--seq", args.seq),
        ("--steps", args.steps),
    ] {
        if v == 0 {
            return Err(usage(format!("{flag} must be at least 1")));
        }
    }
    if let Some(t) = args.peak_tflops {
        if !(t.is_finite() && t > 0.0) {
            return Err(usage(format!("--peak-tflops {t}: must be positive")));
        }
    }
    let gpu_peak = match &args.device_type {
        None => None,
        Some(name) => match device_spec(name).filter(|d| d.fp32_flops > 0.0) {
            Some(d) => Some(d),
            None => {
                return Err(usage(format!(
                    "--device-type {name}: not a GPU type of the table (a100-40gb, a100-80gb, h100-80gb, h200, mi250x-gcd, mi300x)"
                )))
            }
        },
    };
    let config = model::resolve(args)?;
    let (kinds, skipped) = select(args.backends.as_deref())?;
    // The choice `Decoder::new` makes on each backend, checked before any runs.
    for kind in &kinds {
        choose_kernels(&config, kind.is_cpu().then(|| kind.name()))
            .map_err(|e| usage(format!("--kernels {}", e.problem)))?;
    }
    let mut results = Vec::new();
    for kind in kinds {
        let task = StepBench {
            config: config.clone(),
            args,
            gpu_peak,
        };
        results.push(dispatch(kind, 0, task)?);
    }
    let file = ResultFile {
        schema: SCHEMA.into(),
        results,
        skipped,
    };
    print!("{}", table::render(&file.results, &file.skipped));
    write_outputs(args, &file)
}

/// The backends to run, in the order of [`ALL_BACKENDS`], and those left
/// out with the reason. A backend named in `--backends` that cannot run
/// is an error; one left to the default is skipped.
fn select(names: Option<&[String]>) -> anyhow::Result<(Vec<BackendKind>, Vec<Skipped>)> {
    if let Some(names) = names {
        for name in names {
            name.parse::<BackendKind>()
                .map_err(|e| usage(format!("--backends {name}: {e}")))?;
        }
    }
    let mut kinds = Vec::new();
    let mut skipped = Vec::new();
    for kind in ALL_BACKENDS {
        let explicit = match names {
            Some(n) if !n.iter().any(|n| n == kind.name()) => continue,
            Some(_) => true,
            None => false,
        };
        let why = if !kind.is_compiled() {
            Some(format!(
                "not compiled into this build (cargo feature {kind})"
            ))
        } else {
            check_ready(kind).err()
        };
        match why {
            None => kinds.push(kind),
            Some(reason) if explicit => return Err(usage(format!("--backends {kind}: {reason}"))),
            Some(reason) => skipped.push(Skipped {
                backend: kind.name().into(),
                reason,
            }),
        }
    }
    if kinds.is_empty() {
        return Err(usage("bench train: no backend of this build can run here"));
    }
    Ok((kinds, skipped))
}

/// A GPU's data-sheet peak for a run in `precision`, TFLOP/s, and where it
/// comes from: the vector units' fp32 peak, or the matrix units' for bf16
/// and fp16 (the precision whose matrix products dominate the step).
fn data_sheet_peak(d: &DeviceSpec, precision: Precision) -> (f64, String) {
    let units = match precision {
        Precision::Fp32 => "fp32 (vector units)",
        Precision::Bf16 | Precision::Fp16 => "bf16/fp16 (matrix units)",
    };
    (
        d.peak_flops(precision) / 1e12,
        format!("the {units} data-sheet peak of {}", d.name),
    )
}

/// The measurement on one backend.
struct StepBench<'a> {
    config: DecoderConfig,
    args: &'a TrainBenchArgs,
    /// `--device-type`'s data sheet: the peak of the run's precision.
    gpu_peak: Option<DeviceSpec>,
}

impl BackendTask for StepBench<'_> {
    type Output = Record;

    fn run<B: TrainBackend>(self, kind: BackendKind, device: B::Device) -> anyhow::Result<Record> {
        let a = self.args;
        let cpu = kind.is_cpu();
        let valid = job_config(a, kind, &self.config)
            .validate_for(&World::SINGLE, self.config.clone())
            .map_err(|e| usage_lines(&e))?;
        let precision = valid.model().precision;
        let (peak_tflops, peak_source) = match (a.peak_tflops, cpu, self.gpu_peak) {
            (Some(t), _, _) => (Some(t), "--peak-tflops".to_string()),
            (None, true, _) => {
                let f = measure_matmul_flops::<B::InnerBackend>(&device, GEMM_N, 3);
                (
                    Some(f / 1e12),
                    format!("the measured f32 GEMM rate of {kind} ({GEMM_N}^3, best of 3)"),
                )
            }
            (None, false, Some(d)) => {
                let (tflops, source) = data_sheet_peak(&d, precision);
                (Some(tflops), source)
            }
            (None, false, None) => (
                None,
                "nothing: peak unknown (give --device-type or --peak-tflops)".to_string(),
            ),
        };
        for note in valid.notes() {
            eprintln!("bench: {note}");
        }
        let config = valid.model().clone();
        let rss_reset = cpu && host::reset_peak_rss();
        let model = Decoder::<B>::new(&config, a.seed, &device)?;
        let head = match model.ops().head_loss() {
            HeadLoss::Chunked => "chunked",
            HeadLoss::Logits => "logits",
        };
        let total = a.warmup + a.steps;
        let mut trainer = parallelize(model, ProcessGroups::single(), &valid, &device)?;
        let mut peak_activation_bytes = None;
        let mut tokens = TokenStream(a.seed ^ 0x9e37_79b9_7f4a_7c15);
        let mut times = Vec::with_capacity(a.steps);
        let mut last_loss = f64::NAN;
        let device_memory = ferrotron_job::device_memory(kind, 0);
        // Reserved bytes, largest after any step; bytes in use after the last.
        let (mut reserved, mut in_use) = (None, None);
        for i in 0..total {
            let batch = tokens.batch(a.batch, a.seq, self.config.vocab_size);
            let heap = cpu.then(HeapWindow::open).flatten();
            let t = Instant::now();
            let out = trainer.step(std::slice::from_ref(&batch))?;
            B::sync(&device).map_err(|e| anyhow::anyhow!("{kind}: device sync: {e:?}"))?;
            let s = t.elapsed().as_secs_f64();
            if let (Some(w), true) = (heap, i >= a.warmup) {
                let peak = w.peak_above_start() as u64;
                peak_activation_bytes = Some(peak_activation_bytes.unwrap_or(0).max(peak));
            }
            let phase = if i < a.warmup { "warm-up" } else { "timed" };
            eprintln!(
                "bench train: {kind} step {}/{total} ({phase}): {s:.3} s, loss {:.4}",
                i + 1,
                out.loss
            );
            if i >= a.warmup {
                times.push(s);
            }
            if let Some(m) = device_memory.as_ref().and_then(|p| p.read()) {
                reserved = reserved.max(Some(m.reserved));
                in_use = Some(m.in_use);
            }
            last_loss = out.loss;
        }
        let (peak_memory_bytes, memory_source) = match cpu {
            true => (
                host::peak_rss_bytes(),
                if rss_reset {
                    "VmHWM, the process's peak resident memory from building the model to the last step"
                } else {
                    "VmHWM, the process's peak resident memory since it started (clear_refs not writable)"
                }
                .to_string(),
            ),
            false => (
                reserved,
                match &device_memory {
                    Some(p) => format!(
                        "bytes the {} hold on the device, largest after any step (they grow to \
                         the largest demand and keep it: an upper bound of the peak)",
                        p.name()
                    ),
                    None => "device memory not measured on this backend".to_string(),
                },
            ),
        };
        times.sort_by(f64::total_cmp);
        let step_s_median = times[times.len() / 2];
        let tokens_per_s = (a.batch * a.seq) as f64 / step_s_median;
        let flops_per_token = self
            .config
            .train_flops_per_token(a.seq, trainer.recompute());
        let tflops = flops_per_token * tokens_per_s / 1e12;
        let model_tflops =
            self.config.train_flops_per_token(a.seq, Recompute::None) * tokens_per_s / 1e12;
        Ok(Record {
            framework: format!("ferrotron {}", env!("CARGO_PKG_VERSION")),
            commit: option_env!("FERROTRON_COMMIT").map(str::to_string),
            backend: kind.name().into(),
            device: match (cpu, self.gpu_peak) {
                (true, _) => host::cpu_name(),
                (false, Some(d)) => format!("{} ({kind} GPU 0)", d.name),
                (false, None) => gpu_name(kind),
            },
            threads: cpu.then(host::cpu_threads),
            shape: model::shape(&config),
            precision: precision.name().into(),
            recompute: trainer.recompute(),
            head: Some(head.to_string()),
            attention_kernel: match a.attention_kernel {
                AttentionKernelChoice::Auto => None,
                AttentionKernelChoice::MatrixUnits => Some("matrix-units".to_string()),
                AttentionKernelChoice::Registers => Some("registers".to_string()),
            },
            batch: a.batch,
            seq: a.seq,
            warmup: a.warmup,
            steps: a.steps,
            step_s_median,
            tokens_per_s,
            flops_per_token,
            tflops,
            mfu: peak_tflops.map(|p| model_tflops / p),
            hfu: peak_tflops.map(|p| tflops / p),
            peak_tflops,
            peak_source,
            peak_memory_bytes,
            memory_source,
            device_bytes_in_use: in_use,
            peak_activation_bytes,
            last_loss,
        })
    }
}

/// The job a measurement runs: the model `config` on backend `kind` with
/// the bench's batch, precision, recompute and kernels, a constant learning
/// rate, nothing sampled; validated and parallelized as `train` does.
fn job_config(a: &TrainBenchArgs, kind: BackendKind, config: &DecoderConfig) -> JobConfig {
    let mut job = JobConfig::default();
    job.backend.name = kind.name().into();
    job.backend.kernels = config.kernels;
    job.backend.attention_kernel = a.attention_kernel;
    job.precision.compute = a.precision;
    job.parallelism.recompute = Some(a.recompute);
    job.optimizer.lr = 3e-4;
    job.optimizer.min_lr = 3e-4;
    job.optimizer.warmup_steps = Some(0);
    job.schedule.steps = a.warmup + a.steps;
    job.schedule.micro_batch = a.batch;
    job.schedule.seq_len = a.seq;
    job.schedule.seed = a.seed;
    job.metrics.sample_tokens = 0;
    job
}

/// Seeded token ids (splitmix64), uniform over the vocabulary.
struct TokenStream(u64);

impl TokenStream {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A `[batch, seq]` batch whose targets are the inputs shifted by one
    /// (each row a window of `seq + 1` ids).
    fn batch(&mut self, batch: usize, seq: usize, vocab: usize) -> Batch {
        let mut inputs = Vec::with_capacity(batch * seq);
        let mut targets = Vec::with_capacity(batch * seq);
        for _ in 0..batch {
            let row: Vec<i64> = (0..=seq)
                .map(|_| (self.next() % vocab as u64) as i64)
                .collect();
            inputs.extend_from_slice(&row[..seq]);
            targets.extend_from_slice(&row[1..]);
        }
        Batch {
            inputs,
            targets,
            batch,
            seq_len: seq,
        }
    }
}

/// The device of a GPU backend run without `--device-type`: on wgpu the
/// default adapter's name (e.g. `llvmpipe (LLVM 19.1.7, 256 bits) (wgpu)`),
/// else `KIND GPU 0`.
fn gpu_name(kind: BackendKind) -> String {
    #[cfg(feature = "wgpu")]
    if kind == BackendKind::Wgpu {
        if let Some((adapter, _)) = ferrotron_kernels::wgpu_setup::default_adapter() {
            return format!("{adapter} (wgpu)");
        }
    }
    format!("{kind} GPU 0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpus_peak_follows_the_runs_precision() {
        let h100 = device_spec("h100-80gb").unwrap();
        let (fp32, source) = data_sheet_peak(&h100, Precision::Fp32);
        assert_eq!(fp32, 67.0);
        assert!(
            source.contains("fp32") && source.contains("h100-80gb"),
            "{source}"
        );
        for p in [Precision::Bf16, Precision::Fp16] {
            let (tflops, source) = data_sheet_peak(&h100, p);
            assert_eq!(tflops, 989.0);
            assert!(source.contains("matrix units"), "{source}");
        }
    }
}
