//! Sharded checkpoints reshard on load: a run's step-3 checkpoint, written
//! per rank in one layout, resumes under `mpirun` in another (TP, PP with
//! interleaving, DP, ZeRO stage and rank count all changed), and steps 4
//! and 5 and the final weights equal the uninterrupted one-rank run's
//! within the equivalence tolerances of the layouts involved.
//!
//! Needs the binary built with the `mpi` feature and Open MPI's `mpirun`
//! (see `common/mpirun.rs`; without the feature the tests are skipped with
//! a printed reason).

use std::path::Path;

use crate::common;
use crate::mpirun;

use common::{copy_dir, corpus, scratch, step_losses};
use ferrotron_test_support::runs::check_weights;
use mpirun::{mpi_built, run, RunFlags};

/// Largest difference between a resumed run's weights and the one-rank
/// run's, relative to the model's largest weight: the tolerance of the
/// tensor-parallel equivalence tests (tests/facade/tensor_parallel.rs, which
/// explains it), since every resumed run here has TP on one side.
const MODEL_TOLERANCE: f32 = 1e-4;

/// Largest difference within one tensor, relative to its own largest
/// weight (tests/facade/tensor_parallel.rs's `TENSOR_TOLERANCE`).
const TENSOR_TOLERANCE: f32 = 5e-3;

/// A layout: its name, ranks, `--grad-accum` (global batch 8 = dp x 2 x
/// accum) and flags.
type Layout = (&'static str, usize, &'static str, &'static [&'static str]);

/// One rank, ZeRO 0: the reference.
const ONE: Layout = ("one", 1, "4", &["--tp", "1", "--pp", "1", "--zero", "0"]);

/// The flags of `model`'s 5-step runs into `out` (a checkpoint at step 3).
fn flags(model: &str, corpus: &Path, out: &Path, accum: &str) -> Vec<String> {
    RunFlags {
        accum: Some(accum),
        save_every: Some("3"),
        ..RunFlags::new(model, corpus, out, "5")
    }
    .args()
}

/// Trains `model` in layout `from` and on one rank; then, for each layout
/// of `to`, a copy of the `from` run resumed from its step-3 checkpoint in
/// that layout must equal the one-rank run (losses of steps 4 and 5 within
/// 1e-5 relative, weights within the tolerances above).
fn reshards(model: &str, from: Layout, to: &[Layout]) {
    let dir = scratch(&format!("reshard-{model}-{}", from.0));
    let corpus = corpus(&dir);
    let single = dir.join("single");
    run(model, 1, flags(model, &corpus, &single, ONE.2), ONE.3);
    let source = dir.join(from.0);
    let label = format!("{model} {}", from.0);
    run(
        &label,
        from.1,
        flags(model, &corpus, &source, from.2),
        from.3,
    );
    let want = step_losses(&single);
    for &(name, ranks, accum, extra) in to {
        let label = format!("{model} {} -> {name}", from.0);
        let resumed = dir.join(format!("{}-to-{name}", from.0));
        copy_dir(&source, &resumed);
        let ckpt = resumed.join("checkpoints").join("step-3");
        let mut args = vec!["--resume".to_string(), ckpt.display().to_string()];
        args.extend(["--grad-accum".to_string(), accum.to_string()]);
        run(&label, ranks, args, extra);
        let got = step_losses(&resumed);
        assert_eq!(got.len(), 7, "{label}: 5 steps, then steps 4 and 5 resumed");
        for ((s, g), (_, w)) in got[5..].iter().zip(&want[3..]) {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs(),
                "{label}: resumed step {s}: {g} vs {w}"
            );
        }
        check_weights(&label, &resumed, &single, MODEL_TOLERANCE, TENSOR_TOLERANCE);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// tp2 x dp2 ZeRO-1 (gpt-mini: a vocabulary padded over TP, an embedding
/// tied to the head) resumes on one rank, on a pp2 pipeline (the tied
/// embedding held by both end stages) and as tp2 x dp2 ZeRO-3.
#[test]
fn tp2_dp2_zero1_checkpoint_resumes_on_one_rank_pp2_and_tp2_zero3() {
    if !mpi_built() {
        return;
    }
    reshards(
        "gpt-mini",
        ("tp2-dp2-zero1", 4, "2", &["--tp", "2", "--zero", "1"]),
        &[
            ONE,
            ("pp2", 2, "4", &["--tp", "1", "--pp", "2", "--zero", "0"]),
            ("tp2-dp2-zero3", 4, "2", &["--tp", "2", "--zero", "3"]),
        ],
    );
}

/// An interleaved pp2 checkpoint (llama-mini) resumes as tp2 x dp2; a
/// one-rank checkpoint resumes as dp2 ZeRO-3 and as tp2 x pp2 x dp2
/// (8 ranks, oversubscribed).
#[test]
fn pp2_interleaved_and_one_rank_checkpoints_reshard_onto_tp_dp_and_8_ranks() {
    if !mpi_built() {
        return;
    }
    let interleaved: Layout = (
        "pp2-interleaved",
        2,
        "4",
        &[
            "--pp",
            "2",
            "--pp-schedule",
            "interleaved",
            "--pp-virtual",
            "2",
        ],
    );
    let tp2_dp2: Layout = (
        "tp2-dp2",
        4,
        "2",
        &[
            "--tp",
            "2",
            "--pp",
            "1",
            "--pp-schedule",
            "1f1b",
            "--pp-virtual",
            "1",
        ],
    );
    reshards("llama-mini", interleaved, &[tp2_dp2]);
    reshards(
        "llama-mini",
        ONE,
        &[
            ("dp2-zero3", 2, "2", &["--zero", "3"]),
            ("tp2-pp2-dp2", 8, "2", &["--tp", "2", "--pp", "2"]),
        ],
    );
}
