//! Running `ferrotron train` on several ranks under Open MPI's `mpirun`
//! (oversubscribed: the tests share 2 cores), killed after a deadline.
//! Included by the multi-rank test files (`#[path]`), whose crate root
//! declares the `deadline` module.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::Path;
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

/// The training flags of the multi-rank equivalence runs of `model`: 5
/// steps of 2 sequences x `accum` micro-batches of 32 tokens, `--vocab-size
/// 300`, evaluation at step 5, a checkpoint at step 3, run directory `out`.
pub fn equivalence_args(model: &str, corpus: &Path, out: &Path, accum: &str) -> Vec<String> {
    [
        "--model",
        model,
        "--vocab-size",
        "300",
        "--corpus",
        corpus.to_str().unwrap(),
        "--seq-len",
        "32",
        "--micro-batch",
        "2",
        "--steps",
        "5",
        "--grad-accum",
        accum,
        "--eval-every",
        "5",
        "--save-every",
        "3",
        "--eval-batches",
        "2",
        "--sample-tokens",
        "0",
        "--peak-tflops",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

/// Runs `ferrotron train` on `ranks` with `args` plus `extra`; fails the
/// test, naming `label`, if it fails.
pub fn run(label: &str, ranks: usize, args: Vec<String>, extra: &[&str]) {
    let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
    all.extend(extra);
    let o = train(ranks, &all);
    assert!(
        o.status.success(),
        "{label} failed:\n{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}
