//! Running `ferrotron train` on several ranks under Open MPI's `mpirun`
//! (oversubscribed: the tests share 2 cores), killed after a deadline.
//! Included by the multi-rank test files (`#[path]`), whose crate root
//! declares the `deadline` module.

use std::process::{Command, Output};
use std::time::Duration;

use crate::deadline;

/// When a training run that never ends is killed: far beyond a normal run,
/// even on 2 shared cores.
const DEADLINE: Duration = Duration::from_secs(900);

/// `false` (and a printed reason) when the binary has no MPI support.
pub fn mpi_built() -> bool {
    if !cfg!(feature = "mpi") {
        eprintln!(
            "SKIPPED: ferrotron was built without the `mpi` feature; run `cargo test -p ferrotron-cli --features mpi`"
        );
    }
    cfg!(feature = "mpi")
}

/// Runs `ferrotron train` with `args` on `ranks` processes (1: no mpirun).
pub fn train(ranks: usize, args: &[&str]) -> Output {
    train_within(ranks, args, DEADLINE)
}

/// `train`, killed and failing the test after `deadline`.
pub fn train_within(ranks: usize, args: &[&str], deadline: Duration) -> Output {
    let bin = env!("CARGO_BIN_EXE_ferrotron");
    let mut cmd = if ranks == 1 {
        Command::new(bin)
    } else {
        let mut c = Command::new("mpirun");
        c.args(["--allow-run-as-root", "--oversubscribe", "-np"])
            .arg(ranks.to_string())
            .arg(bin);
        c
    };
    // Keep the child ranks single-threaded enough to share 2 cores.
    cmd.env("OMPI_MCA_rmaps_base_oversubscribe", "1");
    cmd.arg("train").args(args);
    deadline::output_within(&mut cmd, deadline).unwrap_or_else(|e| {
        panic!(
            "could not start {} (is Open MPI's mpirun installed?): {e}",
            if ranks == 1 { bin } else { "mpirun" }
        )
    })
}
