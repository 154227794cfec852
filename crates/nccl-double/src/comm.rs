//! One communicator of the double (`ncclComm_t`) and its collectives and
//! point-to-point calls on host `f32` buffers.

use std::mem::ManuallyDrop;
use std::slice;

use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Destination, Root, Source};

use crate::result::{Outcome, INVALID_ARGUMENT};

/// An `ncclComm_t` of the double: the MPI communicator of its members.
pub struct DoubleComm {
    /// Freed by [`DoubleComm::release`] unless MPI is finalized by then.
    comm: ManuallyDrop<SimpleCommunicator>,
}

impl DoubleComm {
    /// Wraps the communicator made by `ncclCommInitRank`.
    pub fn new(comm: SimpleCommunicator) -> Self {
        Self {
            comm: ManuallyDrop::new(comm),
        }
    }

    /// The MPI communicator.
    pub fn mpi(&self) -> &SimpleCommunicator {
        &self.comm
    }

    /// Frees the MPI communicator (`ncclCommDestroy` / `ncclCommAbort`); after
    /// `MPI_Finalize` that is not allowed, and the handle is left as it is.
    pub fn release(mut self) {
        if !mpi::environment::is_finalized() {
            // SAFETY: dropped once, here; `self` is consumed.
            unsafe { ManuallyDrop::drop(&mut self.comm) };
        }
    }

    /// `rank` checked to lie in `0..size`.
    pub fn peer(&self, rank: i32) -> Result<i32, i32> {
        if (0..self.comm.size()).contains(&rank) {
            Ok(rank)
        } else {
            Err(INVALID_ARGUMENT)
        }
    }

    /// `ncclAllReduce` with `ncclSum`: `recv[i]` = the sum over ranks of `send[i]`.
    ///
    /// # Safety
    ///
    /// `send` and `recv` valid for `count` values (they may be equal).
    pub unsafe fn all_reduce_sum(&self, send: *const f32, recv: *mut f32, count: usize) -> Outcome {
        let input = copy_in(send, count)?;
        let out = out_slice(recv, count)?;
        self.comm
            .all_reduce_into(&input[..], out, SystemOperation::sum());
        Ok(())
    }

    /// `ncclAllGather`: every rank's `count` values in rank order.
    ///
    /// # Safety
    ///
    /// `send` valid for `count` values, `recv` for `count * size`; `send`
    /// may be block `rank` of `recv`.
    pub unsafe fn all_gather(&self, send: *const f32, recv: *mut f32, count: usize) -> Outcome {
        let input = copy_in(send, count)?;
        let out = out_slice(recv, count * self.comm.size() as usize)?;
        self.comm.all_gather_into(&input[..], out);
        Ok(())
    }

    /// `ncclReduceScatter` with `ncclSum`: block `rank` of the sum.
    ///
    /// # Safety
    ///
    /// `send` valid for `count * size` values, `recv` for `count`; `recv`
    /// may be block `rank` of `send`.
    pub unsafe fn reduce_scatter_sum(
        &self,
        send: *const f32,
        recv: *mut f32,
        count: usize,
    ) -> Outcome {
        let input = copy_in(send, count * self.comm.size() as usize)?;
        let out = out_slice(recv, count)?;
        self.comm
            .reduce_scatter_block_into(&input[..], out, SystemOperation::sum());
        Ok(())
    }

    /// `ncclBroadcast`: `root`'s `send` into every rank's `recv`.
    ///
    /// # Safety
    ///
    /// `recv` valid for `count` values; on `root`, `send` too (it may equal `recv`).
    pub unsafe fn broadcast(
        &self,
        send: *const f32,
        recv: *mut f32,
        count: usize,
        root: i32,
    ) -> Outcome {
        let root = self.peer(root)?;
        if self.comm.rank() == root {
            let input = copy_in(send, count)?;
            out_slice(recv, count)?.copy_from_slice(&input);
        }
        let out = out_slice(recv, count)?;
        self.comm.process_at_rank(root).broadcast_into(out);
        Ok(())
    }

    /// `ncclSend` outside a group of `bytes` bytes (any data type's
    /// values move as their bytes): returns once `peer` has received it.
    ///
    /// # Safety
    ///
    /// `send` valid for `bytes` bytes.
    pub unsafe fn send(&self, send: *const u8, bytes: usize, peer: i32) -> Outcome {
        let peer = self.peer(peer)?;
        let input = in_slice(send, bytes)?;
        self.comm.process_at_rank(peer).synchronous_send(input);
        Ok(())
    }

    /// `ncclRecv` outside a group, of `bytes` bytes.
    ///
    /// # Safety
    ///
    /// `recv` valid for `bytes` bytes.
    pub unsafe fn recv(&self, recv: *mut u8, bytes: usize, peer: i32) -> Outcome {
        let peer = self.peer(peer)?;
        let out = out_slice(recv, bytes)?;
        self.comm.process_at_rank(peer).receive_into(out);
        Ok(())
    }
}

/// A copy of `count` values at `ptr` (so that MPI never sees an input and
/// an output that overlap).
///
/// # Safety
///
/// `ptr` valid for reading `count` values.
pub unsafe fn copy_in(ptr: *const f32, count: usize) -> Result<Vec<f32>, i32> {
    Ok(in_slice(ptr, count)?.to_vec())
}

/// `count` values at `ptr` as a slice (empty for `count` 0, whatever `ptr`).
///
/// # Safety
///
/// `ptr` valid for reading `count` values for `'a`.
pub unsafe fn in_slice<'a, T>(ptr: *const T, count: usize) -> Result<&'a [T], i32> {
    match (count, ptr.is_null()) {
        (0, _) => Ok(&[]),
        (_, true) => Err(INVALID_ARGUMENT),
        // SAFETY: the caller's contract; non-null checked.
        _ => Ok(unsafe { slice::from_raw_parts(ptr, count) }),
    }
}

/// `count` values at `ptr` as a mutable slice (empty for `count` 0).
///
/// # Safety
///
/// `ptr` valid for writing `count` values for `'a`, not otherwise accessed meanwhile.
pub unsafe fn out_slice<'a, T>(ptr: *mut T, count: usize) -> Result<&'a mut [T], i32> {
    match (count, ptr.is_null()) {
        (0, _) => Ok(&mut []),
        (_, true) => Err(INVALID_ARGUMENT),
        // SAFETY: the caller's contract; non-null checked.
        _ => Ok(unsafe { slice::from_raw_parts_mut(ptr, count) }),
    }
}
