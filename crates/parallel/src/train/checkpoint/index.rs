//! `index.json` of a sharded checkpoint: the layout it was written from and,
//! for every tensor, its global shape and the blocks that hold it (see
//! docs/checkpoints.md for the schema).

use std::collections::BTreeMap;
use std::fmt;
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
    /// Context-parallel degree (1 in indexes written before it was
    /// recorded, which no CP run wrote).
    #[serde(default = "one")]
    pub cp: usize,
    /// Pipeline stages.
    pub pp: usize,
    /// Model chunks per stage (interleaved pipelines).
    pub pp_virtual: usize,
    /// Data-parallel degree.
    pub dp: usize,
    /// ZeRO stage (0-3).
    pub zero: u8,
}

fn one() -> usize {
    1
}

impl fmt::Display for Layout {
    /// `4 rank(s): tp 1 x cp 2 x pp 1 x dp 2, ZeRO 1`, with the CP degree
    /// and the virtual stages (`pp 2 (virtual 2)`) only above 1.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} rank(s): tp {}", self.world, self.tp)?;
        if self.cp > 1 {
            write!(f, " x cp {}", self.cp)?;
        }
        write!(f, " x pp {}", self.pp)?;
        if self.pp_virtual > 1 {
            write!(f, " (virtual {})", self.pp_virtual)?;
        }
        write!(f, " x dp {}, ZeRO {}", self.dp, self.zero)
    }
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
                if !b.region.lies_in(&t.shape) {
                    let r = &b.region;
                    return Err(bad(format!(
                        "tensor '{name}' of shape {:?} has a block (in {}) outside it: offsets {:?}, box {:?}, elements {}..{}",
                        t.shape, b.file, r.offsets, r.shape, r.start, r.end
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

#[cfg(test)]
mod tests {
    use super::Layout;

    /// An index written before CP was recorded reads as cp 1; the layout
    /// reads back as written, and prints the CP degree when it has one.
    #[test]
    fn the_layout_records_cp_and_reads_older_indexes() {
        let old = r#"{"world": 4, "tp": 1, "pp": 2, "pp_virtual": 2, "dp": 2, "zero": 1}"#;
        let layout: Layout = serde_json::from_str(old).unwrap();
        assert_eq!(layout.cp, 1);
        assert_eq!(
            layout.to_string(),
            "4 rank(s): tp 1 x pp 2 (virtual 2) x dp 2, ZeRO 1"
        );
        let ring = Layout {
            world: 4,
            cp: 2,
            pp: 1,
            pp_virtual: 1,
            ..layout
        };
        let json = serde_json::to_string(&ring).unwrap();
        assert_eq!(serde_json::from_str::<Layout>(&json).unwrap(), ring);
        assert_eq!(
            ring.to_string(),
            "4 rank(s): tp 1 x cp 2 x pp 1 x dp 2, ZeRO 1"
        );
    }
}
