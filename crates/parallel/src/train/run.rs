//! The training loop: steps over the global batch, validation and
//! checkpoint cadence, metrics and progress. The CLI and library users run
//! the same loop.
//!
//! Every rank runs [`run`]. The global batch of a step is `dp x grad_accum`
//! micro-batches drawn in order from one stream (the same on every rank);
//! DP rank `r` keeps micro-batches `r, r + dp, ...`, so the union over the
//! ranks is the one-rank run's batch. Rank 0 alone writes the run
//! directory and reports progress.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use ferrotron_engine::checkpoint::{save_safetensors, write_atomic, CheckpointError};
use ferrotron_engine::data::{Batch, BatchSampler};
use ferrotron_engine::lm::{CausalLm, LmUnits};
use ferrotron_engine::metrics::{write_loss_svg, MetricsWriter, StepRecord, ValRecord};
use ferrotron_engine::params::named_tensors;

use super::step::Trainer;
use crate::comm::CommError;

/// A source of micro-batches, drawn in the same order on every rank.
pub trait BatchSource {
    /// The next micro-batch of `rows` sequences.
    fn next_batch(&mut self, rows: usize) -> Batch;
}

/// Random windows of a token stream (the sampler's deterministic order).
pub struct TokenWindows<'a> {
    /// Draws the window starts.
    pub sampler: BatchSampler,
    /// The training token stream.
    pub tokens: &'a [u32],
}

impl BatchSource for TokenWindows<'_> {
    fn next_batch(&mut self, rows: usize) -> Batch {
        self.sampler.next_batch(self.tokens, rows)
    }
}

/// The loop's schedule and what it writes.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopConfig {
    /// Optimizer steps of the run (the loop takes steps until the trainer
    /// has done this many).
    pub steps: usize,
    /// Sequences per micro-batch.
    pub micro_batch: usize,
    /// Micro-batches per optimizer step on each DP rank.
    pub grad_accum: usize,
    /// Validate (and checkpoint) every this many steps, and after the last.
    pub eval_every: usize,
    /// Model FLOPs per trained token (TFLOP/s and MFU).
    pub flops_per_token: f64,
    /// The device's peak, FLOP/s (MFU's denominator).
    pub peak_flops: f64,
    /// Where rank 0 writes `metrics.jsonl`, `model.safetensors` (at every
    /// validation, atomically) and `loss.svg` (at the end); `None` writes
    /// nothing.
    pub run_dir: Option<PathBuf>,
}

/// What the loop tells the user, on rank 0 only.
pub trait Progress {
    /// After each optimizer step.
    fn step(&mut self, _record: &StepRecord) {}
    /// After each validation (step 0 is before training); `last` is the
    /// step record just before it, if any.
    fn validation(&mut self, _step: usize, _val_loss: f64, _last: Option<&StepRecord>) {}
}

/// Reports nothing.
pub struct Silent;

impl Progress for Silent {}

/// What a run measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunSummary {
    /// Every step's record, in order.
    pub steps: Vec<StepRecord>,
    /// `(step, validation loss)` of every validation, step 0 first.
    pub validations: Vec<(usize, f64)>,
}

/// Why the loop stopped.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    /// A collective failed or timed out.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// Writing the run directory failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Writing `metrics.jsonl` failed.
    #[error("{path}: {source}")]
    Metrics {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
}

/// Rank 0's outputs.
struct Writer {
    dir: PathBuf,
    metrics: MetricsWriter,
}

impl Writer {
    fn open(dir: &Path) -> Result<Self, LoopError> {
        let path = dir.join("metrics.jsonl");
        let metrics = MetricsWriter::create(&path).map_err(|source| LoopError::Metrics {
            path: path.clone(),
            source,
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
            metrics,
        })
    }

    fn record<T: serde::Serialize>(&mut self, record: &T) -> Result<(), LoopError> {
        self.metrics
            .write(record)
            .map_err(|source| LoopError::Metrics {
                path: self.dir.join("metrics.jsonl"),
                source,
            })
    }
}

/// Trains until `trainer` has taken `config.steps` steps, drawing the
/// global batch from `batches` and validating on `val` (see the module doc).
/// Collective: every rank calls it with the same configuration and batch
/// stream.
pub fn run<B, M>(
    trainer: &mut Trainer<B, M>,
    batches: &mut dyn BatchSource,
    val: &[Batch],
    config: &LoopConfig,
    progress: &mut dyn Progress,
) -> Result<RunSummary, LoopError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + LmUnits<B> + 'static,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    let lead = trainer.groups().world().rank() == 0;
    let dp = trainer.groups().dp().clone();
    let (dp_size, dp_rank) = (dp.world_size(), dp.rank());
    let mut writer = match (&config.run_dir, lead) {
        (Some(dir), true) => Some(Writer::open(dir)?),
        _ => None,
    };
    let mut summary = RunSummary::default();
    let validate = |trainer: &Trainer<B, M>,
                    step: usize,
                    summary: &mut RunSummary,
                    writer: &mut Option<Writer>,
                    progress: &mut dyn Progress|
     -> Result<(), LoopError> {
        let val_loss = trainer.evaluate(val)?;
        // Gathering the model is a collective under ZeRO-3: every rank takes part.
        let model = trainer.full_model()?;
        if let Some(w) = writer.as_mut() {
            w.record(&ValRecord { step, val_loss })?;
            if step > 0 {
                save_safetensors(
                    &w.dir.join("model.safetensors"),
                    &named_tensors(&model.valid()),
                )?;
            }
        }
        summary.validations.push((step, val_loss));
        if lead {
            progress.validation(step, val_loss, summary.steps.last());
        }
        Ok(())
    };
    if trainer.steps_done() == 0 {
        validate(trainer, 0, &mut summary, &mut writer, progress)?;
    }
    for step in trainer.steps_done() + 1..=config.steps {
        let micro: Vec<Batch> = (0..config.grad_accum * dp_size)
            .map(|_| batches.next_batch(config.micro_batch))
            .skip(dp_rank)
            .step_by(dp_size)
            .collect();
        let t = Instant::now();
        let o = trainer.step(&micro)?;
        let dt = t.elapsed().as_secs_f64();
        let flops = config.flops_per_token * o.tokens as f64 / dt / dp_size as f64;
        let record = StepRecord {
            step,
            loss: o.loss,
            lr: o.lr,
            grad_norm: o.grad_norm,
            tokens_per_s: o.tokens as f64 / dt,
            tflops_per_device: flops / 1e12,
            mfu: flops / config.peak_flops,
            step_time_s: dt,
            memory: trainer.memory(),
        };
        if let Some(w) = writer.as_mut() {
            w.record(&record)?;
        }
        if lead {
            progress.step(&record);
        }
        summary.steps.push(record);
        if step % config.eval_every == 0 || step == config.steps {
            validate(trainer, step, &mut summary, &mut writer, progress)?;
        }
    }
    if let Some(w) = &writer {
        let train: Vec<(f64, f64)> = summary
            .steps
            .iter()
            .map(|r| (r.step as f64, r.loss))
            .collect();
        let val: Vec<(f64, f64)> = summary
            .validations
            .iter()
            .map(|&(s, l)| (s as f64, l))
            .collect();
        write_atomic(
            &w.dir.join("loss.svg"),
            write_loss_svg(&train, &val).as_bytes(),
        )?;
    }
    Ok(summary)
}
