//! A checkpoint written in the background (`--async-checkpoint`): at the
//! step boundary each rank copies its blocks to the host and rank 0
//! creates the temporary directory (a collective); a thread then writes
//! and syncs the rank's file while training goes on. Publishing (the
//! index, `state.json`, the rename, `latest`) is a collective, so it runs
//! on the training thread at a later step boundary, once every rank's
//! thread is done ([`Background::finish`]). Until then `latest` names the
//! previous checkpoint, so a crash during the background write leaves it
//! loadable; a failed write is reported by `finish` like a synchronous
//! one. The files are those a synchronous save writes, byte for byte.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use ferrotron_engine::checkpoint::CheckpointError;
use ferrotron_engine::data::SamplerState;

use super::shard::{self, Entry, Shard};
use super::{injected_failure, Started, Written, FAIL_WRITE_ENV};
use crate::comm::Communicator;

/// What the writing thread returns: the blocks' index entries and whether
/// the file was written.
type FileResult = (Vec<Entry>, Result<(), CheckpointError>);

/// A checkpoint whose rank file is being written by a thread.
pub struct Background {
    started: Started,
    shard: Shard,
    sampler: Option<SamplerState>,
    extra: Vec<(String, Vec<u8>)>,
    keep: usize,
    writer: JoinHandle<FileResult>,
}

impl Background {
    /// Begins the checkpoint of `shard` in `root` with `values`, the host
    /// copies of its blocks (in `shard.blocks`' order), written by a
    /// thread; `sampler`, `extra` and `keep` as [`super::write`] takes
    /// them. A collective over `world` (rank 0 creates the temporary
    /// directory). `None` on the other ranks if rank 0 could not.
    pub fn start(
        root: &Path,
        world: &dyn Communicator,
        shard: Shard,
        values: Vec<Vec<f32>>,
        sampler: Option<SamplerState>,
        extra: &[(String, Vec<u8>)],
        keep: usize,
    ) -> Result<Option<Self>, CheckpointError> {
        let fail = injected_failure()
            .then(|| format!("no space left on device (injected by {FAIL_WRITE_ENV})"));
        let Some(started) = Started::begin(root, world, shard.steps_done)? else {
            return Ok(None);
        };
        let (path, file, blocks) = (
            started.path.clone(),
            started.file.clone(),
            shard.blocks.clone(),
        );
        let writer = std::thread::spawn(move || {
            if blocks.is_empty() {
                return (Vec::new(), Ok(()));
            }
            let mut values = values;
            let mut take = |i: usize| std::mem::take(&mut values[i]);
            shard::write_file(&path, &file, &blocks, &mut take, fail)
        });
        Ok(Some(Self {
            started,
            shard,
            sampler,
            extra: extra.to_vec(),
            keep,
            writer,
        }))
    }

    /// Whether this rank's file is written (or its write failed).
    pub fn written(&self) -> bool {
        self.writer.is_finished()
    }

    /// Waits for this rank's file, then publishes the checkpoint: a
    /// collective over `world`, as the end of [`super::write`]. Rank 0
    /// gets the checkpoint's directory.
    pub fn finish(self, world: &dyn Communicator) -> Result<Option<PathBuf>, CheckpointError> {
        let file = self
            .writer
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        let w = Written {
            shard: &self.shard,
            sampler: self.sampler,
            extra: &self.extra,
        };
        self.started.publish(world, &w, file, self.keep)
    }
}
