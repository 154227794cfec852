//! `NcclComm`: one rank's NCCL / RCCL communicator, bootstrapped over a
//! host [`Communicator`], with collectives on raw device pointers.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use crate::comm::Communicator;

use super::error::NcclError;
use super::library::{NcclLibrary, RawComm};
use super::types::{NcclDataType, NcclReduceOp};
use super::unique_id::{UniqueId, UNIQUE_ID_WORDS};

/// One rank's communicator over all ranks of a host [`Communicator`]
/// (`ncclComm_t`). Destroyed (`ncclCommDestroy`) when dropped.
///
/// # Device pointers and streams
///
/// The collectives take raw device pointers and a raw stream, because the
/// CubeCL 0.10 runtimes do not expose theirs: `ComputeClient::get_resource`
/// yields a buffer's device address, but the `CUstream` / `hipStream_t` a
/// CubeCL server launches on is private to `cubecl-cuda` / `cubecl-hip`.
/// A caller holding CubeCL buffers must therefore finish their pending
/// work first (`client.sync()`) and synchronise the stream it passes here
/// before CubeCL touches them again.
///
/// Every operation is asynchronous with respect to the host: it is queued
/// on `stream` and returns; the results are in device memory once the
/// stream has reached that point (`cudaStreamSynchronize` /
/// `hipStreamSynchronize`). As with MPI, every rank must issue the same
/// collectives in the same order with the same counts and types.
pub struct NcclComm {
    lib: Arc<NcclLibrary>,
    raw: RawComm,
    rank: usize,
    world_size: usize,
}

// SAFETY: an `ncclComm_t` may be used from any thread, one call at a
// time; `NcclComm` is not `Sync`, so a shared one is used by one thread.
unsafe impl Send for NcclComm {}

impl NcclComm {
    /// Creates this rank's communicator over the ranks of `host`: rank 0
    /// creates a unique id, broadcasts its 128 bytes over `host` (as 32
    /// `f32` bit patterns), and every rank calls `ncclCommInitRank` with
    /// `host`'s rank and world size. Collective: every rank of `host` must
    /// call it.
    ///
    /// The calling thread's current GPU (`cudaSetDevice` / `hipSetDevice`,
    /// or the current CUDA context) must be the one this rank uses; NCCL
    /// binds the communicator to it. Blocks until every rank has joined.
    pub fn init<C: Communicator + ?Sized>(
        lib: Arc<NcclLibrary>,
        host: &C,
    ) -> Result<Self, NcclError> {
        let (rank, world_size) = (host.rank(), host.world_size());
        let nranks = to_c_int("ncclCommInitRank", "world size", world_size)?;
        let my_rank = to_c_int("ncclCommInitRank", "rank", rank)?;
        let mut words = [0f32; UNIQUE_ID_WORDS];
        if rank == 0 {
            words = lib.unique_id()?.to_f32_words();
        }
        host.broadcast(&mut words, 0)?;
        let id = UniqueId::from_f32_words(&words);

        let mut raw: RawComm = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; `id` is passed by value with
        // the C layout of `ncclUniqueId`; ranks and size were checked to fit.
        let code = unsafe { (lib.fns.comm_init_rank)(&mut raw, nranks, id, my_rank) };
        lib.check("ncclCommInitRank", code)?;
        Ok(Self {
            lib,
            raw,
            rank,
            world_size,
        })
    }

    /// This rank, `0..world_size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks in the communicator.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The library this communicator runs on.
    pub fn library(&self) -> &Arc<NcclLibrary> {
        &self.lib
    }

    /// Reduces `count` elements of `dtype` with `op` over all ranks; every
    /// rank gets the result in `recv` (`ncclAllReduce`). `send == recv` is
    /// allowed (in place).
    ///
    /// # Safety
    ///
    /// `send` and `recv` must be device pointers of this rank's GPU, valid
    /// for `count * dtype.size_bytes()` bytes, read (`send`) and written
    /// (`recv`) until `stream` has completed the operation, and not
    /// otherwise accessed meanwhile. `stream` must be a `cudaStream_t` (NCCL)
    /// or `hipStream_t` (RCCL) of that GPU, or null for its default stream.
    pub unsafe fn all_reduce(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: NcclDataType,
        op: NcclReduceOp,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        // SAFETY: the caller upholds the contract above; `self.raw` is live.
        let code =
            (self.lib.fns.all_reduce)(send, recv, count, dtype.raw(), op.raw(), self.raw, stream);
        self.lib.check("ncclAllReduce", code)
    }

    /// Concatenates every rank's `send` (`send_count` elements) in rank
    /// order into `recv` (`send_count * world_size()` elements) on every
    /// rank (`ncclAllGather`). In place when `send` is block `rank()` of
    /// `recv`.
    ///
    /// # Safety
    ///
    /// As [`NcclComm::all_reduce`], with `send` valid for `send_count`
    /// elements and `recv` for `send_count * world_size()` elements.
    pub unsafe fn all_gather(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        send_count: usize,
        dtype: NcclDataType,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        // SAFETY: the caller upholds the contract above; `self.raw` is live.
        let code = (self.lib.fns.all_gather)(send, recv, send_count, dtype.raw(), self.raw, stream);
        self.lib.check("ncclAllGather", code)
    }

    /// Reduces `send` (`recv_count * world_size()` elements) with `op` over
    /// ranks and leaves block `rank()` of the result (`recv_count`
    /// elements) in `recv` (`ncclReduceScatter`). In place when `recv` is
    /// block `rank()` of `send`.
    ///
    /// # Safety
    ///
    /// As [`NcclComm::all_reduce`], with `send` valid for
    /// `recv_count * world_size()` elements and `recv` for `recv_count`.
    pub unsafe fn reduce_scatter(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        recv_count: usize,
        dtype: NcclDataType,
        op: NcclReduceOp,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        // SAFETY: the caller upholds the contract above; `self.raw` is live.
        let code = (self.lib.fns.reduce_scatter)(
            send,
            recv,
            recv_count,
            dtype.raw(),
            op.raw(),
            self.raw,
            stream,
        );
        self.lib.check("ncclReduceScatter", code)
    }

    /// Copies `count` elements of `send` on rank `root` into `recv` on every
    /// rank (`ncclBroadcast`); `send` is read on `root` only. In place when
    /// `send == recv`.
    ///
    /// # Safety
    ///
    /// As [`NcclComm::all_reduce`], with both buffers valid for `count`
    /// elements (`send` only on `root`).
    pub unsafe fn broadcast(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: NcclDataType,
        root: usize,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        let root = self.peer("ncclBroadcast", root)?;
        // SAFETY: the caller upholds the contract above; `self.raw` is live.
        let code = (self.lib.fns.broadcast)(send, recv, count, dtype.raw(), root, self.raw, stream);
        self.lib.check("ncclBroadcast", code)
    }

    /// Sends `count` elements of `send` to rank `peer` (`ncclSend`). It
    /// completes only together with the matching [`NcclComm::recv`] on
    /// `peer`; two ranks that exchange in both directions must put both
    /// calls between [`NcclLibrary::group_start`] and
    /// [`NcclLibrary::group_end`].
    ///
    /// # Safety
    ///
    /// As [`NcclComm::all_reduce`], with `send` valid for `count` elements.
    pub unsafe fn send(
        &self,
        send: *const c_void,
        count: usize,
        dtype: NcclDataType,
        peer: usize,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        let peer = self.peer("ncclSend", peer)?;
        // SAFETY: the caller upholds the contract above; `self.raw` is live.
        let code = (self.lib.fns.send)(send, count, dtype.raw(), peer, self.raw, stream);
        self.lib.check("ncclSend", code)
    }

    /// Receives `count` elements from rank `peer` into `recv` (`ncclRecv`);
    /// the counterpart of [`NcclComm::send`].
    ///
    /// # Safety
    ///
    /// As [`NcclComm::all_reduce`], with `recv` valid for `count` elements.
    pub unsafe fn recv(
        &self,
        recv: *mut c_void,
        count: usize,
        dtype: NcclDataType,
        peer: usize,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        let peer = self.peer("ncclRecv", peer)?;
        // SAFETY: the caller upholds the contract above; `self.raw` is live.
        let code = (self.lib.fns.recv)(recv, count, dtype.raw(), peer, self.raw, stream);
        self.lib.check("ncclRecv", code)
    }

    /// Aborts the communicator (`ncclCommAbort`): pending operations are
    /// cancelled and its resources freed without waiting for other ranks.
    /// Use it instead of dropping when a rank fails, so that the job does
    /// not hang in `ncclCommDestroy`.
    pub fn abort(mut self) -> Result<(), NcclError> {
        // Null tells `Drop` that the communicator is already released.
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        // SAFETY: `raw` came from `ncclCommInitRank` and is released exactly once.
        let code = unsafe { (self.lib.fns.comm_abort)(raw) };
        self.lib.check("ncclCommAbort", code)
    }

    /// `rank` as a C `int` checked to lie in `0..world_size()`.
    fn peer(&self, op: &'static str, rank: usize) -> Result<c_int, NcclError> {
        if rank >= self.world_size {
            return Err(NcclError::InvalidArgument {
                op,
                detail: format!("rank {rank} is outside 0..{}", self.world_size),
            });
        }
        to_c_int(op, "rank", rank)
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return; // released by `abort`
        }
        // SAFETY: `raw` came from `ncclCommInitRank` and is released only
        // here. A failure cannot be reported from drop; it leaves at worst
        // the library's resources allocated.
        let _ = unsafe { (self.lib.fns.comm_destroy)(self.raw) };
    }
}

/// `value` as a C `int`, or an error naming `op` and `what`.
fn to_c_int(op: &'static str, what: &str, value: usize) -> Result<c_int, NcclError> {
    c_int::try_from(value).map_err(|_| NcclError::InvalidArgument {
        op,
        detail: format!("{what} {value} does not fit a C int"),
    })
}
