//! Where the NCCL / RCCL library is looked for: the environment variable
//! that names it and the default names.

/// Environment variable holding the path (or `dlopen` name) of the NCCL /
/// RCCL library to load instead of searching [`LIBRARY_NAMES`].
pub const LIBRARY_ENV: &str = "FERROTRON_NCCL_LIBRARY";

/// The library names tried, in this order, when [`LIBRARY_ENV`] is unset:
/// NCCL's runtime soname, NCCL's development link, then RCCL's soname and
/// development link. Each is resolved by `dlopen` (`LD_LIBRARY_PATH`, the
/// `ld.so` cache, the default directories).
pub const LIBRARY_NAMES: [&str; 4] = ["libnccl.so.2", "libnccl.so", "librccl.so.1", "librccl.so"];
