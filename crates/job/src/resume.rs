//! `--resume`: the checkpoint a job continues from, and which settings may
//! differ from the run's own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::tensor::TensorData;
use ferrotron_engine::checkpoint::load_safetensors;
use ferrotron_engine::data::{self, ShardSet};
use ferrotron_parallel::train::checkpoint::{self, CheckpointState};

use crate::config::JobConfig;
use crate::error::usage;
use crate::run_files::{read_run_files, RunRecord, RECORD_FILE};
use crate::validate::Problems;

/// A checkpoint to continue from.
pub struct Resume {
    /// The `step-N` directory.
    pub dir: PathBuf,
    /// The run directory it belongs to.
    pub run: PathBuf,
    /// Its `state.json`.
    pub state: CheckpointState,
    /// The run's job configuration when the checkpoint was written.
    pub config: JobConfig,
    /// What the run resolved (architecture, global batch, shard set).
    pub record: RunRecord,
}

impl Resume {
    /// The checkpoint `path` names: a run directory (its latest checkpoint)
    /// or a `RUN/checkpoints/step-N` directory. Errors name the file.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let dir = checkpoint::resolve(path).map_err(|e| usage(format!("--resume: {e}")))?;
        let state = checkpoint::read_state(&dir).map_err(|e| usage(format!("--resume: {e}")))?;
        let (config, record) = read_run_files(&dir)?;
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
            record,
        })
    }

    /// Notes settings of `c` (the run's, with the flags given) that would
    /// change the model, the data the run trains on or its goldfish mask.
    /// The step count, cadences, the DP and TP sizes and the ZeRO stage may
    /// change (checkpoints hold whole tensors); the global batch
    /// (`dp x micro-batch x grad-accum`) may not.
    pub(crate) fn check(&self, c: &JobConfig, world_size: usize, p: &mut Problems) {
        let was = &self.config;
        macro_rules! same {
            ($($section:ident . $field:ident),* $(,)?) => {$(
                if c.$section.$field != was.$section.$field {
                    p.key(stringify!($section), stringify!($field), format!(
                        "{:?} differs from the run's {:?}; a resumed run keeps its model and data",
                        c.$section.$field, was.$section.$field
                    ));
                }
            )*};
        }
        same!(
            model.name,
            model.vocab_size,
            model.max_seq_len,
            model.hf_dir,
            schedule.seq_len,
            schedule.seed,
            data.corpus,
            data.shards,
            data.val_fraction,
            data.goldfish_k,
            data.goldfish_context,
            backend.kernels,
        );
        let par = &c.parallelism;
        let dp_now = par.dp.unwrap_or(world_size / (par.tp * par.pp).max(1));
        let now = dp_now * c.schedule.micro_batch * c.schedule.grad_accum;
        if now != self.record.global_batch {
            p.other("--resume", format!(
                "the global batch would be {now} sequences (dp {dp_now} x --micro-batch {} x --grad-accum {}), the run's is {}; keep it",
                c.schedule.micro_batch, c.schedule.grad_accum, self.record.global_batch
            ));
        }
        if c.schedule.steps < self.state.step {
            p.key(
                "schedule",
                "steps",
                format!(
                    "{} is before the checkpoint's step {}",
                    c.schedule.steps, self.state.step
                ),
            );
        }
    }

    /// Checks that `set` (opened from `dir`) is the shard set the run
    /// trained on: the same tokenizer and index hashes.
    pub(crate) fn check_shards(&self, set: &ShardSet, dir: &Path) -> Result<(), String> {
        let Some(was) = &self.record.shards else {
            return Err(format!(
                "--resume: {} records no shard set; the run did not train on one",
                self.dir.join(RECORD_FILE).display()
            ));
        };
        let now = set.id();
        for (file, then, got) in [
            (
                data::TOKENIZER_FILE,
                &was.tokenizer_sha256,
                &now.tokenizer_sha256,
            ),
            (data::INDEX_FILE, &was.index_sha256, &now.index_sha256),
        ] {
            if then != got {
                return Err(format!(
                    "--resume: {} has SHA-256 {got}, but the run trained on a shard set whose {file} had {then}; a resumed run keeps its data",
                    dir.join(file).display()
                ));
            }
        }
        Ok(())
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
