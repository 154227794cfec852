//! What can go wrong when loading or calling NCCL / RCCL.

use std::ffi::c_int;

use crate::comm::CommError;

use super::names::LIBRARY_ENV;

/// An error of the NCCL / RCCL binding. Every variant names the library
/// file, symbol or operation involved.
#[derive(Debug, thiserror::Error)]
pub enum NcclError {
    /// None of the default library names could be opened.
    #[error(
        "no NCCL or RCCL library could be loaded; tried {}. Install NCCL (libnccl2, \
         or the NCCL of the CUDA toolkit / NVIDIA HPC SDK) or RCCL (ROCm's rccl package), \
         put its directory on LD_LIBRARY_PATH, or set {LIBRARY_ENV} to the library file's path",
        .tried.join("; ")
    )]
    LibraryNotFound {
        /// One entry per file tried, in order: `"name: why it did not open"`.
        tried: Vec<String>,
    },
    /// The library named by the environment variable could not be opened
    /// (the default names are then not tried).
    #[error(
        "{LIBRARY_ENV}={path}: cannot open this NCCL/RCCL library: {reason}. \
         Point {LIBRARY_ENV} at libnccl.so.2 or librccl.so, or unset it to search the default names"
    )]
    ExplicitLibrary {
        /// The path given in the environment variable.
        path: String,
        /// The loader's message.
        reason: String,
    },
    /// The library opened but lacks a function of the NCCL C API.
    #[error("{library}: symbol {symbol} not found ({reason}); this is not an NCCL/RCCL library, or one older than NCCL 2.7 (which added ncclSend and ncclRecv)")]
    MissingSymbol {
        /// The C function name.
        symbol: &'static str,
        /// The library file that was opened.
        library: String,
        /// The loader's message.
        reason: String,
    },
    /// An NCCL call returned a code other than `ncclSuccess`.
    #[error("{op}: {name} ({code}): {text}")]
    Call {
        /// The C function that failed (`ncclAllReduce`, ...).
        op: &'static str,
        /// The `ncclResult_t` value.
        code: c_int,
        /// Its C name (`ncclInvalidArgument`, ...).
        name: &'static str,
        /// The library's `ncclGetErrorString` text.
        text: String,
    },
    /// An argument this binding checks before calling NCCL is out of range.
    #[error("{op}: {detail}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What was expected and found.
        detail: String,
    },
    /// Broadcasting the unique id over the host communicator failed.
    #[error("NCCL bootstrap: broadcasting the unique id failed: {0}")]
    Bootstrap(#[from] CommError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::nccl::types::result_name;

    #[test]
    fn failed_call_error_names_the_operation_code_and_text() {
        let err = NcclError::Call {
            op: "ncclAllReduce",
            code: 4,
            name: result_name(4),
            text: "invalid argument".into(),
        };
        assert_eq!(
            err.to_string(),
            "ncclAllReduce: ncclInvalidArgument (4): invalid argument"
        );
    }
}
