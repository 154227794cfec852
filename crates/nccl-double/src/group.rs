//! `ncclGroupStart` / `ncclGroupEnd`: sends and receives issued in between
//! are deferred, then started together as nonblocking MPI calls.

use std::cell::RefCell;

use mpi::traits::{Communicator, Destination, Source};

use crate::comm::{in_slice, out_slice, DoubleComm};
use crate::result::{Outcome, INVALID_USAGE};

/// A deferred `ncclSend` or `ncclRecv`.
pub enum Deferred {
    /// Send `bytes` bytes at `ptr` to `peer` of `comm`.
    Send {
        comm: *const DoubleComm,
        ptr: *const u8,
        bytes: usize,
        peer: i32,
    },
    /// Receive `bytes` bytes from `peer` of `comm` into `ptr`.
    Recv {
        comm: *const DoubleComm,
        ptr: *mut u8,
        bytes: usize,
        peer: i32,
    },
}

/// This thread's open groups: nesting depth and the deferred calls.
#[derive(Default)]
struct Open {
    depth: usize,
    calls: Vec<Deferred>,
}

thread_local! {
    static OPEN: RefCell<Open> = RefCell::new(Open::default());
}

/// `ncclGroupStart`: opens a (possibly nested) group.
pub fn start() {
    OPEN.with_borrow_mut(|g| g.depth += 1);
}

/// Whether a group is open on this thread.
pub fn is_open() -> bool {
    OPEN.with_borrow(|g| g.depth > 0)
}

/// Defers `call` to the outermost `ncclGroupEnd`.
pub fn defer(call: Deferred) {
    OPEN.with_borrow_mut(|g| g.calls.push(call));
}

/// `ncclGroupEnd`: closes a group; the outermost one runs every deferred
/// call and returns when all have completed.
///
/// # Safety
///
/// The pointers of the deferred calls are still valid (the `ncclSend` /
/// `ncclRecv` contract until the group completes).
pub unsafe fn end() -> Outcome {
    let calls = OPEN.with_borrow_mut(|g| {
        if g.depth == 0 {
            return Err(INVALID_USAGE);
        }
        g.depth -= 1;
        Ok(if g.depth == 0 {
            std::mem::take(&mut g.calls)
        } else {
            Vec::new()
        })
    })?;
    if calls.is_empty() {
        return Ok(());
    }
    // Check every call and make its slice before starting any.
    let mut ready = Vec::with_capacity(calls.len());
    for call in &calls {
        let (comm, peer, buf) = match *call {
            // SAFETY: the caller's contract.
            Deferred::Send {
                comm,
                ptr,
                bytes,
                peer,
            } => (comm, peer, Buf::In(unsafe { in_slice(ptr, bytes) }?)),
            // SAFETY: the caller's contract.
            Deferred::Recv {
                comm,
                ptr,
                bytes,
                peer,
            } => (comm, peer, Buf::Out(unsafe { out_slice(ptr, bytes) }?)),
        };
        // SAFETY: `comm` came from `ncclCommInitRank` and is live (NCCL contract).
        let comm = unsafe { &*comm };
        ready.push((comm, comm.peer(peer)?, buf));
    }
    mpi::request::scope(|scope| {
        let requests: Vec<_> = ready
            .into_iter()
            .map(|(comm, peer, buf)| {
                let process = comm.mpi().process_at_rank(peer);
                match buf {
                    Buf::In(send) => process.immediate_send(scope, send),
                    Buf::Out(recv) => process.immediate_receive_into(scope, recv),
                }
            })
            .collect();
        for request in requests {
            request.wait();
        }
    });
    Ok(())
}

/// The buffer of a deferred call.
enum Buf<'a> {
    /// What a send reads.
    In(&'a [u8]),
    /// What a receive writes.
    Out(&'a mut [u8]),
}
