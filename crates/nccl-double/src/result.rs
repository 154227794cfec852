//! `ncclResult_t` values (from `nccl.h`) and their texts.

use std::ffi::{c_char, c_int};

/// `ncclSuccess`.
pub const SUCCESS: c_int = 0;
/// `ncclInternalError`: MPI did not give what the double asked for.
pub const INTERNAL_ERROR: c_int = 3;
/// `ncclInvalidArgument`: a null pointer, a rank out of range, or a data
/// type or reduction the double does not support.
pub const INVALID_ARGUMENT: c_int = 4;
/// `ncclInvalidUsage`: MPI not initialized, a foreign unique id, or a
/// collective inside a group.
pub const INVALID_USAGE: c_int = 5;

/// What went wrong, as an `ncclResult_t`.
pub type Outcome = Result<(), c_int>;

/// The C value of `outcome`.
pub fn code(outcome: Outcome) -> c_int {
    match outcome {
        Ok(()) => SUCCESS,
        Err(code) => code,
    }
}

/// The text `ncclGetErrorString` returns for `code`: a static C string.
pub fn text(code: c_int) -> *const c_char {
    let text: &'static [u8] = match code {
        SUCCESS => b"no error\0",
        INTERNAL_ERROR => b"internal error (Ferrotron NCCL test double: MPI failed)\0",
        INVALID_ARGUMENT => b"invalid argument (Ferrotron NCCL test double: null pointer, rank out of range, or a data type other than ncclFloat32 (and ncclBfloat16 in all-reduce, all-gather and reduce-scatter; ncclBfloat16 and ncclFloat16 in send and receive) or a reduction other than ncclSum)\0",
        INVALID_USAGE => b"invalid usage (Ferrotron NCCL test double: MPI not initialized, a unique id not made by this double, or a collective inside ncclGroupStart/ncclGroupEnd)\0",
        _ => b"unknown result code (Ferrotron NCCL test double)\0",
    };
    text.as_ptr().cast()
}
