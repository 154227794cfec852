//! `--resume`: the checkpoint a job continues from, and which settings may
//! differ from the run's own.

use std::path::{Path, PathBuf};

use ferrotron_engine::data::{self, ShardSet};
use ferrotron_parallel::train::checkpoint::index::Index;
use ferrotron_parallel::train::checkpoint::{self, CheckpointState};

use crate::config::{Change, JobConfig, Key, KEYS};
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
    /// The keys `--override` names.
    overrides: Vec<String>,
    /// The changes made under `--override`, once validated.
    overridden: Vec<Change>,
}

/// How a key may differ when a run resumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnResume {
    /// Never: the checkpoint holds this model, trained on this data in
    /// this order (`[model]`, `[data]`, `schedule.seq_len`, `schedule.seed`).
    Kept,
    /// Freely: it changes how the same steps are computed (the layout,
    /// micro-batching at the same global batch, recomputation, transport)
    /// or what is recorded and where (`[parallelism]`, `[checkpoint]`,
    /// `[metrics]`, the validation cadence), not what is computed.
    Free,
    /// Only under `--override KEY`: it changes what the remaining steps
    /// compute (`[optimizer]`, `schedule.steps` (the learning-rate
    /// schedule's length), `[precision]`, `[backend]`).
    Override,
}

/// How `key` may differ when a run resumes.
pub fn on_resume(key: &Key) -> OnResume {
    match (key.section, key.name) {
        ("model" | "data", _) | ("schedule", "seq_len" | "seed") => OnResume::Kept,
        ("parallelism" | "checkpoint" | "metrics", _)
        | ("schedule", "micro_batch" | "grad_accum" | "eval_every" | "eval_batches") => {
            OnResume::Free
        }
        _ => OnResume::Override,
    }
}

impl Resume {
    /// The checkpoint `path` names: a run directory (its latest checkpoint)
    /// or a `RUN/checkpoints/step-N` directory. Errors name the file.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let dir = checkpoint::resolve(path).map_err(|e| usage(format!("--resume: {e}")))?;
        let state = checkpoint::read_state(&dir).map_err(|e| usage(format!("--resume: {e}")))?;
        // The index and the files it names, before anything is written.
        Index::read(&dir).map_err(|e| usage(format!("--resume: {e}")))?;
        let (config, record) = read_run_files(&dir)?;
        // Resolved first (`--resume step-4` in `RUN/checkpoints`, a link
        // to the run): the run directory is compared with `--out`.
        let run = std::fs::canonicalize(&dir)
            .ok()
            .as_deref()
            .and_then(Path::parent)
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
            overrides: Vec::new(),
            overridden: Vec::new(),
        })
    }

    /// Allows the keys `keys` (`section.key`, from `--override`) to change
    /// although they change what the remaining steps compute.
    pub fn overriding(mut self, keys: Vec<String>) -> Self {
        self.overrides = keys;
        self
    }

    /// The keys changed under `--override` (known once validated).
    pub fn overridden(&self) -> &[Change] {
        &self.overridden
    }

    /// Notes the settings of `c` (the run's, with the flags given) that may
    /// not change ([`on_resume`]), and `--override` keys that are unknown,
    /// kept or free; keeps the overridden changes. The steps may not end
    /// before the checkpoint's.
    pub(crate) fn check(&mut self, c: &JobConfig, p: &mut Problems) {
        let changes = c.changes(&self.config);
        self.overridden.clear();
        for change in changes.iter() {
            let (key, was, now) = (change.key, change.was_text(), change.now_text());
            match on_resume(key) {
                OnResume::Free => {}
                OnResume::Kept => p.key(key.section, key.name, format!(
                    "{now} differs from the run's {was}; a resumed run keeps its model and data"
                )),
                OnResume::Override if self.overrides.contains(&key.path()) => {
                    match self.state.loss_scaler {
                        Some(saved) if key.path() == "precision.loss_scale_init" => p.key(key.section, key.name, format!(
                            "{now} differs from the run's {was}, but the checkpoint's loss scale {} continues on resume; the initial scale only starts a run",
                            saved.scale
                        )),
                        _ => self.overridden.push(change.clone()),
                    }
                }
                OnResume::Override => p.key(key.section, key.name, format!(
                    "{now} differs from the run's {was}, which changes how the run continues; pass --override {} to change it",
                    key.path()
                )),
            }
        }
        self.check_overrides(p);
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

    /// The global batch (`dp x micro-batch x grad-accum` sequences, `dp`
    /// the mesh's data-parallel degree, as the run recorded it) may not
    /// change.
    pub(crate) fn check_global_batch(&self, c: &JobConfig, dp: usize, p: &mut Problems) {
        let now = dp * c.schedule.micro_batch * c.schedule.grad_accum;
        if now != self.record.global_batch {
            p.other("--resume", format!(
                "the global batch would be {now} sequences (dp {dp} x --micro-batch {} x --grad-accum {}), the run's is {}; keep it",
                c.schedule.micro_batch, c.schedule.grad_accum, self.record.global_batch
            ));
        }
    }

    /// Each `--override` key must name a key of the override class (it may
    /// stay unchanged: a requeued job repeats its command line).
    fn check_overrides(&self, p: &mut Problems) {
        for path in &self.overrides {
            let Some(key) = KEYS.iter().find(|k| k.path() == *path) else {
                p.other(
                    format!("--override {path}"),
                    "no such key; keys are section.key, e.g. optimizer.lr (see --print-config)",
                );
                continue;
            };
            let problem = match on_resume(key) {
                OnResume::Kept => "a resumed run keeps its model and data; start a new run instead",
                OnResume::Free => "it may change without --override",
                // Unchanged is fine: a requeued job repeats its command
                // line after its first resume took the change.
                OnResume::Override => continue,
            };
            p.other(format!("--override {path}"), problem);
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
}
