//! Context parallelism across processes: for the GPT (with the goldfish
//! loss's mask split over the ring), Llama (grouped-query attention) and
//! BLOOM (ALiBi) minis, `mpirun` runs with `--cp 2`, for gpt-mini and
//! llama-mini `--cp 2` x dp 2 under ZeRO-1 and ZeRO-3, and for llama-mini
//! `--cp 2` + `--tp 2` with sequence parallelism, and for all three
//! `--cp 2` x `--pp 2` (1F1B: each stage's ring passes its chunks' hidden
//! states to the same ring rank of the next stage), equal the one-rank
//! run on the same global batch after 5 optimizer steps: losses and
//! gradient norms within 1e-5 relative, and the final weights (the step-1
//! gradients are compared per tensor at 1e-5 in the job crate's
//! `gradients_parallel` tests). Nine `mpirun` launches and three one-rank
//! runs, 32-token sequences (4 chunks of 8 on a ring of 2).
//!
//! Needs the binary built with the `mpi` feature and Open MPI's `mpirun`
//! (see `common/mpirun.rs`; without the feature the tests are skipped with
//! a printed reason).

use crate::common;
use crate::equivalence;
use crate::mpirun;

use common::{corpus, scratch, step_losses};
use equivalence::{check_steps, check_weights};
use mpirun::{equivalence_args as args, mpi_built, run};

/// Largest difference between the runs' weights after 5 steps, relative
/// to the one-rank run's largest weight, and within each tensor relative
/// to its own largest: the bounds of `tensor_parallel.rs`, whose
/// rounding (sums in another order, amplified by AdamW where a gradient
/// is at rounding level) is the kind the ring adds (its blocks' partial
/// softmax sums merge by log-sum-exp in another order than one rank's).
const MODEL_TOLERANCE: f32 = 1e-4;
/// See [`MODEL_TOLERANCE`].
const TENSOR_TOLERANCE: f32 = 5e-3;

/// Trains `model` (with `extra` on every run) on one rank (global batch
/// 4 = 2 sequences x grad-accum 2), and with each of `layouts` (name,
/// ranks, grad-accum, flags); compares the steps and the weights.
fn cp_matches_single_rank(model: &str, extra: &[&str], layouts: &[(&str, usize, &str, &[&str])]) {
    let dir = scratch(&format!("cp-{model}"));
    let corpus = corpus(&dir);
    let single = dir.join("single");
    run(model, 1, args(model, &corpus, &single, "2"), extra);
    assert_eq!(step_losses(&single).len(), 5);
    for (name, ranks, accum, flags) in layouts {
        let label = format!("{model} {name}");
        let out = dir.join(name);
        let all: Vec<&str> = extra.iter().chain(flags.iter()).copied().collect();
        run(&label, *ranks, args(model, &corpus, &out, accum), &all);
        check_steps(&label, &out, &single, 1e-5);
        check_weights(&label, &out, &single, MODEL_TOLERANCE, TENSOR_TOLERANCE);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gpt_cp2_cp2_dp2_zero1_and_cp2_pp2_with_goldfish_equal_single_rank() {
    if !mpi_built() {
        return;
    }
    cp_matches_single_rank(
        "gpt-mini",
        &["--goldfish-k", "3"],
        &[
            ("cp2", 2, "2", &["--cp", "2"]),
            ("cp2-dp2-zero1", 4, "1", &["--cp", "2", "--zero", "1"]),
            ("cp2-pp2", 4, "2", &["--cp", "2", "--pp", "2"]),
        ],
    );
}

#[test]
fn llama_cp2_cp2_dp2_zero3_cp2_tp2_sp_and_cp2_pp2_equal_single_rank() {
    if !mpi_built() {
        return;
    }
    cp_matches_single_rank(
        "llama-mini",
        &[],
        &[
            ("cp2", 2, "2", &["--cp", "2"]),
            ("cp2-dp2-zero3", 4, "1", &["--cp", "2", "--zero", "3"]),
            ("cp2-tp2-sp", 4, "2", &["--cp", "2", "--tp", "2", "--sp"]),
            ("cp2-pp2", 4, "2", &["--cp", "2", "--pp", "2"]),
        ],
    );
}

#[test]
fn bloom_cp2_and_cp2_pp2_equal_single_rank() {
    if !mpi_built() {
        return;
    }
    cp_matches_single_rank(
        "bloom-mini",
        &[],
        &[
            ("cp2", 2, "2", &["--cp", "2"]),
            ("cp2-pp2", 4, "2", &["--cp", "2", "--pp", "2"]),
        ],
    );
}
