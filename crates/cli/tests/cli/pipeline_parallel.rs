//! `ferrotron train --pp` under `mpirun`: a pp2 run (its weights gathered
//! from both stages) generates text and resumes on one rank from the
//! command line; a pipeline that cannot run is refused before anything is
//! written. That the pipelines equal the one-rank run is tested through
//! the library (tests/facade/pipeline_parallel.rs).
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

/// The weight tolerance of a pipeline without TP or DP, per tensor
/// (measured and explained in tests/facade/pipeline_parallel.rs).
const PP_TOLERANCE: f32 = 1e-5;

/// A gpt-mini pp2 run (2 ranks) and the one-rank run it equals (global
/// batch 8 = 2 x grad-accum 4, a checkpoint at step 3): its weights (both
/// stages gathered) generate on one rank, and its sharded step-3
/// checkpoint resumes there (`--resume ... --pp 1`) to the one-rank run's
/// last steps and weights. That the pipelines equal the one-rank run is
/// tested through the library (tests/facade/pipeline_parallel.rs).
#[test]
fn a_pp2_run_generates_and_resumes_on_one_rank() {
    if !mpi_built() {
        return;
    }
    let model = "gpt-mini";
    let dir = scratch("pp-resume");
    let corpus = corpus(&dir);
    let single = dir.join("single");
    run(model, 1, args(model, &corpus, &single, "4"), &[]);
    let pp2 = dir.join("pp2");
    run("pp2", 2, args(model, &corpus, &pp2, "4"), &["--pp", "2"]);
    let resumed = dir.join("resumed");
    copy_dir(&pp2, &resumed);
    let from = resumed.join("checkpoints").join("step-3");
    run(
        "resume of pp2 on one rank",
        1,
        vec!["--resume".into(), from.to_str().unwrap().into()],
        &["--pp", "1"],
    );
    let (got, want) = (step_losses(&resumed), step_losses(&single));
    assert_eq!((got.len(), want.len()), (5, 5));
    for ((s, g), (_, w)) in got[3..].iter().zip(&want[3..]) {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs(),
            "resumed step {s}: {g} vs {w}"
        );
    }
    check_weights(
        "resume of pp2 on one rank",
        &resumed,
        &single,
        PP_TOLERANCE,
        PP_TOLERANCE,
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrotron"));
    cmd.args(["generate", "--run", pp2.to_str().unwrap()])
        .args(["--prompt", "Line 3", "--max-new-tokens", "8", "--greedy"]);
    let o = deadline::output_within(&mut cmd, Duration::from_secs(300)).unwrap();
    assert!(
        o.status.success(),
        "generate from the pp2 run: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("Line 3"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Each pipeline that cannot run exits 2 with one line naming the flag,
/// before the run directory exists.
#[test]
fn a_pipeline_that_cannot_run_exits_2_before_writing() {
    if !mpi_built() {
        return;
    }
    let dir = scratch("pp-bad");
    let cases: [(&[&str], &str); 5] = [
        (
            &["--pp", "2", "--pp-layers", "3,2"],
            "--pp-layers adds up to 5 blocks; the model has 4",
        ),
        (
            &["--pp", "2", "--pp-layers", "1,1,2"],
            "--pp-layers has 3 entries",
        ),
        (&["--pp", "2", "--zero", "3"], "--zero 3 with --pp 2"),
        (
            &[
                "--pp",
                "2",
                "--pp-schedule",
                "interleaved",
                "--pp-virtual",
                "3",
                "--grad-accum",
                "2",
            ],
            "stages need at least as many blocks",
        ),
        (
            &[
                "--pp",
                "2",
                "--pp-schedule",
                "interleaved",
                "--pp-virtual",
                "2",
                "--grad-accum",
                "3",
            ],
            "multiple of --pp 2",
        ),
    ];
    for (i, (flags, want)) in cases.into_iter().enumerate() {
        let out = dir.join(format!("run-{i}"));
        let mut all = vec!["--model", "gpt-mini", "--out", out.to_str().unwrap()];
        all.extend(flags);
        let o = train_within(2, &all, Duration::from_secs(120));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flags:?}: {err}");
        assert!(err.contains(want), "{flags:?}: {err}");
        assert!(!out.exists(), "{flags:?} wrote {}", out.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
