//! The goldfish loss (about one target in 3 dropped, hashed on the 5
//! tokens before it) under the parallel layouts that change how its mask
//! meets the model: for gpt-mini, jobs with dp2 under ZeRO-3 (the
//! unit-by-unit step; grad-accum 2), tp2 with sequence parallelism (the
//! vocabulary-parallel loss) and pp2 (1F1B; grad-accum 4) equal the
//! one-rank goldfish job on the same global batch (8 sequences: 2 per
//! micro-batch, grad-accum 4) after 5 steps: the same kept tokens and
//! per-micro-batch means, so every step's loss and gradient norm within
//! 1e-5 relative, and the weights within the bounds of the layout's own
//! test (model-wide, per tensor): dp2 ZeRO-3 1e-5 and 2e-5
//! (`pipeline_parallel`'s DP bound), tp2 + SP 1e-4 and 5e-3
//! (`tensor_parallel`'s), pp2 1e-5 and 1e-5. Goldfish under context
//! parallelism (the mask split over the ring) is in `context_parallel`.
//!
//! No launch of its own: `pipeline_parallel`'s 2-rank launch, whose
//! global batch is the same, runs these jobs after its own and its test
//! compares them; the one-rank job runs in the test's process.

use std::path::{Path, PathBuf};

use ferrotron::parallel::zero::ZeroStage;
use ferrotron::JobConfig;
use ferrotron_test_support::runs::{check_steps, check_weights, step_records};

use crate::equivalence::jobs::run_single;
use crate::equivalence::layouts::{layout_job, layout_run, Layout, ModelLayouts};

/// The mini trained.
const MODEL: &str = "gpt-mini";

/// The goldfish loss of every job: k = 3 over a 5-token context.
fn goldfish(c: &mut JobConfig) {
    c.data.goldfish_k = Some(3);
    c.data.goldfish_context = 5;
}

/// The one-rank job: grad-accum 4.
const SINGLE: Layout = Layout {
    name: "goldfish-single",
    ranks: 1,
    accum: 4,
    set: |_| {},
};

/// Every multi-rank layout, with its bounds on the weights' difference
/// relative to the model's largest weight and to each tensor's own.
fn cases() -> [(Layout, f32, f32); 3] {
    [
        (
            Layout {
                name: "goldfish-dp2-zero3",
                ranks: 2,
                accum: 2,
                set: |c| c.parallelism.zero = ZeroStage::Three,
            },
            1e-5,
            2e-5,
        ),
        (
            Layout {
                name: "goldfish-tp2-sp",
                ranks: 2,
                accum: 4,
                set: |c| {
                    c.parallelism.tp = 2;
                    c.parallelism.sp = true;
                },
            },
            1e-4,
            5e-3,
        ),
        (
            Layout {
                name: "goldfish-pp2",
                ranks: 2,
                accum: 4,
                set: |c| c.parallelism.pp = 2,
            },
            1e-5,
            1e-5,
        ),
    ]
}

/// The mini and its goldfish layouts, for a worker's jobs.
pub fn models() -> Vec<ModelLayouts> {
    let layouts = cases().iter().map(|(l, ..)| *l).collect();
    vec![(MODEL, goldfish, layouts)]
}

/// Runs the one-rank goldfish job in this process; returns its run
/// directory.
pub fn run_one_rank(runs: &Path) -> PathBuf {
    run_single(
        "gpt-mini goldfish",
        layout_job(MODEL, runs, &SINGLE, goldfish),
    )
}

/// Compares the goldfish runs in `runs` with the one-rank run `single`
/// (see the module doc).
pub fn check(runs: &Path, single: &Path) {
    assert_eq!(step_records(single).len(), 5, "{MODEL} goldfish: steps");
    for (layout, model_tolerance, tensor_tolerance) in cases() {
        let label = format!("{MODEL} {}", layout.name);
        let out = layout_run(MODEL, runs, &layout);
        check_steps(&label, &out, single, 1e-5);
        check_weights(&label, &out, single, model_tolerance, tensor_tolerance);
    }
}
