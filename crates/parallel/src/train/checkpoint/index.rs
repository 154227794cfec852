//! `index.json` of a sharded checkpoint: the layout it was written from and,
//! for every tensor, its global shape and the blocks that hold it (see
//! docs/checkpoints.md for the schema).

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use ferrotron_engine::checkpoint::CheckpointError;
use serde::{Deserialize, Serialize};

use super::region::Region;

/// Name of the index file in a checkpoint directory.
pub const INDEX: &str = "index.json";

/// The value of [`Index::format`].
pub const FORMAT: &str = "ferrotron-sharded";

/// The index version this code writes and reads.
pub const VERSION: u32 = 1;

/// How the run that wrote a checkpoint was laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layout {
    /// Ranks in all.
    pub world: usize,
    /// Tensor-parallel degree.
    pub tp: usize,
    /// Pipeline stages.
    pub pp: usize,
    /// Model chunks per stage (interleaved pipelines).
    pub pp_virtual: usize,
    /// Data-parallel degree.
    pub dp: usize,
    /// ZeRO stage (0-3).
    pub zero: u8,
}

/// One stored block of a tensor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Block {
    /// The safetensors file holding it, in the checkpoint directory.
    pub file: String,
    /// The tensor's name inside that file: a 1-D f32 tensor of the
    /// region's `end - start` values.
    pub key: String,
    /// Where its values lie in the tensor.
    #[serde(flatten)]
    pub region: Region,
    /// XXH3-64 (seed 0) of the block's bytes in the file, 16 hex digits.
    pub xxh3_64: String,
}

/// One tensor of the checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorEntry {
    /// Its global shape (without vocabulary padding).
    pub shape: Vec<usize>,
    /// Element type of every block (`F32`).
    pub dtype: String,
    /// The blocks; together they hold every element once.
    pub blocks: Vec<Block>,
}

/// The index of a sharded checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Index {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`VERSION`].
    pub version: u32,
    /// Optimizer steps taken when it was written.
    pub step: usize,
    /// The layout of the run that wrote it.
    pub layout: Layout,
    /// Every tensor by name: the parameters (`NAME`) and AdamW's moments
    /// (`m.NAME`, `v.NAME`, in the parameter's shape).
    pub tensors: BTreeMap<String, TensorEntry>,
}

impl Index {
    /// Reads and checks `dir/index.json`: the format, the version, and
    /// that every file it names exists. A checkpoint of the whole-file
    /// format (before sharded checkpoints) is refused by name.
    pub fn read(dir: &Path) -> Result<Self, CheckpointError> {
        let path = dir.join(INDEX);
        let bad = |message: String| CheckpointError::Format {
            path: path.display().to_string(),
            message,
        };
        if !path.is_file() {
            let old = dir.join("model.safetensors");
            if old.is_file() {
                return Err(CheckpointError::Format {
                    path: old.display().to_string(),
                    message: format!("a whole-file checkpoint (model.safetensors + optimizer.safetensors, written before sharded checkpoints) is not read by this version; it reads sharded checkpoints with {INDEX}"),
                });
            }
            return Err(bad(format!("missing: a checkpoint has an {INDEX}")));
        }
        let text = fs::read_to_string(&path).map_err(|source| CheckpointError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let index: Index = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if index.format != FORMAT || index.version != VERSION {
            return Err(bad(format!(
                "format '{}' version {}; this version reads '{FORMAT}' version {VERSION}",
                index.format, index.version
            )));
        }
        for (name, t) in &index.tensors {
            for b in &t.blocks {
                if !dir.join(&b.file).is_file() {
                    return Err(bad(format!(
                        "tensor '{name}' names the file {}, which does not exist",
                        dir.join(&b.file).display()
                    )));
                }
            }
        }
        Ok(index)
    }

    /// Bytes of the blocks of every tensor (f32 values).
    pub fn block_bytes(&self) -> u64 {
        self.tensors
            .values()
            .flat_map(|t| &t.blocks)
            .map(|b| 4 * b.region.len() as u64)
            .sum()
    }
}
