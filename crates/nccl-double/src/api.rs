//! The exported C functions, with the signatures of `nccl.h`. Each checks
//! its arguments and forwards to [`DoubleComm`], [`group`] or [`id`].
//!
//! [`group`]: crate::group
//! [`id`]: crate::id

use std::ffi::{c_char, c_int, c_void};

use mpi::traits::Communicator;

use crate::bf16;
use crate::comm::DoubleComm;
use crate::group::{self, Deferred};
use crate::id::{self, UniqueId};
use crate::result::{self, Outcome, INVALID_ARGUMENT, INVALID_USAGE, SUCCESS};

/// `ncclFloat32`, the double's data type.
const FLOAT32: c_int = 7;
/// `ncclBfloat16`: all-reduce, all-gather and reduce-scatter widen it to
/// `f32` ([`crate::bf16`]).
const BFLOAT16: c_int = 9;
/// `ncclFloat16`: moved by sends and receives only.
const FLOAT16: c_int = 6;
/// `ncclSum`, the only reduction of the double.
const SUM: c_int = 0;
/// The NCCL version the double reports: 2.20.0 (`ncclGetVersion`'s code).
const VERSION: c_int = 22_000;

/// The double's communicator behind an `ncclComm_t`, if `comm` is not null.
///
/// # Safety
///
/// `comm` is null or came from [`ncclCommInitRank`] and is not yet destroyed.
unsafe fn comm<'a>(comm: *mut c_void) -> Result<&'a DoubleComm, c_int> {
    // SAFETY: the caller's contract.
    unsafe { comm.cast::<DoubleComm>().as_ref() }.ok_or(INVALID_ARGUMENT)
}

/// Checks that `dtype` is `ncclFloat32` and `op` (when given) `ncclSum`.
fn float_sum(dtype: c_int, op: Option<c_int>) -> Outcome {
    if dtype != FLOAT32 || op.is_some_and(|op| op != SUM) {
        return Err(INVALID_ARGUMENT);
    }
    Ok(())
}

/// The bytes of `count` values of `dtype` that a send or a receive moves
/// (f32, bf16 and f16: point-to-point calls move values as their bytes).
fn moved_bytes(dtype: c_int, count: usize) -> Result<usize, i32> {
    match dtype {
        FLOAT32 => Ok(count * 4),
        BFLOAT16 | FLOAT16 => Ok(count * 2),
        _ => Err(INVALID_ARGUMENT),
    }
}

/// Refuses collectives inside a group (the double runs only sends and
/// receives there).
fn not_grouped() -> Outcome {
    if group::is_open() {
        return Err(INVALID_USAGE);
    }
    Ok(())
}

/// `ncclResult_t ncclGetVersion(int* version)`.
///
/// # Safety
///
/// `version` is null or valid for writing.
#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> c_int {
    // SAFETY: the caller's contract.
    match unsafe { version.as_mut() } {
        Some(v) => {
            *v = VERSION;
            SUCCESS
        }
        None => INVALID_ARGUMENT,
    }
}

/// `const char* ncclGetErrorString(ncclResult_t result)`.
#[no_mangle]
pub extern "C" fn ncclGetErrorString(code: c_int) -> *const c_char {
    result::text(code)
}

/// `ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId)`.
///
/// # Safety
///
/// `out` is null or valid for writing an `ncclUniqueId`.
#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(out: *mut UniqueId) -> c_int {
    // SAFETY: the caller's contract.
    let Some(out) = (unsafe { out.as_mut() }) else {
        return INVALID_ARGUMENT;
    };
    result::code(id::new_id().map(|id| *out = id))
}

/// `ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank)`.
///
/// # Safety
///
/// `out` is null or valid for writing an `ncclComm_t`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    out: *mut *mut c_void,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(out) = (unsafe { out.as_mut() }) else {
        return INVALID_ARGUMENT;
    };
    result::code(id::join(nranks, &id, rank).map(|c| {
        *out = Box::into_raw(Box::new(DoubleComm::new(c))).cast();
    }))
}

/// Frees a communicator of [`ncclCommInitRank`].
///
/// # Safety
///
/// `comm` is null or came from [`ncclCommInitRank`] and is released only here.
unsafe fn release(comm: *mut c_void) -> c_int {
    if comm.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: the caller's contract: the box made by `ncclCommInitRank`.
    unsafe { Box::from_raw(comm.cast::<DoubleComm>()) }.release();
    SUCCESS
}

/// `ncclResult_t ncclCommDestroy(ncclComm_t comm)`.
///
/// # Safety
///
/// As [`release`].
#[no_mangle]
pub unsafe extern "C" fn ncclCommDestroy(comm: *mut c_void) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { release(comm) }
}

/// `ncclResult_t ncclCommAbort(ncclComm_t comm)`: as destroy (every call
/// of the double has completed when it returns, so nothing is pending).
///
/// # Safety
///
/// As [`release`].
#[no_mangle]
pub unsafe extern "C" fn ncclCommAbort(comm: *mut c_void) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { release(comm) }
}

/// `ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream)`.
///
/// # Safety
///
/// Host buffers valid for `count` `f32` values; `comm` live; `stream` unused.
#[no_mangle]
pub unsafe extern "C" fn ncclAllReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    comm: *mut c_void,
    _stream: *mut c_void,
) -> c_int {
    result::code((|| {
        // SAFETY: the caller's contract.
        let c = unsafe { self::comm(comm)? };
        if dtype == BFLOAT16 {
            float_sum(FLOAT32, Some(op))?;
            not_grouped()?;
            // SAFETY: the caller's contract, for bfloat16 values; the call
            // gets `via_f32`'s buffers, of the lengths given.
            return unsafe {
                bf16::via_f32(send.cast(), count, recv.cast(), count, |s, r| {
                    c.all_reduce_sum(s, r, count)
                })
            };
        }
        float_sum(dtype, Some(op))?;
        not_grouped()?;
        // SAFETY: the caller's contract.
        unsafe { c.all_reduce_sum(send.cast(), recv.cast(), count) }
    })())
}

/// `ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream)`.
///
/// # Safety
///
/// `send` valid for `count` values, `recv` for `count * nranks`; `comm` live.
#[no_mangle]
pub unsafe extern "C" fn ncclAllGather(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    comm: *mut c_void,
    _stream: *mut c_void,
) -> c_int {
    result::code((|| {
        // SAFETY: the caller's contract.
        let c = unsafe { self::comm(comm)? };
        if dtype == BFLOAT16 {
            not_grouped()?;
            let all = count * c.mpi().size() as usize;
            // SAFETY: the caller's contract, for bfloat16 values; the call
            // gets `via_f32`'s buffers, of the lengths given.
            return unsafe {
                bf16::via_f32(send.cast(), count, recv.cast(), all, |s, r| {
                    c.all_gather(s, r, count)
                })
            };
        }
        float_sum(dtype, None)?;
        not_grouped()?;
        // SAFETY: the caller's contract.
        unsafe { c.all_gather(send.cast(), recv.cast(), count) }
    })())
}

/// `ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream)`.
///
/// # Safety
///
/// `send` valid for `count * nranks` values, `recv` for `count`; `comm` live.
#[no_mangle]
pub unsafe extern "C" fn ncclReduceScatter(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    comm: *mut c_void,
    _stream: *mut c_void,
) -> c_int {
    result::code((|| {
        // SAFETY: the caller's contract.
        let c = unsafe { self::comm(comm)? };
        if dtype == BFLOAT16 {
            float_sum(FLOAT32, Some(op))?;
            not_grouped()?;
            let all = count * c.mpi().size() as usize;
            // SAFETY: the caller's contract, for bfloat16 values; the call
            // gets `via_f32`'s buffers, of the lengths given.
            return unsafe {
                bf16::via_f32(send.cast(), all, recv.cast(), count, |s, r| {
                    c.reduce_scatter_sum(s, r, count)
                })
            };
        }
        float_sum(dtype, Some(op))?;
        not_grouped()?;
        // SAFETY: the caller's contract.
        unsafe { c.reduce_scatter_sum(send.cast(), recv.cast(), count) }
    })())
}

/// `ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream)`.
///
/// # Safety
///
/// `recv` valid for `count` values (and `send` on `root`); `comm` live.
#[no_mangle]
pub unsafe extern "C" fn ncclBroadcast(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
    comm: *mut c_void,
    _stream: *mut c_void,
) -> c_int {
    result::code((|| {
        float_sum(dtype, None)?;
        not_grouped()?;
        // SAFETY: the caller's contract.
        unsafe { self::comm(comm)?.broadcast(send.cast(), recv.cast(), count, root) }
    })())
}

/// `ncclSend(sendbuff, count, datatype, peer, comm, stream)`.
///
/// # Safety
///
/// `send` valid for `count` values until the call (or its group) completes; `comm` live.
#[no_mangle]
pub unsafe extern "C" fn ncclSend(
    send: *const c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
    comm: *mut c_void,
    _stream: *mut c_void,
) -> c_int {
    result::code((|| {
        let bytes = moved_bytes(dtype, count)?;
        // SAFETY: the caller's contract.
        let c = unsafe { self::comm(comm)? };
        if group::is_open() {
            c.peer(peer)?;
            group::defer(Deferred::Send {
                comm: c,
                ptr: send.cast(),
                bytes,
                peer,
            });
            return Ok(());
        }
        // SAFETY: the caller's contract.
        unsafe { c.send(send.cast(), bytes, peer) }
    })())
}

/// `ncclRecv(recvbuff, count, datatype, peer, comm, stream)`.
///
/// # Safety
///
/// `recv` valid for `count` values until the call (or its group) completes; `comm` live.
#[no_mangle]
pub unsafe extern "C" fn ncclRecv(
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
    comm: *mut c_void,
    _stream: *mut c_void,
) -> c_int {
    result::code((|| {
        let bytes = moved_bytes(dtype, count)?;
        // SAFETY: the caller's contract.
        let c = unsafe { self::comm(comm)? };
        if group::is_open() {
            c.peer(peer)?;
            group::defer(Deferred::Recv {
                comm: c,
                ptr: recv.cast(),
                bytes,
                peer,
            });
            return Ok(());
        }
        // SAFETY: the caller's contract.
        unsafe { c.recv(recv.cast(), bytes, peer) }
    })())
}

/// `ncclResult_t ncclGroupStart(void)`.
#[no_mangle]
pub extern "C" fn ncclGroupStart() -> c_int {
    group::start();
    SUCCESS
}

/// `ncclResult_t ncclGroupEnd(void)`.
///
/// # Safety
///
/// The buffers of the grouped sends and receives are still valid.
#[no_mangle]
pub unsafe extern "C" fn ncclGroupEnd() -> c_int {
    // SAFETY: the caller's contract.
    result::code(unsafe { group::end() })
}
