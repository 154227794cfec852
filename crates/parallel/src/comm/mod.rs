//! Communicators: the collective and point-to-point operations that span ranks.
//!
//! The contract is [`Communicator`]: `f32` host buffers (`&[f32]` /
//! `&mut [f32]`), `Send + Sync` so that layers can hold a group handle, and
//! [`Communicator::split`] to make process groups ([`crate::groups`]).
//! Collectives on Burn tensors ([`tensor`]: `all_reduce_sum_tensor`, ...)
//! sit on top, on `dyn Communicator`; they move the values through the host
//! path, which costs a device-to-host copy on a GPU and nothing more on a
//! CPU backend. Two implementations exist: [`SingleProcess`] (world size 1,
//! every collective the identity) and, with the `mpi` cargo feature,
//! [`MpiCommunicator`] (Open MPI through the `mpi` crate), whose every
//! operation fails with [`CommError::Timeout`], naming the missing ranks,
//! when it does not complete within a timeout ([`DEFAULT_TIMEOUT`] unless
//! set). [`nccl::NcclCommunicator`] runs the same contract on NCCL / RCCL
//! (loaded at run time), bootstrapped over one of these: on host memory
//! with a library that works there (the repository's test double), or
//! staged through a GPU's memory; [`nccl::device`] runs collectives on
//! device buffers (docs/parallelism.md, "NCCL and RCCL").
//!
//! Every communicator also has a non-blocking form ([`nonblocking`]): a
//! [`CommThread`] runs its all-reduces, all-gathers and reduce-scatters in
//! order on a thread of their own, `start_*` returning a [`Pending`]
//! handle whose `wait` gives the result, with the same timeouts and
//! errors. [`Latency`] is a test double that slows a communicator down.

mod latency;
#[cfg(feature = "mpi")]
mod mpi;
pub mod nccl;
pub mod nonblocking;
mod single;
pub mod tensor;

#[cfg(feature = "mpi")]
pub use self::mpi::MpiCommunicator;
pub use latency::Latency;
pub use nonblocking::{CommThread, Pending, Started};
pub use single::SingleProcess;

use std::sync::Arc;
use std::time::Duration;

/// Default timeout of a communicator operation: 600 s, the 10 minutes of
/// `torch.distributed`'s default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// What can go wrong in a communicator call.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// Buffer lengths do not fit the operation.
    #[error("{op}: {detail}")]
    BadLength {
        /// The operation (`all_gather`, ...).
        op: &'static str,
        /// What was expected and found.
        detail: String,
    },
    /// A rank outside `0..world_size`.
    #[error("{op}: rank {rank} is outside 0..{world_size}")]
    BadRank {
        /// The operation.
        op: &'static str,
        /// The rank given.
        rank: usize,
        /// The world size.
        world_size: usize,
    },
    /// An operation did not complete within the timeout; `detail` names the
    /// ranks that never arrived, e.g. `all_reduce #17 did not complete within
    /// 2s: rank 2 never arrived (ranks 0, 1 did)`.
    #[error("{op} #{seq} did not complete within {timeout:?}: {detail}")]
    Timeout {
        /// The operation (`all_reduce`, `barrier`, `send`, ...).
        op: &'static str,
        /// Its number among this rank's operations of that kind (from 1).
        seq: u64,
        /// The communicator's timeout.
        timeout: Duration,
        /// The ranks never heard from, ascending.
        lost: Vec<usize>,
        /// Who arrived and who did not, in words.
        detail: String,
    },
    /// The transport could not start or failed.
    #[error("{0}")]
    Transport(String),
}

/// Collective and point-to-point operations over the ranks of one job.
///
/// Every rank of the communicator must make the same sequence of
/// collective calls with buffers of the same length (as in MPI); a mismatch
/// is undefined at the transport level. Buffer lengths are counted in `f32`
/// elements. A communicator may be a group of a larger job
/// ([`Communicator::split`]): `rank` and `world_size` are then those of the
/// group.
pub trait Communicator: Send + Sync {
    /// This process's rank, `0..world_size()`.
    fn rank(&self) -> usize;
    /// Number of ranks in the communicator.
    fn world_size(&self) -> usize;
    /// A new communicator over the ranks that pass the same `color`,
    /// numbered by ascending `key` (`MPI_Comm_split`). Collective: every
    /// rank calls it, with its own color and key.
    fn split(&self, color: usize, key: usize) -> Result<Arc<dyn Communicator>, CommError>;
    /// Sums `buf` element-wise over all ranks, in place; every rank gets the sum.
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CommError>;
    /// Averages `buf` element-wise over all ranks, in place (sum, then `/ world_size`).
    fn all_reduce_avg(&self, buf: &mut [f32]) -> Result<(), CommError> {
        self.all_reduce_sum(buf)?;
        let w = self.world_size() as f32;
        if w > 1.0 {
            buf.iter_mut().for_each(|x| *x /= w);
        }
        Ok(())
    }
    /// Concatenates every rank's `send` (length `n`) in rank order into
    /// `recv` (length `n * world_size`).
    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError>;
    /// Sums `send` (length `n * world_size`) over ranks and leaves block
    /// `rank` of the sum (length `n`) in `recv`.
    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError>;
    /// Copies `buf` of rank `root` into `buf` of every rank.
    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), CommError>;
    /// Sends `buf` to rank `dest` (blocking) with message `tag`.
    fn send(&self, buf: &[f32], dest: usize, tag: i32) -> Result<(), CommError>;
    /// Receives exactly `buf.len()` values from rank `src` with message `tag` (blocking).
    fn recv(&self, buf: &mut [f32], src: usize, tag: i32) -> Result<(), CommError>;
    /// Posts every send of `sends` and every receive of `recvs` at once and
    /// returns when all have completed (`MPI_Isend`/`MPI_Irecv` then wait,
    /// or one NCCL group): two ranks that send to each other in one
    /// exchange cannot deadlock, as they would with blocking
    /// [`Communicator::send`]s. Each receive takes exactly its length.
    fn exchange(&self, sends: &[Outgoing<'_>], recvs: &mut [Incoming<'_>])
        -> Result<(), CommError>;
    /// Returns once every rank has called `barrier`.
    fn barrier(&self) -> Result<(), CommError>;
    /// Ends the whole job with exit code `code` (every rank of every group).
    /// For a one-rank job this is `std::process::exit`.
    fn abort(&self, code: i32) -> !;
}

/// One message sent by [`Communicator::exchange`].
#[derive(Clone, Copy, Debug)]
pub struct Outgoing<'a> {
    /// The receiving rank.
    pub to: usize,
    /// The message tag (MPI matches on it; NCCL, which has no tags, matches
    /// the messages between two ranks in order: see [`nccl`]).
    pub tag: i32,
    /// The values sent.
    pub values: &'a [f32],
}

/// One message received by [`Communicator::exchange`].
#[derive(Debug)]
pub struct Incoming<'a> {
    /// The sending rank.
    pub from: usize,
    /// The message tag.
    pub tag: i32,
    /// Where the values go; the message must hold exactly this many.
    pub values: &'a mut [f32],
}

/// Checks `recv.len() == send.len() * world` (all-gather) and the reverse.
pub(crate) fn check_blocks(
    op: &'static str,
    small: usize,
    large: usize,
    world: usize,
) -> Result<(), CommError> {
    if small * world != large {
        return Err(CommError::BadLength {
            op,
            detail: format!(
                "the large buffer must hold world_size ({world}) x {small} = {} values, got {large}",
                small * world
            ),
        });
    }
    Ok(())
}

/// Checks that `rank < world`.
pub(crate) fn check_rank(op: &'static str, rank: usize, world: usize) -> Result<(), CommError> {
    if rank >= world {
        return Err(CommError::BadRank {
            op,
            rank,
            world_size: world,
        });
    }
    Ok(())
}
