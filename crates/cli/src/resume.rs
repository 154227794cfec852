//! `ferrotron train --resume`: the checkpoint to continue from, and which
//! settings may differ from the run's own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::tensor::TensorData;
use ferrotron_engine::checkpoint::load_safetensors;
use ferrotron_parallel::train::checkpoint::{self, CheckpointState};

use crate::error::usage;
use crate::run_config::RunConfig;
use crate::settings::TrainSettings;

/// A checkpoint to continue from.
pub struct Resume {
    /// The `step-N` directory.
    pub dir: PathBuf,
    /// The run directory it belongs to.
    pub run: PathBuf,
    /// Its `state.json`.
    pub state: CheckpointState,
    /// The run's settings and model when the checkpoint was written.
    pub config: RunConfig,
}

impl Resume {
    /// The checkpoint `path` names: a run directory (its latest checkpoint)
    /// or a `RUN/checkpoints/step-N` directory. Errors name the file.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let dir = checkpoint::resolve(path).map_err(|e| usage(format!("--resume: {e}")))?;
        let state = checkpoint::read_state(&dir).map_err(|e| usage(format!("--resume: {e}")))?;
        let config = RunConfig::read_file(&dir.join("config.toml"))?;
        let run = dir
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .ok_or_else(|| {
                usage(format!(
                    "--resume {}: not inside a run directory",
                    dir.display()
                ))
            })?;
        Ok(Self {
            dir,
            run,
            state,
            config,
        })
    }

    /// Refuses settings `s` (the run's, with the flags given) that would
    /// change the model, the data the run trains on or its goldfish mask,
    /// naming the flag. The step count, cadences, the DP and TP sizes and
    /// the ZeRO stage may change (checkpoints hold whole tensors); the
    /// global batch (`dp x micro-batch x grad-accum`) may not.
    pub fn check(&self, s: &TrainSettings, world_size: usize) -> anyhow::Result<()> {
        let was = &self.config.train;
        macro_rules! same {
            ($($field:ident => $flag:literal),* $(,)?) => {$(
                if s.$field != was.$field {
                    return Err(usage(format!(
                        "--resume: {} {:?} differs from the run's {:?}; a resumed run keeps its model and data",
                        $flag, s.$field, was.$field
                    )));
                }
            )*};
        }
        same!(
            model => "--model",
            vocab_size => "--vocab-size",
            max_seq_len => "--max-seq-len",
            seq_len => "--seq-len",
            seed => "--seed",
            corpus => "--corpus",
            data => "--data",
            val_fraction => "--val-fraction",
            hf_dir => "--hf-dir",
            kernels => "--kernels",
            goldfish_k => "--goldfish-k",
            goldfish_context => "--goldfish-context",
        );
        let rows = |t: &TrainSettings, dp: usize| dp * t.micro_batch * t.grad_accum;
        let dp_now = s.dp.unwrap_or(world_size / (s.tp * s.pp));
        let (now, then) = (rows(s, dp_now), self.state_rows());
        if now != then {
            return Err(usage(format!(
                "--resume: the global batch would be {now} sequences (dp {dp_now} x --micro-batch {} x --grad-accum {}), the run's is {then}; keep it",
                s.micro_batch, s.grad_accum
            )));
        }
        if s.steps < self.state.step {
            return Err(usage(format!(
                "--resume: --steps {} is before the checkpoint's step {}",
                s.steps, self.state.step
            )));
        }
        Ok(())
    }

    /// Sequences per step of the run that wrote the checkpoint.
    fn state_rows(&self) -> usize {
        let t = &self.config.train;
        self.config
            .global_batch
            .unwrap_or(t.micro_batch * t.grad_accum)
    }

    /// The checkpoint's weights, by parameter name.
    pub fn model(&self) -> anyhow::Result<BTreeMap<String, TensorData>> {
        Ok(load_safetensors(&self.dir.join("model.safetensors"))?)
    }

    /// The checkpoint's AdamW moments (`m.NAME`, `v.NAME`).
    pub fn moments(&self) -> anyhow::Result<BTreeMap<String, TensorData>> {
        Ok(load_safetensors(&self.dir.join("optimizer.safetensors"))?)
    }
}
