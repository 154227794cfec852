//! The training loop: steps over the global batch, validation and
//! checkpoint cadence, metrics and progress. The CLI and library users run
//! the same loop.
//!
//! Every rank runs [`run`]. The global batch of a step is `dp x grad_accum`
//! micro-batches drawn in order from one stream (the same on every rank);
//! DP rank `r` keeps micro-batches `r, r + dp, ...`, so the union over the
//! ranks is the one-rank run's batch. Rank 0 alone writes the run
//! directory and reports progress.
//!
//! With [`LoopConfig::goldfish`] every training micro-batch is masked on
//! the host as it is drawn (its dropped targets become
//! [`IGNORED_TARGET`](ferrotron_engine::data::IGNORED_TARGET); the hashed
//! context reaches back before each window, see
//! [`Goldfish`](ferrotron_engine::data::Goldfish)), so every
//! path that computes the loss (whole graph, ZeRO-3 unit by unit, tensor
//! and pipeline parallelism) trains on the same kept tokens. The loss of a
//! micro-batch is the mean over its kept tokens; the step's loss and
//! gradient are the mean over the micro-batches and DP ranks of those
//! means (Megatron-LM's default: one mean per micro-batch, not one over
//! every kept token of the global batch). Validation is never masked: it
//! measures the model on every token.
//!
//! A trainer restored from a checkpoint ([`super::checkpoint`]) continues
//! where it stopped: the loop starts at its next step and appends to
//! `metrics.jsonl`. A step whose loss or gradient norm is not finite is
//! never applied ([`NonFinite`] says whether the run stops or goes on;
//! under loss scaling an overflow only halves the scale), and
//! a stop request (a signal, or a stop file) ends the run after the
//! current step, a skipped one too, with a checkpoint; no rank returns
//! before rank 0 has written it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use ferrotron_engine::checkpoint::{write_atomic, CheckpointError};
use ferrotron_engine::data::{Batch, BatchSampler, DataError, Goldfish, SamplerState, TokenSource};
use ferrotron_engine::lm::{CausalLm, LmUnits};
use ferrotron_engine::metrics::energy::Coverage;
use ferrotron_engine::metrics::{
    write_loss_svg, DeviceMemoryProbe, EnergyMeter, HeapWindow, MemoryPhase, MetricsWriter,
    OverrideRecord, PhaseMemory, PhaseWindow, StepRecord, ValRecord,
};

use super::checkpoint::background::Background;
use super::step::Trainer;
use super::test_faults;
use crate::comm::{CommError, Communicator};
use crate::tensor::ShardError;

/// A source of micro-batches, drawn in the same order on every rank.
pub trait BatchSource {
    /// The next micro-batch of `rows` sequences, or why it cannot be used
    /// (an id outside the model's vocabulary, named where it is).
    fn next_batch(&mut self, rows: usize) -> Result<Batch, DataError>;
    /// The next micro-batch of `rows` sequences with `goldfish`'s dropped
    /// targets replaced by the ignored value. By default the rows are
    /// masked without context before them ([`Goldfish::apply`]); a source
    /// that knows the stream around its windows passes it.
    fn next_goldfish_batch(
        &mut self,
        rows: usize,
        goldfish: &Goldfish,
    ) -> Result<Batch, DataError> {
        let mut batch = self.next_batch(rows)?;
        goldfish.apply(&mut batch);
        Ok(batch)
    }
    /// Where the source stands, for a checkpoint (`None`: not resumable).
    fn state(&self) -> Option<SamplerState> {
        None
    }
}

/// Random windows of a token stream (the sampler's deterministic order),
/// in memory or in memory-mapped shards: the same tokens give the same
/// batches either way. Every id drawn is checked on the host to be below
/// `vocab_size` before the batch reaches the model (the embedding and the
/// fused cross-entropy do not check their indices).
pub struct TokenWindows<'a> {
    /// Draws the window starts.
    pub sampler: BatchSampler,
    /// The training token stream.
    pub tokens: &'a dyn TokenSource,
    /// The model's vocabulary (tokens).
    pub vocab_size: usize,
}

impl BatchSource for TokenWindows<'_> {
    fn next_batch(&mut self, rows: usize) -> Result<Batch, DataError> {
        self.sampler
            .next_checked_batch(self.tokens, rows, self.vocab_size, None)
    }

    fn next_goldfish_batch(
        &mut self,
        rows: usize,
        goldfish: &Goldfish,
    ) -> Result<Batch, DataError> {
        self.sampler
            .next_checked_batch(self.tokens, rows, self.vocab_size, Some(goldfish))
    }

    fn state(&self) -> Option<SamplerState> {
        Some(self.sampler.state())
    }
}

/// What the loop does with a step whose loss or gradient norm is not finite
/// (the step's update is never applied).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NonFinite {
    /// Stop the run with [`LoopError::NonFinite`].
    Stop,
    /// Go on with the next step; stop once more than this many steps in a
    /// row were skipped.
    Skip {
        /// Most consecutive skipped steps.
        max_in_a_row: usize,
    },
}

/// The loop's schedule and what it writes.
#[derive(Clone, Debug)]
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
    /// FLOPs done per trained token, the forward work recomputation
    /// repeats included (TFLOP/s and HFU).
    pub flops_per_token: f64,
    /// Model FLOPs per trained token, recomputation not counted (MFU);
    /// equal to `flops_per_token` without recomputation.
    pub model_flops_per_token: f64,
    /// The device's peak, FLOP/s (MFU's denominator).
    pub peak_flops: f64,
    /// Where rank 0 writes `metrics.jsonl`, `model.safetensors` (at every
    /// validation, atomically), `loss.svg` (at the end) and complete
    /// checkpoints (`checkpoints/`); `None` writes nothing.
    pub run_dir: Option<PathBuf>,
    /// Write a complete checkpoint every this many steps and after the last
    /// (0: never).
    pub save_every: usize,
    /// Complete checkpoints kept (the newest ones; at least 1).
    pub keep_checkpoints: usize,
    /// Write each checkpoint in the background: the host copies are taken
    /// at the step boundary, a thread writes them while training goes on,
    /// and the checkpoint is published at a later step boundary once every
    /// rank's file is written (the next save, a stop and the end of the
    /// run wait for it); a stop's checkpoint is written at once.
    pub async_checkpoint: bool,
    /// Files `(name, bytes)` copied into every checkpoint (the run's config).
    pub checkpoint_files: Vec<(String, Vec<u8>)>,
    /// What a non-finite loss or gradient norm does.
    pub on_nonfinite: NonFinite,
    /// Set (by a signal handler) to end the run after the current step,
    /// with a checkpoint; every rank stops at the same step.
    pub stop: Option<Arc<AtomicBool>>,
    /// A file whose existence, checked after every step by every rank,
    /// ends the run like [`Self::stop`]; rank 0 removes it once the
    /// checkpoint is written.
    pub stop_file: Option<PathBuf>,
    /// Rank 0's energy counter: each step's `energy_j` and
    /// `tokens_per_joule` (`None`: not measured).
    pub energy: Option<EnergyMeter>,
    /// This rank's GPU memory: rank 0's is read after each step
    /// (`device_bytes_in_use`, `device_bytes_reserved` of the step record),
    /// every rank's after each checkpoint save; `None` on CPU backends.
    pub device_memory: Option<DeviceMemoryProbe>,
    /// Every rank's memory of the phases before the loop (building the
    /// model, loading a checkpoint), written by rank 0 to `metrics.jsonl`
    /// before the first step ([`super::gather_phase_memory`]).
    pub startup_memory: Vec<PhaseMemory>,
    /// The settings a resumed run changed (`--override`), written by rank
    /// 0 to `metrics.jsonl` before the first step, which is the first to
    /// use them.
    pub overrides: Vec<OverrideRecord>,
    /// The goldfish loss's mask applied to every training micro-batch
    /// (`None`: every target counts); see the module doc.
    pub goldfish: Option<Goldfish>,
    /// Measure each step's `peak_activation_bytes` on the host heap (CPU
    /// backends; needs [`ferrotron_engine::metrics::CountingAllocator`] as
    /// the global allocator, otherwise nothing is measured).
    pub measure_heap: bool,
}

impl Default for LoopConfig {
    /// 250 steps of one micro-batch of 8, validation every 50 steps, no
    /// FLOP count (`flops_per_token` and `model_flops_per_token` 0, so
    /// TFLOP/s, MFU and HFU read 0), nothing
    /// written, non-finite steps stop the run, no goldfish mask.
    fn default() -> Self {
        Self {
            steps: 250,
            micro_batch: 8,
            grad_accum: 1,
            eval_every: 50,
            flops_per_token: 0.0,
            model_flops_per_token: 0.0,
            peak_flops: f64::INFINITY,
            run_dir: None,
            save_every: 0,
            keep_checkpoints: 2,
            async_checkpoint: false,
            checkpoint_files: Vec::new(),
            on_nonfinite: NonFinite::Stop,
            stop: None,
            stop_file: None,
            energy: None,
            device_memory: None,
            startup_memory: Vec::new(),
            overrides: Vec::new(),
            goldfish: None,
            measure_heap: false,
        }
    }
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

impl RunSummary {
    /// Energy of every step together, joules, if every step measured it.
    pub fn energy_j(&self) -> Option<f64> {
        self.steps.iter().map(|r| r.energy_j).sum()
    }

    /// Tokens per joule over the steps that measured energy: the tokens
    /// each step's counter covers (one rank's share on a GPU counter, see
    /// [`StepRecord::tokens_per_joule`]) over the joules it read.
    pub fn tokens_per_joule(&self) -> Option<f64> {
        let (tokens, joules) = self
            .steps
            .iter()
            .filter_map(|r| Some((r.tokens_per_joule? * r.energy_j?, r.energy_j?)))
            .fold((0.0, 0.0), |(t, j), (dt, dj)| (t + dt, j + dj));
        (joules > 0.0).then(|| tokens / joules)
    }
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
    /// Joining the tensor-parallel blocks of the state failed.
    #[error(transparent)]
    Shards(#[from] ShardError),
    /// A drawn micro-batch holds an id outside the model's vocabulary
    /// (checked before the step).
    #[error(transparent)]
    Data(#[from] DataError),
    /// Writing `metrics.jsonl` failed.
    #[error("{path}: {source}")]
    Metrics {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A loss or gradient norm was not finite (the step was not applied,
    /// no checkpoint was written since).
    #[error("step {step}: {what} is not finite ({value}); the update was not applied and the last checkpoint is untouched")]
    NonFinite {
        /// The step.
        step: usize,
        /// `loss`, `gradient norm` or `validation loss`.
        what: &'static str,
        /// Its value.
        value: f64,
    },
    /// A stop was requested; the run stopped after `step` with a
    /// checkpoint in `checkpoint` (if it has a run directory).
    #[error("stopped after step {step} as requested")]
    Stopped {
        /// The last step taken.
        step: usize,
        /// The checkpoint written, to resume from.
        checkpoint: Option<PathBuf>,
    },
}

/// Rank 0's outputs.
struct Writer {
    dir: PathBuf,
    metrics: MetricsWriter,
}

impl Writer {
    /// Creates `metrics.jsonl`, or continues it after the checkpoint's step
    /// `resumed_at` of a resumed run.
    fn open(dir: &Path, resumed_at: usize) -> Result<Self, LoopError> {
        let path = dir.join("metrics.jsonl");
        let opened = if resumed_at > 0 {
            MetricsWriter::resume(&path, resumed_at)
        } else {
            MetricsWriter::create(&path)
        };
        let metrics = opened.map_err(|source| LoopError::Metrics {
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

    /// Plots the whole run's curves (read back from `metrics.jsonl`) into
    /// `loss.svg`.
    fn plot(&self) -> Result<(), LoopError> {
        let (train, val) = curves(&self.dir.join("metrics.jsonl"));
        write_atomic(
            &self.dir.join("loss.svg"),
            write_loss_svg(&train, &val).as_bytes(),
        )?;
        Ok(())
    }
}

/// The curves of a whole run, read back from its `metrics.jsonl` (a
/// resumed run plots its earlier steps too): `(step, loss)` and
/// `(step, validation loss)`.
fn curves(path: &Path) -> (Curve, Curve) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let (mut train, mut val) = (Vec::new(), Vec::new());
    for v in text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    {
        let step = v["step"].as_f64().unwrap_or(0.0);
        if let Some(loss) = v["loss"].as_f64() {
            train.push((step, loss));
        } else if let Some(loss) = v["val_loss"].as_f64() {
            val.push((step, loss));
        }
    }
    (train, val)
}

/// Points `(step, loss)` of a loss curve.
type Curve = Vec<(f64, f64)>;

/// Checks that `value` is finite.
fn finite(step: usize, what: &'static str, value: f64) -> Result<(), LoopError> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(LoopError::NonFinite { step, what, value })
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
    M::InnerModule: CausalLm<B::InnerBackend> + LmUnits<B::InnerBackend>,
{
    let world = trainer.groups().world().clone();
    let dp = trainer.groups().dp();
    let place = Place {
        lead: world.rank() == 0,
        world_size: world.world_size(),
        dp_size: dp.world_size(),
        dp_rank: dp.rank(),
    };
    let resumed = trainer.steps_done() > 0;
    let mut reports = Reports {
        lead: place.lead,
        writer: match (&config.run_dir, place.lead) {
            (Some(dir), true) => Some(Writer::open(dir, trainer.steps_done())?),
            _ => None,
        },
        progress,
        summary: RunSummary::default(),
    };
    if let Some(w) = reports.writer.as_mut() {
        for record in &config.startup_memory {
            w.record(record)?;
        }
        for record in &config.overrides {
            w.record(record)?;
        }
    }
    if !resumed {
        validate(trainer, val, 0, config, &mut reports)?;
    }
    let mut skipped_in_a_row = 0;
    // A checkpoint being written in the background (`async_checkpoint`).
    let mut pending: Option<Background> = None;
    for step in trainer.steps_done() + 1..=config.steps {
        test_faults::at_step(world.rank(), step);
        let micro = draw(batches, config, place)?;
        let (record, overflow) = timed_step(trainer, &micro, config, place, step)?;
        let (skipped, loss, grad_norm) = (record.skipped, record.loss, record.grad_norm);
        reports.step(record)?;
        // Loss scaling's own skip (the scale was halved) is not a fault:
        // the run goes on with its cadence.
        if skipped && !overflow {
            skipped_in_a_row += 1;
            if skipped_in_a_row > skips_allowed(config.on_nonfinite) {
                finite(step, "loss", loss)?;
                finite(step, "gradient norm", grad_norm)?;
            }
        } else {
            skipped_in_a_row = 0;
            if step % config.eval_every == 0 || step == config.steps {
                validate(trainer, val, step, config, &mut reports)?;
            }
        }
        // Asked also after a skipped step: a run that skips steps in a row
        // still stops when told to (its checkpoint holds the unchanged
        // weights, and the resumed run starts at the next step).
        let stop = stop_requested(config, &*world)?;
        if let Some(b) = pending.take() {
            pending = publish_when_written(b, &*world)?;
        }
        // The last step is saved even when skipped (its checkpoint holds
        // the unchanged weights), so a finished run always ends with one.
        let due = config.save_every > 0
            && ((skipped_in_a_row == 0 && step % config.save_every == 0) || step == config.steps);
        if due || stop {
            // A save waits for the one still in the background.
            if let Some(b) = pending.take() {
                b.finish(&*world)?;
            }
            let background = config.async_checkpoint && !stop;
            match save(trainer, batches, config, &mut reports, background)? {
                Saved::Background(b) => pending = Some(*b),
                Saved::Written(written) if stop => {
                    return Err(stopped(config, &*world, place.lead, step, written)?)
                }
                Saved::Written(_) => {}
            }
        }
    }
    if let Some(b) = pending.take() {
        b.finish(&*world)?;
    }
    if let Some(w) = &reports.writer {
        w.plot()?;
    }
    Ok(reports.summary)
}

/// This rank's place in the job, as the loop needs it.
#[derive(Clone, Copy)]
struct Place {
    /// World rank 0: writes the run directory and reports progress.
    lead: bool,
    /// Ranks of the job.
    world_size: usize,
    /// Ranks of the DP group.
    dp_size: usize,
    /// This rank's index in the DP group.
    dp_rank: usize,
}

/// Where the loop reports: every rank's summary, rank 0's files and progress.
struct Reports<'a> {
    lead: bool,
    /// Rank 0's run directory, if any.
    writer: Option<Writer>,
    progress: &'a mut dyn Progress,
    summary: RunSummary,
}

impl Reports<'_> {
    /// Records a step: `metrics.jsonl` and progress (rank 0), the summary.
    fn step(&mut self, record: StepRecord) -> Result<(), LoopError> {
        if let Some(w) = self.writer.as_mut() {
            w.record(&record)?;
        }
        if self.lead {
            self.progress.step(&record);
        }
        self.summary.steps.push(record);
        Ok(())
    }

    /// Records a validation: `metrics.jsonl` (rank 0), the summary,
    /// progress (rank 0).
    fn validation(&mut self, step: usize, val_loss: f64) -> Result<(), LoopError> {
        if let Some(w) = self.writer.as_mut() {
            w.record(&ValRecord { step, val_loss })?;
        }
        self.summary.validations.push((step, val_loss));
        if self.lead {
            self.progress
                .validation(step, val_loss, self.summary.steps.last());
        }
        Ok(())
    }
}

/// This rank's micro-batches of the next global batch: `grad_accum x dp`
/// drawn in order from `batches` (masked as drawn under goldfish), of
/// which DP rank `r` keeps `r, r + dp, ...`. Every rank draws (and checks)
/// them all, so a bad micro-batch stops every rank, not only its owner.
fn draw(
    batches: &mut dyn BatchSource,
    config: &LoopConfig,
    place: Place,
) -> Result<Vec<Batch>, DataError> {
    let all = (0..config.grad_accum * place.dp_size)
        .map(|_| match &config.goldfish {
            Some(goldfish) => batches.next_goldfish_batch(config.micro_batch, goldfish),
            None => batches.next_batch(config.micro_batch),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(all
        .into_iter()
        .skip(place.dp_rank)
        .step_by(place.dp_size)
        .collect())
}

/// Takes step `step` on `micro` and measures it (time, energy, device memory and heap on
/// rank 0): its record, and whether it was skipped for a loss-scale
/// overflow.
fn timed_step<B, M>(
    trainer: &mut Trainer<B, M>,
    micro: &[Batch],
    config: &LoopConfig,
    place: Place,
    step: usize,
) -> Result<(StepRecord, bool), LoopError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + LmUnits<B> + 'static,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    let meter = config.energy.as_ref().filter(|_| place.lead);
    let before = meter.and_then(|m| m.read().ok());
    let heap = (config.measure_heap && place.lead)
        .then(HeapWindow::open)
        .flatten();
    let t = Instant::now();
    let o = trainer.step(micro)?;
    let dt = t.elapsed().as_secs_f64();
    let peak_activation_bytes = heap.map(|w| w.peak_above_start() as u64);
    let device_memory = config
        .device_memory
        .as_ref()
        .filter(|_| place.lead)
        .and_then(DeviceMemoryProbe::read);
    let energy_j = meter.zip(before).and_then(|(m, b)| m.joules_since(&b).ok());
    // One rank's share of the step's tokens: a replica of the model spans
    // tp x cp x pp ranks, and there are dp of them.
    let device_tokens = o.tokens as f64 / place.world_size as f64;
    // A GPU counter covers one rank's share.
    let covered_tokens = match meter.map(EnergyMeter::coverage) {
        Some(Coverage::Device) => device_tokens,
        _ => o.tokens as f64,
    };
    let device_rate = device_tokens / dt;
    let flops = config.flops_per_token * device_rate;
    let record = StepRecord {
        step,
        loss: o.loss,
        lr: o.lr,
        grad_norm: o.grad_norm,
        tokens_per_s: o.tokens as f64 / dt,
        tflops_per_device: flops / 1e12,
        mfu: config.model_flops_per_token * device_rate / config.peak_flops,
        hfu: flops / config.peak_flops,
        step_time_s: dt,
        memory: trainer.memory(),
        peak_activation_bytes,
        device_bytes_in_use: device_memory.map(|m| m.in_use),
        device_bytes_reserved: device_memory.map(|m| m.reserved),
        energy_j,
        tokens_per_joule: energy_j.filter(|&j| j > 0.0).map(|j| covered_tokens / j),
        skipped: o.skipped,
        pipeline: o.pipeline,
        grad_comm: o.grad_comm,
        loss_scale: o.loss_scale,
        skipped_steps: o.skipped_steps,
    };
    Ok((record, o.overflow))
}

/// Skipped steps in a row that the run goes on after.
fn skips_allowed(on_nonfinite: NonFinite) -> usize {
    match on_nonfinite {
        NonFinite::Stop => 0,
        NonFinite::Skip { max_in_a_row } => max_in_a_row,
    }
}

/// Validates the model at `step` on the parallel model (no gather) and
/// reports it; after step 0 rank 0 also writes the weights to the run
/// directory's `model.safetensors`, gathered one parameter at a time
/// (every rank takes part).
fn validate<B, M>(
    trainer: &Trainer<B, M>,
    val: &[Batch],
    step: usize,
    config: &LoopConfig,
    reports: &mut Reports<'_>,
) -> Result<(), LoopError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + LmUnits<B> + 'static,
    M::InnerModule: CausalLm<B::InnerBackend> + LmUnits<B::InnerBackend>,
{
    let val_loss = trainer.evaluate(val)?;
    finite(step, "validation loss", val_loss)?;
    if let (Some(dir), true) = (&config.run_dir, step > 0) {
        trainer
            .whole_parameters_one_by_one()
            .write_safetensors(&dir.join("model.safetensors"), reports.lead)?;
    }
    reports.validation(step, val_loss)
}

/// Whether any rank was asked to stop: its `config.stop` flag is set or
/// it sees `config.stop_file`. A collective when either is configured
/// (every rank must stop at the same step).
fn stop_requested(config: &LoopConfig, world: &dyn Communicator) -> Result<bool, CommError> {
    if config.stop.is_none() && config.stop_file.is_none() {
        return Ok(false);
    }
    let flag = config
        .stop
        .as_ref()
        .is_some_and(|f| f.load(Ordering::SeqCst));
    let file = config.stop_file.as_ref().is_some_and(|p| p.exists());
    let mut any = [f32::from(u8::from(flag || file))];
    world.all_reduce_sum(&mut any)?;
    Ok(any[0] > 0.0)
}

/// The end of a stopped run, after its checkpoint `written` (rank 0's):
/// rank 0 removes the stop file (so that the resumed run does not stop at
/// once), then every rank waits for every other, so that no rank exits
/// before rank 0 has written the checkpoint (`mpirun` ends the whole job
/// when the first rank exits with a non-zero code).
fn stopped(
    config: &LoopConfig,
    world: &dyn Communicator,
    lead: bool,
    step: usize,
    written: Option<PathBuf>,
) -> Result<LoopError, CommError> {
    if let (true, Some(file)) = (lead, &config.stop_file) {
        // A file that stays (removed by someone else, or not removable)
        // only stops the resumed run after its first step, with a checkpoint.
        let _ = std::fs::remove_file(file);
    }
    world.barrier()?;
    Ok(LoopError::Stopped {
        step,
        checkpoint: written,
    })
}

/// What [`save`] left.
enum Saved {
    /// The checkpoint is written: its directory on rank 0 (`None` on the
    /// other ranks or without a run directory).
    Written(Option<PathBuf>),
    /// This rank's file is being written in the background.
    Background(Box<Background>),
}

/// A complete checkpoint under the run directory's `checkpoints/` (a
/// collective: every rank writes its share, rank 0 the index, and rank 0
/// records every rank's peak memory while saving), or with `background`
/// begun: the host copies taken and a thread writing them
/// ([`Trainer::start_checkpoint`]).
fn save<B, M>(
    trainer: &Trainer<B, M>,
    batches: &dyn BatchSource,
    config: &LoopConfig,
    reports: &mut Reports<'_>,
    background: bool,
) -> Result<Saved, LoopError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + LmUnits<B> + 'static,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    let Some(dir) = &config.run_dir else {
        return Ok(Saved::Written(None));
    };
    let world = trainer.groups().world();
    super::phase_memory::release_free_heap();
    let window = PhaseWindow::open(MemoryPhase::CheckpointSave, config.device_memory.clone());
    let (root, sampler) = (dir.join("checkpoints"), batches.state());
    let (files, keep) = (&config.checkpoint_files, config.keep_checkpoints);
    let saved = if background {
        match trainer.start_checkpoint(&root, sampler, files, keep)? {
            Some(b) => Saved::Background(Box::new(b)),
            None => Saved::Written(None),
        }
    } else {
        Saved::Written(trainer.write_checkpoint(&root, sampler, files, keep)?)
    };
    let mine = window.close(world.rank(), trainer.steps_done());
    for record in super::gather_phase_memory(&**world, &mine)? {
        if let Some(w) = reports.writer.as_mut() {
            w.record(&record)?;
        }
    }
    Ok(saved)
}

/// Publishes the background checkpoint `b` if every rank's file is
/// written (a collective over `world`, at a step boundary); else gives it
/// back.
fn publish_when_written(
    b: Background,
    world: &dyn Communicator,
) -> Result<Option<Background>, LoopError> {
    let mut done = [f32::from(u8::from(b.written()))];
    world.all_reduce_sum(&mut done)?;
    if done[0] as usize == world.world_size() {
        b.finish(world)?;
        return Ok(None);
    }
    Ok(Some(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The summary's tokens per joule weigh each step by its joules: the
    /// tokens the counters covered over the joules they read, not the
    /// job's tokens (which a GPU counter covers one rank's share of).
    #[test]
    fn the_runs_tokens_per_joule_are_the_covered_tokens_over_the_joules() {
        let record = |energy: Option<f64>, per_joule: Option<f64>| -> StepRecord {
            let mut r: StepRecord = serde_json::from_str(
                r#"{"step": 1, "loss": 1.0, "lr": 0.1, "grad_norm": 1.0, "tokens_per_s": 4000.0,
                    "tflops_per_device": 1.0, "mfu": 0.5, "step_time_s": 1.0,
                    "param_bytes": 0, "grad_bytes": 0, "optimizer_bytes": 0}"#,
            )
            .unwrap();
            (r.energy_j, r.tokens_per_joule) = (energy, per_joule);
            r
        };
        let summary = |steps| RunSummary {
            steps,
            validations: Vec::new(),
        };
        // 2 J covering 20 tokens, 3 J covering 60: 80 tokens over 5 J.
        let measured = summary(vec![
            record(Some(2.0), Some(10.0)),
            record(Some(3.0), Some(20.0)),
        ]);
        assert_eq!(measured.tokens_per_joule(), Some(16.0));
        assert_eq!(measured.energy_j(), Some(5.0));
        assert_eq!(summary(vec![record(None, None)]).tokens_per_joule(), None);
    }

    #[test]
    fn every_rank_checks_the_whole_global_batch_so_all_stop_at_the_same_step() {
        // Ids below 50 except the one at position 25.
        let mut tokens: Vec<u32> = (0..40).collect();
        tokens[25] = 50;
        let config = LoopConfig {
            micro_batch: 1,
            grad_accum: 2,
            ..LoopConfig::default()
        };
        let first_error = |dp_rank: usize| {
            let place = Place {
                lead: dp_rank == 0,
                world_size: 2,
                dp_size: 2,
                dp_rank,
            };
            let mut windows = TokenWindows {
                sampler: BatchSampler::new(tokens.len(), 4, 1).unwrap(),
                tokens: &tokens,
                vocab_size: 50,
            };
            (0..1000)
                .find_map(|step| match draw(&mut windows, &config, place) {
                    Ok(micro) => {
                        assert_eq!(micro.len(), 2, "grad_accum micro-batches per rank");
                        None
                    }
                    Err(e) => Some((step, e.to_string())),
                })
                .expect("a window holds position 25")
        };
        let (step, e) = first_error(0);
        assert_eq!(first_error(1), (step, e.clone()));
        assert_eq!(
            e,
            "token id 50 at token 25 of the stream is outside the vocabulary of 50 tokens (the model's)"
        );
    }
}
