//! `ferrotron train --tp` under `mpirun`: a tp2 run's weights generate
//! text on one rank and its sharded checkpoint resumes there from the
//! command line; a TP degree that does not divide the heads is refused
//! before anything is written. That the TP layouts equal the one-rank run
//! is tested through the library (tests/facade/tensor_parallel.rs).
//!
//! Needs the binary built with the `mpi` feature and Open MPI's `mpirun`
//! (see `common/mpirun.rs`; without the feature the tests are skipped with
//! a printed reason). A run still going after its deadline is killed and
//! fails the test.

use std::process::Command;
use std::time::Duration;

use crate::common;
use crate::mpirun;
use ferrotron_test_support::deadline;

use common::{copy_dir, corpus, scratch, step_losses};
use ferrotron_test_support::runs::check_weights;
use mpirun::{equivalence_args as args, mpi_built, run, train_within};

/// The weight tolerances of the TP layouts, relative to the model's
/// largest weight and to each tensor's own (measured and explained in
/// tests/facade/tensor_parallel.rs).
const MODEL_TOLERANCE: f32 = 1e-4;
/// See [`MODEL_TOLERANCE`].
const TENSOR_TOLERANCE: f32 = 5e-3;

/// A llama-mini tp2 run (2 ranks) and the one-rank run it equals (global
/// batch 4 = 2 x grad-accum 2, a checkpoint at step 3): `ferrotron
/// generate` loads the tp2 run on one rank, and its sharded step-3
/// checkpoint resumes on one rank (`--resume ... --tp 1`, each tensor
/// read from both TP blocks) to the one-rank run's steps 4 and 5 and
/// final weights. That the TP layouts equal the one-rank run is tested
/// through the library (tests/facade/tensor_parallel.rs), whose
/// tolerances these are.
#[test]
fn a_tp2_run_generates_and_resumes_on_one_rank() {
    if !mpi_built() {
        return;
    }
    let model = "llama-mini";
    let dir = scratch("tp-resume");
    let corpus = corpus(&dir);
    let single = dir.join("single");
    run(model, 1, args(model, &corpus, &single, "2"), &[]);
    let tp2 = dir.join("tp2");
    run("tp2", 2, args(model, &corpus, &tp2, "2"), &["--tp", "2"]);
    let resumed = dir.join("resumed");
    copy_dir(&tp2, &resumed);
    let from = resumed.join("checkpoints").join("step-3");
    run(
        "resume of tp2 on one rank",
        1,
        vec!["--resume".into(), from.to_str().unwrap().into()],
        &["--tp", "1"],
    );
    let got = step_losses(&resumed);
    let want = step_losses(&single);
    assert_eq!((got.len(), want.len()), (5, 5));
    for ((s, g), (_, w)) in got[3..].iter().zip(&want[3..]) {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs(),
            "resumed step {s}: {g} vs {w}"
        );
    }
    check_weights(
        "resume of tp2 on one rank",
        &resumed,
        &single,
        MODEL_TOLERANCE,
        TENSOR_TOLERANCE,
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrotron"));
    cmd.args(["generate", "--run", tp2.to_str().unwrap()])
        .args(["--prompt", "Line 3", "--max-new-tokens", "8", "--greedy"]);
    let o = deadline::output_within(&mut cmd, Duration::from_secs(300)).unwrap();
    assert!(
        o.status.success(),
        "generate from the tp2 run: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("Line 3"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// gpt-mini has 6 attention heads: 4 ranks cannot split them.
#[test]
fn a_tp_degree_that_does_not_divide_the_heads_exits_2_before_writing() {
    if !mpi_built() {
        return;
    }
    let dir = scratch("tp-heads");
    let out = dir.join("run");
    let o = train_within(
        4,
        &[
            "--model",
            "gpt-mini",
            "--tp",
            "4",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--tp 4") && err.contains("n_heads (6 attention heads)"),
        "{err}"
    );
    assert!(!out.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
