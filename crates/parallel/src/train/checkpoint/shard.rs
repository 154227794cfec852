//! What one rank writes into a sharded checkpoint: its blocks, streamed
//! into one safetensors file ([`super::stream`]), and their entries for
//! the index, which rank 0 gathers over the communicator.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use ferrotron_engine::checkpoint::CheckpointError;
use serde::{Deserialize, Serialize};

use super::index::{Block, Index, Layout, TensorEntry, FORMAT, VERSION};
use super::region::Region;
use super::stream::StreamWriter;
use crate::comm::{CommError, Communicator};
use crate::train::loss_scale::LossScaler;

/// One block a rank writes: the part of a tensor it alone stores. Its
/// values are produced only while the block is written (see [`write_file`]).
#[derive(Clone, Debug, PartialEq)]
pub struct HeldBlock {
    /// The tensor: a parameter `NAME`, or AdamW's `m.NAME` / `v.NAME`.
    pub name: String,
    /// Its global shape (without vocabulary padding).
    pub global: Vec<usize>,
    /// Where the values lie (inside `global`).
    pub region: Region,
}

/// What a rank writes into a checkpoint, and the counters rank 0 records.
#[derive(Clone, Debug, PartialEq)]
pub struct Shard {
    /// This rank's blocks (none when another rank stores all it holds).
    pub blocks: Vec<HeldBlock>,
    /// The run's layout.
    pub layout: Layout,
    /// Optimizer steps taken (skipped ones included).
    pub steps_done: usize,
    /// Updates AdamW has applied.
    pub optimizer_steps: u64,
    /// The dynamic loss scaler, when the run scales its loss (fp16).
    pub loss_scaler: Option<LossScaler>,
}

/// A block's index entry, as a rank sends it to rank 0.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct Entry {
    pub name: String,
    pub global: Vec<usize>,
    pub block: Block,
}

/// The name of world rank `rank`'s file.
pub fn rank_file(rank: usize) -> String {
    format!("rank-{rank:05}.safetensors")
}

/// The `(name, shape)` of `blocks` in their file: each one-dimensional.
pub(super) fn file_tensors(blocks: &[HeldBlock]) -> Vec<(String, Vec<usize>)> {
    blocks
        .iter()
        .map(|b| (b.name.clone(), vec![b.region.len()]))
        .collect()
}

/// Writes `blocks` as the safetensors file `file` at `path`, asking
/// `values` for each block's values (by its index in `blocks`, one block
/// at a time, in the file's name order) and hashing them as they are
/// written. Returns the blocks' index entries (complete even when the
/// write failed) and whether the write succeeded; `fail` makes it fail as
/// a full disk does, naming the reason.
pub(super) fn write_file(
    path: &Path,
    file: &str,
    blocks: &[HeldBlock],
    values: &mut dyn FnMut(usize) -> Vec<f32>,
    fail: Option<String>,
) -> (Vec<Entry>, Result<(), CheckpointError>) {
    let mut writer = StreamWriter::create(path, file_tensors(blocks), fail);
    let by_name: HashMap<&str, usize> = blocks
        .iter()
        .enumerate()
        .map(|(i, b)| (b.name.as_str(), i))
        .collect();
    let mut entries = Vec::with_capacity(blocks.len());
    while let Some(name) = writer.next_name() {
        let i = by_name[name];
        let b = &blocks[i];
        let hash = writer.append(&values(i));
        entries.push(Entry {
            name: b.name.clone(),
            global: b.global.clone(),
            block: Block {
                file: file.to_string(),
                key: b.name.clone(),
                region: b.region.clone(),
                xxh3_64: format!("{hash:016x}"),
            },
        });
    }
    (entries, writer.finish())
}

/// The index of every rank's `entries` (in rank order).
pub(super) fn index(shard: &Shard, entries: Vec<Vec<Entry>>) -> Index {
    let mut tensors: BTreeMap<String, TensorEntry> = BTreeMap::new();
    for e in entries.into_iter().flatten() {
        tensors
            .entry(e.name)
            .or_insert_with(|| TensorEntry {
                shape: e.global,
                dtype: "F32".into(),
                blocks: Vec::new(),
            })
            .blocks
            .push(e.block);
    }
    Index {
        format: FORMAT.into(),
        version: VERSION,
        step: shard.steps_done,
        layout: shard.layout,
        tensors,
    }
}

/// Every rank's `bytes` (a collective over `world`), in rank order. The
/// communicator moves f32 values: each byte travels as one.
pub(super) fn gather_bytes(
    world: &dyn Communicator,
    bytes: &[u8],
) -> Result<Vec<Vec<u8>>, CommError> {
    let lens = gather_u64(world, bytes.len() as u64)?;
    let max = lens.iter().copied().max().unwrap_or(0) as usize;
    let mut send: Vec<f32> = bytes.iter().map(|&b| f32::from(b)).collect();
    send.resize(max, 0.0);
    let mut all = vec![0.0; max * world.world_size()];
    world.all_gather(&send, &mut all)?;
    Ok(lens
        .iter()
        .enumerate()
        .map(|(r, &n)| {
            all[r * max..r * max + n as usize]
                .iter()
                .map(|&v| v as u8)
                .collect()
        })
        .collect())
}

/// Every rank's `value` (a collective over `world`), exact: sent as four
/// 16-bit limbs, each exact in f32.
pub(super) fn gather_u64(world: &dyn Communicator, value: u64) -> Result<Vec<u64>, CommError> {
    let send: Vec<f32> = (0..4)
        .map(|i| ((value >> (16 * i)) & 0xffff) as f32)
        .collect();
    let mut all = vec![0.0; 4 * world.world_size()];
    world.all_gather(&send, &mut all)?;
    Ok(all
        .chunks_exact(4)
        .map(|l| {
            l.iter()
                .enumerate()
                .map(|(i, &v)| (v as u64) << (16 * i))
                .sum()
        })
        .collect())
}

/// How many ranks of `world` report a failure (`ok` false); a collective
/// that every rank reaches after its part, so it is also a barrier.
pub(super) fn failures(world: &dyn Communicator, ok: bool) -> Result<usize, CommError> {
    let mut n = [f32::from(u8::from(!ok))];
    world.all_reduce_sum(&mut n)?;
    Ok(n[0] as usize)
}
