//! The backend-generic part of a job: build or load the model,
//! `parallelize` it, restore a resumed run, and run the training loop.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use ferrotron_engine::checkpoint::CheckpointError;

use ferrotron_engine::backend::BackendKind;
use ferrotron_engine::data::{self, BatchSampler, TokenSource};
use ferrotron_engine::metrics::{self, MemoryPhase, OverrideRecord, PhaseMemory, PhaseWindow};
use ferrotron_engine::precision::Precision;
use ferrotron_models::ops::TrainBackend;
use ferrotron_parallel::comm::Communicator;
use ferrotron_parallel::groups::ProcessGroups;
use ferrotron_parallel::recompute::Recompute;
use ferrotron_parallel::train::checkpoint::read::Reader;
use ferrotron_parallel::train::{
    self, gather_phase_memory, LoopConfig, LoopError, NonFinite, RunSummary, Silent, TokenWindows,
};
use ferrotron_parallel::zero::ZeroStage;

use super::prepare::Prepared;
use super::{finish, Report};
use crate::backend::BackendTask;
use crate::config::OnNonFinite;
use crate::error::{usage, Interrupted};
use crate::parallelize::{
    parallelize_fresh, parallelize_hf_dir, parallelize_to_load, Parallelized,
};
use crate::validate::ValidJob;

/// A job on one backend.
pub(super) struct TrainTask<'a> {
    pub job: ValidJob,
    pub prepared: Prepared,
    /// This rank's communicator over the whole job.
    pub comm: Arc<dyn Communicator>,
    /// Set by SIGINT / SIGTERM.
    pub stop: Option<Arc<AtomicBool>>,
    pub report: &'a mut dyn Report,
}

impl TrainTask<'_> {
    /// A line of the log, on rank 0.
    fn say(&mut self, text: impl AsRef<str>) {
        if self.comm.rank() == 0 {
            self.report.line(text.as_ref());
        }
    }

    /// The rank's trainer: the model built (or loaded) and parallelized,
    /// a resumed run's optimizer state restored; and every rank's peak
    /// memory while building it and while reading the checkpoint.
    fn trainer<B: TrainBackend>(
        &mut self,
        kind: BackendKind,
        device: &B::Device,
    ) -> anyhow::Result<(Parallelized<B>, Vec<PhaseMemory>)> {
        let (job, mc) = (&self.job, &self.job.model);
        let probe = crate::backend::device_memory(kind, job.world.local_rank);
        let rank = self.comm.rank();
        let groups = ProcessGroups::new(self.comm.clone(), job.mesh)?;
        let window = PhaseWindow::open(MemoryPhase::Build, probe.clone());
        // Weights of `--hf-dir` are read already cut to this rank's part,
        // and a fresh or resumed model is built already cut to it (under
        // ZeRO-3 both to its DP pieces, which a resumed run does not draw);
        // a resumed one then reads its share of the checkpoint below.
        let resumed = self.prepared.restore.is_some();
        let mut trainer = match self.prepared.initial.take() {
            Some(dir) => parallelize_hf_dir::<B>(&dir, groups, job, device)?,
            None if resumed => parallelize_to_load::<B>(groups, job, device)?,
            None => parallelize_fresh::<B>(groups, job, device)?,
        };
        let mut memory = gather_phase_memory(&*self.comm, &window.close(rank, 0))?;
        let precision = mc.precision;
        let pr = &job.config.precision;
        let offloaded = job.config.parallelism.offload == crate::config::Offload::Optimizer;
        self.say(format!(
            "precision {precision} (master weights, gradients and AdamW state f32{}); gradients reduced in {}{}{}",
            if offloaded {
                "; AdamW state offloaded to host memory, updated on the CPU"
            } else {
                ""
            },
            pr.reduce_dtype,
            match (trainer.syncs_on_device(), trainer.zero_stage()) {
                (false, _) => "",
                (true, ZeroStage::Off) => ", by NCCL on their own buffers",
                (true, _) => ", by NCCL on their own buffers (ZeRO's parameter gathers too)",
            },
            if precision == Precision::Fp16 {
                format!("; dynamic loss scale from {} (doubles after {} clean steps)", pr.loss_scale_init, pr.loss_scale_window)
            } else {
                String::new()
            }
        ));
        if let Some((state, dir)) = self.prepared.restore.take() {
            // A damaged or foreign checkpoint is bad input: exit 2, naming the file.
            let bad = |e: CheckpointError| usage(format!("--resume: {e}"));
            let window = PhaseWindow::open(MemoryPhase::CheckpointLoad, probe);
            let mut reader = Reader::open(&dir).map_err(bad)?;
            trainer.load(&mut reader, &state).map_err(bad)?;
            let mine = window.close(rank, state.step);
            memory.extend(gather_phase_memory(&*self.comm, &mine)?);
            self.say(format!(
                "resumed from {} (step {}, written by {})",
                dir.display(),
                state.step,
                reader.index().layout
            ));
        }
        Ok((trainer, memory))
    }

    /// The settings a resumed run changed under `--override`, as the
    /// records the loop writes to `metrics.jsonl` before the first step that
    /// uses them; rank 0 says them in the log.
    fn overrides(&mut self) -> Vec<OverrideRecord> {
        let Some(r) = &self.job.resume else {
            return Vec::new();
        };
        let step = r.state.step + 1;
        let records: Vec<OverrideRecord> = r
            .overridden()
            .iter()
            .map(|c| OverrideRecord {
                step,
                key: c.key.path(),
                was: c.was.clone(),
                now: c.now.clone(),
            })
            .collect();
        if self.comm.rank() == 0 && !records.is_empty() {
            let said: Vec<String> = r
                .overridden()
                .iter()
                .map(|c| format!("{} {} -> {}", c.key.path(), c.was_text(), c.now_text()))
                .collect();
            self.say(format!("from step {step}, overridden: {}", said.join(", ")));
        }
        records
    }

    /// The training loop's plan.
    fn loop_config(
        &mut self,
        kind: BackendKind,
        peak_flops: f64,
        recompute: Recompute,
        startup_memory: Vec<PhaseMemory>,
        overrides: Vec<OverrideRecord>,
    ) -> LoopConfig {
        let (c, mc) = (&self.job.config, &self.job.model);
        let seq_len = c.schedule.seq_len;
        let lead = self.comm.rank() == 0;
        LoopConfig {
            steps: c.schedule.steps,
            micro_batch: c.schedule.micro_batch,
            grad_accum: c.schedule.grad_accum,
            eval_every: c.schedule.eval_every,
            flops_per_token: mc.train_flops_per_token(seq_len, recompute),
            model_flops_per_token: mc.train_flops_per_token(seq_len, Recompute::None),
            peak_flops,
            run_dir: Some(self.job.out.clone()),
            save_every: c.save_every(),
            keep_checkpoints: c.checkpoint.keep_checkpoints,
            async_checkpoint: c.checkpoint.async_checkpoint,
            checkpoint_files: self.prepared.run_files.clone(),
            on_nonfinite: match c.optimizer.on_nonfinite {
                OnNonFinite::Stop => NonFinite::Stop,
                OnNonFinite::Skip => NonFinite::Skip {
                    max_in_a_row: c.optimizer.max_skipped,
                },
            },
            stop: self.stop.clone(),
            stop_file: c.checkpoint.stop_file.clone(),
            goldfish: c.goldfish(),
            energy: if lead {
                finish::open_energy(kind, self.job.world.local_rank, self.report)
            } else {
                None
            },
            device_memory: crate::backend::device_memory(kind, self.job.world.local_rank),
            startup_memory,
            overrides,
            // The host heap holds the activations on the CPU backends only.
            measure_heap: kind.is_cpu(),
        }
    }
}

impl BackendTask for TrainTask<'_> {
    type Output = Option<RunSummary>;

    fn run<B: TrainBackend>(
        mut self,
        kind: BackendKind,
        device: B::Device,
    ) -> anyhow::Result<Option<RunSummary>> {
        let lead = self.comm.rank() == 0;
        let out = self.job.out.clone();
        self.say(format!("run directory: {}", out.display()));
        self.say(self.job.mesh.describe());
        let t0 = Instant::now();
        let c = self.job.config.clone();
        let tokens = self
            .prepared
            .tokens
            .take()
            .expect("prepare reads the tokens");
        let (train_tokens, val_tokens) = (tokens.train(), tokens.val());
        let restored = self.prepared.restore.as_ref().map(|r| &r.0);
        let sampler = match restored.and_then(|r| r.sampler) {
            // The data order of a checkpoint written by a loop without a
            // sampler (a library user's) cannot be continued.
            None if restored.is_some_and(|r| r.step > 0) => {
                return Err(usage(
                    "--resume: the checkpoint's state.json holds no sampler state, so its data order cannot be continued",
                ))
            }
            Some(state) if state.tokens_len != train_tokens.len() => {
                return Err(usage(format!(
                    "--resume: the checkpoint's sampler drew from {} training tokens, this data gives {}",
                    state.tokens_len,
                    train_tokens.len()
                )))
            }
            Some(state) => BatchSampler::from_state(state)?,
            None => BatchSampler::new(train_tokens.len(), c.schedule.seq_len, c.schedule.seed)?,
        };
        let val_batches = data::eval_batches(
            &val_tokens,
            c.schedule.seq_len,
            c.schedule.micro_batch,
            c.schedule.eval_batches,
        );
        // The evaluation windows are contiguous from the start of the
        // validation tokens: check the ids they read, as training checks
        // each batch it draws.
        let val_windows: usize = val_batches.iter().map(|b| b.batch).sum();
        if val_windows > 0 {
            let vocab = self.job.model.vocab_size;
            data::check_ids(&val_tokens, 0, val_windows * c.schedule.seq_len + 1, vocab)
                .map_err(|e| usage(format!("validation tokens: {e}")))?;
        }
        let (mut trainer, startup_memory) = self.trainer::<B>(kind, &device)?;
        let overrides = self.overrides();
        let peak = match self.job.peak_flops {
            Some(p) => p,
            None => {
                let p = metrics::measure_matmul_flops::<B::InnerBackend>(&device, 512, 3);
                self.say(format!(
                    "MFU is relative to this {kind} device's measured f32 matmul rate, {:.1} GFLOP/s (set --peak-tflops or --device-type for a data-sheet peak)",
                    p / 1e9
                ));
                p
            }
        };
        self.say(finish::describe_run(&self.job, kind, &trainer));
        let plan = self.loop_config(kind, peak, trainer.recompute(), startup_memory, overrides);
        let mut batches = TokenWindows {
            sampler,
            tokens: &train_tokens,
            vocab_size: self.job.model.vocab_size,
        };
        let mut silent = Silent;
        let progress: &mut dyn train::Progress = if lead { &mut *self.report } else { &mut silent };
        let summary = match train::run(&mut trainer, &mut batches, &val_batches, &plan, progress) {
            Ok(summary) => summary,
            Err(LoopError::Stopped { step, checkpoint }) => {
                let message = match checkpoint {
                    Some(dir) => format!(
                        "stopped after step {step} as requested (signal or stop file); checkpoint {}; continue with: ferrotron train --resume {}",
                        dir.display(),
                        out.display()
                    ),
                    None => format!("stopped after step {step} as requested (signal or stop file)"),
                };
                return Err(Interrupted(if lead { message } else { String::new() }).into());
            }
            // An id outside the vocabulary is the data's fault (exit 2).
            Err(LoopError::Data(e)) => return Err(usage(format!("training tokens: {e}"))),
            Err(e) => return Err(e.into()),
        };
        finish::finish::<B>(&mut self, trainer, &summary, t0, &device)?;
        Ok(lead.then_some(summary))
    }
}
