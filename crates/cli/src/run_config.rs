//! `config.toml` of a run directory: the settings and the resolved model.

use std::path::Path;

use ferrotron_engine::data::ShardSetId;
use ferrotron_models::DecoderConfig;
use serde::{Deserialize, Serialize};

use crate::error::usage;
use crate::settings::TrainSettings;

/// Everything needed to rebuild a run's model and repeat the run.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// The training settings as resolved from defaults, file and flags.
    pub train: TrainSettings,
    /// The model architecture.
    pub model: DecoderConfig,
    /// Sequences per optimizer step, `dp x micro-batch x grad-accum` (what a
    /// resumed run must keep); absent in runs written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_batch: Option<usize>,
    /// The token shard set a `--data` run trains on (the hashes of its
    /// tokenizer and index); a resumed run refuses another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<ShardSetId>,
}

impl RunConfig {
    /// Reads a `config.toml` at `path` (a checkpoint's).
    pub fn read_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| usage(format!("cannot read {}: {e}", path.display())))?;
        toml::from_str(&text)
            .map_err(|e| usage(format!("{}: {}", path.display(), e.message().trim())))
    }

    /// Reads `<run>/config.toml`.
    pub fn read(run: &Path) -> anyhow::Result<Self> {
        let path = run.join("config.toml");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            usage(format!(
                "--run {}: cannot read {}: {e}",
                run.display(),
                path.display()
            ))
        })?;
        toml::from_str(&text)
            .map_err(|e| usage(format!("{}: {}", path.display(), e.message().trim())))
    }
}
