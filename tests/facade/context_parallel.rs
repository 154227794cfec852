//! Context parallelism through `Job`: for the GPT (with the goldfish
//! loss's mask split over the ring), Llama (grouped-query attention) and
//! BLOOM (ALiBi) minis, jobs with cp2 (2 ranks), for gpt-mini and
//! llama-mini cp2 x dp2 under ZeRO-1 and ZeRO-3, for llama-mini cp2 + tp2
//! with sequence parallelism, and for all three cp2 x pp2 (1F1B: each
//! stage's ring passes its chunks' hidden states to the same ring rank of
//! the next stage; 4 ranks) equal the one-rank job on the same global
//! batch (4 sequences of 32 tokens, 4 chunks of 8 on a ring of 2) after 5
//! steps: every step's loss and gradient norm within 1e-5 relative, and
//! the weights within the TP bounds (the step-1 gradients are compared
//! per tensor at 1e-5 in the job crate's `gradients_parallel`), and their
//! MFU per device and gradient-sync record consistent with their ranks.
//!
//! Two `mpirun` launches of this binary's workers (2 ranks: 3 jobs; 4
//! ranks: 6, then `bf16_curve`'s 100-step bf16 llama-mini cp2 x tp2 + SP
//! job, compared here with its own one-rank job); the one-rank jobs run
//! in the test's process.

use std::path::Path;

use ferrotron::parallel::zero::ZeroStage;
use ferrotron::JobConfig;

use crate::bf16_curve;
use crate::equivalence::jobs::{launch, mpi_built, run_on_every_rank, runs_dir, scratch};
use crate::equivalence::layouts::{jobs_on, layout_run, plain, run_one_rank, Layout, ModelLayouts};
use ferrotron_test_support::runs::{check_steps, check_weights, step_records};

/// Largest difference between the runs' weights after 5 steps, relative
/// to the one-rank run's largest weight, and within each tensor relative
/// to its own largest: the bounds of `tensor_parallel`, whose rounding
/// (sums in another order, amplified by AdamW where a gradient is at
/// rounding level) is the kind the ring adds (its blocks' partial softmax
/// sums merge by log-sum-exp in another order than one rank's).
const MODEL_TOLERANCE: f32 = crate::tensor_parallel::MODEL_TOLERANCE;
/// See [`MODEL_TOLERANCE`].
const TENSOR_TOLERANCE: f32 = crate::tensor_parallel::TENSOR_TOLERANCE;

/// cp2 on 2 ranks, grad-accum 2.
const CP2: Layout = Layout {
    name: "cp2",
    ranks: 2,
    accum: 2,
    set: |c| c.parallelism.cp = 2,
};

/// cp2 x pp2 on 4 ranks, grad-accum 2.
const CP2_PP2: Layout = Layout {
    name: "cp2-pp2",
    ranks: 4,
    accum: 2,
    set: |c| {
        c.parallelism.cp = 2;
        c.parallelism.pp = 2;
    },
};

/// The goldfish loss (k = 3) of gpt-mini's jobs.
fn goldfish(c: &mut JobConfig) {
    c.data.goldfish_k = Some(3);
}

/// A cp2 x dp2 layout on 4 ranks, grad-accum 1.
fn cp2_dp2(name: &'static str, set: fn(&mut JobConfig)) -> Layout {
    Layout {
        name,
        ranks: 4,
        accum: 1,
        set,
    }
}

/// Each mini, what every one of its jobs sets, and its layouts.
fn models() -> Vec<ModelLayouts> {
    let gpt = vec![
        CP2,
        cp2_dp2("cp2-dp2-zero1", |c| {
            c.parallelism.cp = 2;
            c.parallelism.zero = ZeroStage::One;
        }),
        CP2_PP2,
    ];
    let llama = vec![
        CP2,
        cp2_dp2("cp2-dp2-zero3", |c| {
            c.parallelism.cp = 2;
            c.parallelism.zero = ZeroStage::Three;
        }),
        Layout {
            name: "cp2-tp2-sp",
            ranks: 4,
            accum: 2,
            set: |c| {
                c.parallelism.cp = 2;
                c.parallelism.tp = 2;
                c.parallelism.sp = true;
            },
        },
        CP2_PP2,
    ];
    vec![
        ("gpt-mini", goldfish, gpt),
        ("llama-mini", plain, llama),
        ("bloom-mini", plain, vec![CP2, CP2_PP2]),
    ]
}

/// The layout's rates are per device and its gradient sync is recorded:
/// every job's peak is 1 TFLOP/s, so a step's `mfu / tokens_per_s` is the
/// model's FLOPs per token over the ranks, `1 / ranks` of the one-rank
/// run's; and the gradients, reduced
/// over DP x CP, record their communication (`grad_comm`) though dp may
/// be 1.
fn check_device_rates(label: &str, out: &Path, single: &Path, ranks: usize) {
    let per_token = |run: &Path| -> Vec<f64> {
        step_records(run)
            .iter()
            .map(|r| r["mfu"].as_f64().unwrap() / r["tokens_per_s"].as_f64().unwrap())
            .collect()
    };
    let (got, want) = (per_token(out), per_token(single));
    assert!(
        !got.is_empty() && got.len() == want.len(),
        "{label}: {} steps, {} on one rank",
        got.len(),
        want.len()
    );
    for (got, want) in got.iter().zip(want) {
        assert!(
            (got * ranks as f64 / want - 1.0).abs() < 1e-9,
            "{label}: mfu per token/s {got} on {ranks} ranks, {want} on one"
        );
    }
    assert!(
        step_records(out)
            .iter()
            .all(|r| r.get("grad_comm").is_some()),
        "{label}: a step without grad_comm"
    );
}

#[test]
fn cp2_cp2_dp2_cp2_tp2_sp_and_cp2_pp2_jobs_equal_the_one_rank_job_and_bf16_follows_it() {
    if !mpi_built() {
        return;
    }
    let runs = scratch("cp");
    let models = models();
    let singles: Vec<_> = models
        .iter()
        .map(|(model, extra, _)| run_one_rank(model, &runs, 2, *extra))
        .collect();
    let bf16_single = bf16_curve::run_one_rank(&runs);
    launch(2, "context_parallel::worker_on_2_ranks", &runs);
    launch(4, "context_parallel::worker_on_4_ranks", &runs);
    for ((model, _, layouts), single) in models.iter().zip(&singles) {
        for layout in layouts {
            let label = format!("{model} {}", layout.name);
            let out = layout_run(model, &runs, layout);
            check_steps(&label, &out, single, 1e-5);
            check_weights(&label, &out, single, MODEL_TOLERANCE, TENSOR_TOLERANCE);
            check_device_rates(&label, &out, single, layout.ranks);
        }
    }
    bf16_curve::check(&runs, &bf16_single);
    let _ = std::fs::remove_dir_all(&runs);
}

/// Every rank of the 2-rank jobs; run only under mpirun by the test above.
#[test]
#[ignore = "runs under mpirun, started by cp2_cp2_dp2_cp2_tp2_sp_and_cp2_pp2_jobs_equal_the_one_rank_job_and_bf16_follows_it"]
fn worker_on_2_ranks() {
    run_on_every_rank(jobs_on(2, &runs_dir(), &models()));
}

/// Every rank of the 4-rank jobs; run only under mpirun by the test above.
#[test]
#[ignore = "runs under mpirun, started by cp2_cp2_dp2_cp2_tp2_sp_and_cp2_pp2_jobs_equal_the_one_rank_job_and_bf16_follows_it"]
fn worker_on_4_ranks() {
    let runs = runs_dir();
    let mut jobs = jobs_on(4, &runs, &models());
    jobs.extend(bf16_curve::jobs_on_4_ranks(&runs));
    run_on_every_rank(jobs);
}
