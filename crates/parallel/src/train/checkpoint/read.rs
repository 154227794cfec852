//! Reading a sharded checkpoint in any layout: a rank asks for the region
//! of a tensor it holds and gets the values of the stored blocks that
//! overlap it. Files are memory-mapped, so only the pages of the blocks
//! read are touched; each block read is checked against its XXH3-64 once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use burn::tensor::TensorData;
use ferrotron_engine::checkpoint::CheckpointError;
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use xxhash_rust::xxh3::xxh3_64;

use super::index::{Block, Index};
use super::region::Region;

/// A sharded checkpoint opened for reading.
pub struct Reader {
    dir: PathBuf,
    index: Index,
    maps: HashMap<String, Mmap>,
    /// `(file, key)` of the blocks whose checksum matched.
    verified: HashSet<(String, String)>,
}

impl Reader {
    /// Opens the checkpoint directory `dir` (its `index.json`, checked).
    pub fn open(dir: &Path) -> Result<Self, CheckpointError> {
        Ok(Self {
            dir: dir.to_path_buf(),
            index: Index::read(dir)?,
            maps: HashMap::new(),
            verified: HashSet::new(),
        })
    }

    /// The index.
    pub fn index(&self) -> &Index {
        &self.index
    }

    fn error(&self, file: &str, message: String) -> CheckpointError {
        CheckpointError::Format {
            path: self.dir.join(file).display().to_string(),
            message,
        }
    }

    /// The bytes of `block` in its file (mapped, checked once).
    fn block_bytes(&mut self, tensor: &str, block: &Block) -> Result<&[u8], CheckpointError> {
        if !self.maps.contains_key(&block.file) {
            let path = self.dir.join(&block.file);
            let io = |source| CheckpointError::Io {
                path: path.display().to_string(),
                source,
            };
            let file = fs::File::open(&path).map_err(io)?;
            // SAFETY: the checkpoint's files are complete and not written
            // again (a new checkpoint goes into a new directory).
            let map = unsafe { Mmap::map(&file) }.map_err(io)?;
            self.maps.insert(block.file.clone(), map);
        }
        let map = &self.maps[&block.file];
        let path = || self.dir.join(&block.file).display().to_string();
        let (header, meta) =
            SafeTensors::read_metadata(map).map_err(|e| CheckpointError::Format {
                path: path(),
                message: e.to_string(),
            })?;
        let Some(info) = meta.info(&block.key) else {
            return Err(CheckpointError::Format {
                path: path(),
                message: format!("tensor '{tensor}': the file has no block '{}'", block.key),
            });
        };
        let (a, b) = info.data_offsets;
        let data = map.get(8 + header + a..8 + header + b).unwrap_or_default();
        if info.dtype != Dtype::F32 || data.len() != 4 * block.region.len() {
            return Err(CheckpointError::Format {
                path: path(),
                message: format!(
                    "tensor '{tensor}': the block '{}' holds {} bytes of {:?}, index.json says {} f32 values",
                    block.key,
                    data.len(),
                    info.dtype,
                    block.region.len()
                ),
            });
        }
        let key = (block.file.clone(), block.key.clone());
        if !self.verified.contains(&key) {
            let sum = format!("{:016x}", xxh3_64(data));
            if sum != block.xxh3_64 {
                return Err(CheckpointError::Format {
                    path: path(),
                    message: format!(
                        "tensor '{tensor}': the block '{}' has XXH3-64 {sum}, index.json records {}; the file is damaged",
                        block.key, block.xxh3_64
                    ),
                });
            }
            self.verified.insert(key);
        }
        Ok(data)
    }

    /// The values of `want` (a region of tensor `name`, whose global shape
    /// must be `global`); elements outside the tensor (padding) are 0.
    /// Errors name the tensor and the file: a tensor the checkpoint lacks
    /// or holds in another shape, a damaged block, values no block holds.
    pub fn read(
        &mut self,
        name: &str,
        global: &[usize],
        want: &Region,
    ) -> Result<Vec<f32>, CheckpointError> {
        let index_file = super::index::INDEX;
        let Some(entry) = self.index.tensors.get(name) else {
            return Err(self.error(
                index_file,
                format!(
                    "the checkpoint has no tensor '{name}' (a checkpoint of another architecture?)"
                ),
            ));
        };
        if entry.shape != global {
            return Err(self.error(index_file, format!(
                "tensor '{name}' has shape {:?} in the checkpoint, the model's is {global:?} (another architecture or vocabulary)",
                entry.shape
            )));
        }
        let blocks = entry.blocks.clone();
        let mut out = vec![0.0f32; want.len()];
        let mut copied = 0;
        for block in &blocks {
            if !overlaps(want, &block.region) {
                continue;
            }
            let bytes = self.block_bytes(name, block)?;
            copied += want.fill_from(&mut out, &block.region, |pos, dst: &mut [f32]| {
                let src = &bytes[4 * pos..4 * (pos + dst.len())];
                for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                    *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
                Ok::<(), CheckpointError>(())
            })?;
        }
        let needed = want.inside(global);
        if copied != needed {
            return Err(self.error(
                index_file,
                format!(
                "tensor '{name}': its blocks hold {copied} of the {needed} values this rank needs"
            ),
            ));
        }
        Ok(out)
    }

    /// Reads every block of every tensor and checks it against its
    /// XXH3-64, and that each tensor's blocks hold as many values as its
    /// shape (`checkpoint verify`). Returns the blocks and bytes checked.
    pub fn verify(&mut self) -> Result<(usize, u64), CheckpointError> {
        let tensors: Vec<(String, Vec<usize>, Vec<Block>)> = self
            .index
            .tensors
            .iter()
            .map(|(n, t)| (n.clone(), t.shape.clone(), t.blocks.clone()))
            .collect();
        let (mut blocks, mut bytes) = (0, 0);
        for (name, shape, stored) in tensors {
            let held: usize = stored.iter().map(|b| b.region.len()).sum();
            let numel: usize = shape.iter().product();
            if held != numel {
                return Err(self.error(
                    super::index::INDEX,
                    format!(
                    "tensor '{name}' of shape {shape:?} has {numel} values, its blocks hold {held}"
                ),
                ));
            }
            for block in &stored {
                bytes += self.block_bytes(&name, block)?.len() as u64;
                blocks += 1;
            }
        }
        Ok((blocks, bytes))
    }

    /// Every tensor whole, by name (the loader gathering: for tests,
    /// `checkpoint verify` and conversion; it holds the whole checkpoint).
    pub fn read_whole(&mut self) -> Result<BTreeMap<String, TensorData>, CheckpointError> {
        let names: Vec<(String, Vec<usize>)> = self
            .index
            .tensors
            .iter()
            .map(|(n, t)| (n.clone(), t.shape.clone()))
            .collect();
        let mut out = BTreeMap::new();
        for (name, shape) in names {
            let want = Region::whole(vec![0; shape.len()], shape.clone());
            let values = self.read(&name, &shape, &want)?;
            out.insert(name, TensorData::new(values, shape));
        }
        Ok(out)
    }
}

/// Whether the boxes of `a` and `b` intersect (a quick test before the
/// exact one of [`Region::fill_from`]).
fn overlaps(a: &Region, b: &Region) -> bool {
    (0..a.shape.len()).all(|d| {
        a.offsets[d] < b.offsets[d] + b.shape[d] && b.offsets[d] < a.offsets[d] + a.shape[d]
    })
}
