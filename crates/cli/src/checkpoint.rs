//! `ferrotron checkpoint inspect PATH` prints a sharded checkpoint's index;
//! `ferrotron checkpoint verify PATH` reads every block and checks its
//! XXH3-64. A missing or damaged checkpoint is a usage error (exit 2)
//! naming the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ferrotron_parallel::train::checkpoint::index::Index;
use ferrotron_parallel::train::checkpoint::read::Reader;
use ferrotron_parallel::train::checkpoint::{read_state, resolve};

use crate::args::{CheckpointArgs, CheckpointCommand};
use crate::error::usage;

/// Runs a `ferrotron checkpoint` subcommand.
pub fn checkpoint(args: CheckpointArgs) -> anyhow::Result<()> {
    match args.command {
        CheckpointCommand::Inspect(a) => inspect(&a.path),
        CheckpointCommand::Verify(a) => verify(&a.path),
    }
}

/// The checkpoint directory `path` names.
fn directory(what: &str, path: &Path) -> anyhow::Result<PathBuf> {
    resolve(path).map_err(|e| usage(format!("checkpoint {what}: {e}")))
}

/// Prints the index of the checkpoint `path` names.
fn inspect(path: &Path) -> anyhow::Result<()> {
    let dir = directory("inspect", path)?;
    let bad = |e: ferrotron_engine::checkpoint::CheckpointError| {
        usage(format!("checkpoint inspect: {e}"))
    };
    let index = Index::read(&dir).map_err(bad)?;
    let state = read_state(&dir).map_err(bad)?;
    println!(
        "{}: step {}, AdamW updates {}",
        dir.display(),
        index.step,
        state.optimizer_steps
    );
    println!("written by {}", index.layout);
    let width = index.tensors.keys().map(String::len).max().unwrap_or(0);
    for (name, t) in &index.tensors {
        let bytes: usize = t.blocks.iter().map(|b| 4 * b.region.len()).sum();
        println!(
            "{name:width$}  {:<16} {}  {} block(s)  {bytes} bytes",
            format!("{:?}", t.shape),
            t.dtype,
            t.blocks.len()
        );
    }
    let mut files: BTreeMap<&str, u64> = BTreeMap::new();
    for b in index.tensors.values().flat_map(|t| &t.blocks) {
        *files.entry(b.file.as_str()).or_default() += 4 * b.region.len() as u64;
    }
    for (file, bytes) in &files {
        println!("{file}: {bytes} bytes of blocks");
    }
    println!(
        "{} tensor(s), {} file(s), {} bytes of blocks in all",
        index.tensors.len(),
        files.len(),
        index.block_bytes()
    );
    Ok(())
}

/// Reads every block of the checkpoint `path` names and checks it.
fn verify(path: &Path) -> anyhow::Result<()> {
    let dir = directory("verify", path)?;
    let bad = |e| usage(format!("checkpoint verify: {e}"));
    let t0 = Instant::now();
    let mut reader = Reader::open(&dir).map_err(bad)?;
    let (blocks, bytes) = reader.verify().map_err(bad)?;
    println!(
        "{}: {blocks} block(s) of {} tensor(s), {bytes} bytes checked in {:.1} s: every checksum matches index.json",
        dir.display(),
        reader.index().tensors.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
