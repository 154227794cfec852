//! `ferrotron train --comm nccl` on the CPU backend without a usable NCCL
//! library is refused before anything is written. That training through
//! the NCCL communicator (on the test double, `crates/nccl-double`) equals
//! the one-rank run, under DP with ZeRO 0, 1 and 3, TP and PP, is tested
//! through the library, in the facade's `nccl` tests
//! (tests/facade/nccl.rs).

use std::path::Path;
use std::process::{Command, Output};

use crate::common::scratch;
use ferrotron_test_support::deadline;

/// Runs `ferrotron train` with `args` on one rank, with
/// `FERROTRON_NCCL_LIBRARY` set to `library` if given (else unset).
fn train(args: &[&str], library: Option<&Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrotron"));
    cmd.env_remove("FERROTRON_NCCL_LIBRARY");
    if let Some(lib) = library {
        cmd.env("FERROTRON_NCCL_LIBRARY", lib);
    }
    deadline::output(cmd.arg("train").args(args))
}

/// `--comm nccl` on the CPU backend without `FERROTRON_NCCL_LIBRARY`, and
/// with it naming a file that does not exist: exit 2, one line naming the
/// problem, no run directory.
#[test]
fn comm_nccl_without_a_usable_library_exits_2_before_writing() {
    let dir = scratch("nccl-refused");
    let out = dir.join("run");
    let missing = dir.join("libnccl.so.2");
    for library in [None, Some(missing.as_path())] {
        let o = train(
            &[
                "--comm",
                "nccl",
                "--steps",
                "1",
                "--out",
                out.to_str().unwrap(),
            ],
            library,
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        match library {
            None => assert!(
                err.contains("--comm nccl with --backend flex")
                    && err.contains("FERROTRON_NCCL_LIBRARY"),
                "{err}"
            ),
            Some(path) => assert!(
                err.contains(&format!("FERROTRON_NCCL_LIBRARY={}", path.display())),
                "{err}"
            ),
        }
        assert!(!out.exists(), "{} was written", out.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
