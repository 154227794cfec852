//! Where the NCCL test double (`crates/nccl-double`) is for a test run.
//! Cargo builds it before the tests of the crates that name it as a
//! dev-dependency, next to their test executables (`target/debug/deps`).

use std::path::PathBuf;

/// The double's file name.
pub const FILE: &str = "libferrotron_nccl_double.so";

/// The double built for this test run; panics (naming the path) if it is
/// missing, i.e. the tests were built without the `mpi` feature that
/// builds it.
pub fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let lib = exe
        .parent()
        .expect("the test executable's directory")
        .join(FILE);
    assert!(
        lib.is_file(),
        "{} is missing: it is built with the tests when the `mpi` feature is on (scripts/test --mpi)",
        lib.display()
    );
    lib
}
