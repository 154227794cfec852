//! The files that describe a run directory: `config.toml`, the resolved
//! [`JobConfig`] (the document `--print-config` prints; `--config` reads
//! it back), and `run.toml`, what the run resolved (the architecture, the
//! global batch, the shard set or the corpus's hash). Checkpoints carry
//! both.

use std::path::Path;

use ferrotron_engine::data::ShardSetId;
use ferrotron_models::hf::SpecialTokens;
use ferrotron_models::DecoderConfig;
use serde::{Deserialize, Serialize};

use crate::config::JobConfig;
use crate::error::usage;

/// The job configuration's file in a run or checkpoint directory.
pub const CONFIG_FILE: &str = "config.toml";
/// The run record's file in a run or checkpoint directory.
pub const RECORD_FILE: &str = "run.toml";

/// What a run resolved that its configuration does not say: enough to
/// rebuild its model and to check that a resumed run continues it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRecord {
    /// Sequences per optimizer step, `dp x micro-batch x grad-accum` (what
    /// a resumed run must keep).
    pub global_batch: usize,
    /// The token shard set a run on `data.shards` trains on (the hashes of
    /// its tokenizer and index); a resumed run refuses another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<ShardSetId>,
    /// SHA-256 of the text of a run on `data.corpus` (after gzip
    /// decompression); a resumed run refuses a corpus whose text differs.
    /// Absent in records written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corpus_sha256: Option<String>,
    /// The begin- and end-of-sequence ids of the Hugging Face model the
    /// run started from (`model.hf_dir`), which its exports and samples
    /// keep; absent: the run's tokenizer's `<|endoftext|>` serves as both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub special: Option<SpecialTokens>,
    /// The model architecture.
    pub model: DecoderConfig,
}

impl RunRecord {
    /// As TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a run record serializes as TOML")
    }
}

/// Reads `dir/config.toml` and `dir/run.toml` (a run or a checkpoint
/// directory); errors name the file.
pub fn read_run_files(dir: &Path) -> anyhow::Result<(JobConfig, RunRecord)> {
    let config_path = dir.join(CONFIG_FILE);
    let config = JobConfig::from_file(&config_path).map_err(|e| {
        let lines: Vec<String> = e.iter().map(ToString::to_string).collect();
        usage(lines.join("; "))
    })?;
    let path = dir.join(RECORD_FILE);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| usage(format!("cannot read {}: {e}", path.display())))?;
    let record = toml::from_str(&text)
        .map_err(|e| usage(format!("{}: {}", path.display(), e.message().trim())))?;
    Ok((config, record))
}
