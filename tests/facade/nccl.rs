//! The CPU training path through the NCCL communicator and its run-time
//! binding, on the NCCL test double (`crates/nccl-double`, named by
//! `FERROTRON_NCCL_LIBRARY`): for the GPT and Llama minis, jobs with
//! `parallelism.comm = "nccl"` on 2 ranks (data parallelism under ZeRO 0,
//! 1 and 3, grad-accum 1; tp2, tp2 with sequence parallelism and pp2,
//! grad-accum 2: pp2 sends activations and their gradients as grouped
//! `ncclSend`/`ncclRecv` and sums the GPT mini's tied embedding over the
//! first and last stage; cp2, grad-accum 2: the ring attention passes
//! its K/V and `dk`, `dv` sums as device tensors,
//! `RingAttention::with_device`; the gradient sync takes the device path,
//! `Trainer::sync_on_device`, and the TP operators theirs,
//! `TpGroup::with_device`, on the double's host memory) equal the
//! one-rank job on the same global batch (4 sequences) after 5 steps:
//! - every step's loss and gradient norm within 1e-5 relative;
//! - the weights within 1e-5 of the model's largest weight (tp2, cp2:
//!   `tensor_parallel`'s whole-model bound, 1e-4; TP and the ring reorder
//!   sums);
//! - and the TP jobs equal `tensor_parallel`'s same jobs over MPI (its
//!   `tp2` and `tp2-sp`) bit for bit: every loss, gradient norm and
//!   weight, so the device path computes what the host path does.
//!
//! No launch of its own: `tensor_parallel`'s 2-rank launch runs these jobs
//! after its own (on an NCCL communicator over the launch's MPI world,
//! [`crate::equivalence::jobs::run_on_every_rank`]), and its test, whose
//! one-rank jobs have the same global batch, compares them. That
//! `ferrotron train --comm nccl` without a usable library is refused is
//! tested in the `cli` binary.

use std::path::Path;

use ferrotron::job::config::CommChoice;
use ferrotron::parallel::comm::nccl::LIBRARY_ENV;
use ferrotron::parallel::zero::ZeroStage;
use ferrotron::JobConfig;
use ferrotron_test_support::nccl_double;
use ferrotron_test_support::runs::{
    check_steps, loss_and_norm, max_weight_rel_err, weights as weights_of,
};

use crate::equivalence::layouts::{layout_run, plain, Layout, ModelLayouts};

/// The minis trained through NCCL.
pub const MODELS: [&str; 2] = ["gpt-mini", "llama-mini"];

/// A layout of 2 ranks through NCCL with grad-accum `accum`.
fn nccl(name: &'static str, accum: usize, set: fn(&mut JobConfig)) -> Layout {
    Layout {
        name,
        ranks: 2,
        accum,
        set,
    }
}

/// Every layout, with its bound on the weights' largest difference
/// relative to the one-rank job's largest weight.
fn cases() -> [(Layout, f64); 7] {
    [
        (
            nccl("nccl-dp2-zero0", 1, |c| {
                c.parallelism.comm = CommChoice::Nccl;
            }),
            1e-5,
        ),
        (
            nccl("nccl-dp2-zero1", 1, |c| {
                c.parallelism.comm = CommChoice::Nccl;
                c.parallelism.zero = ZeroStage::One;
            }),
            1e-5,
        ),
        (
            nccl("nccl-dp2-zero3", 1, |c| {
                c.parallelism.comm = CommChoice::Nccl;
                c.parallelism.zero = ZeroStage::Three;
            }),
            1e-5,
        ),
        (
            nccl("nccl-tp2", 2, |c| {
                c.parallelism.comm = CommChoice::Nccl;
                c.parallelism.tp = 2;
            }),
            // tensor_parallel's whole-model bound (MODEL_TOLERANCE).
            1e-4,
        ),
        (
            nccl("nccl-tp2-sp", 2, |c| {
                c.parallelism.comm = CommChoice::Nccl;
                c.parallelism.tp = 2;
                c.parallelism.sp = true;
            }),
            1e-4,
        ),
        (
            nccl("nccl-pp2", 2, |c| {
                c.parallelism.comm = CommChoice::Nccl;
                c.parallelism.pp = 2;
            }),
            1e-5,
        ),
        (
            nccl("nccl-cp2", 2, |c| {
                c.parallelism.comm = CommChoice::Nccl;
                c.parallelism.cp = 2;
            }),
            // context_parallel's whole-model bound (the TP one): the
            // ring's partial softmax sums merge in another order.
            1e-4,
        ),
    ]
}

/// Each mini and its NCCL layouts, for a worker's jobs.
pub fn models() -> Vec<ModelLayouts> {
    let layouts: Vec<Layout> = cases().iter().map(|(l, _)| *l).collect();
    MODELS
        .iter()
        .map(|&m| (m, plain as _, layouts.clone()))
        .collect()
}

/// The environment variable that names the double, for the launch that
/// runs these jobs (validation resolves `parallelism.comm = "nccl"` on a
/// CPU backend to the library it names).
pub fn library_env() -> (&'static str, String) {
    (LIBRARY_ENV, nccl_double::library().display().to_string())
}

/// Compares the NCCL runs of `model` with its one-rank run `single`, and
/// its TP runs with the same jobs over MPI in `runs` (see the module doc).
pub fn check(model: &str, runs: &Path, single: &Path) {
    for (layout, weights) in cases() {
        let label = format!("{model} {}", layout.name);
        let out = layout_run(model, runs, &layout);
        check_steps(&label, &out, single, 1e-5);
        let rel = max_weight_rel_err(&out, single);
        eprintln!("{label}: max relative weight error {rel:e}");
        assert!(
            rel <= weights,
            "{label}: weights differ, relative error {rel:e}"
        );
        let Some(mpi) = layout
            .name
            .strip_prefix("nccl-")
            .filter(|n| n.starts_with("tp2"))
        else {
            continue;
        };
        let over_mpi = runs.join(format!("{model}-{mpi}"));
        assert_eq!(
            loss_and_norm(&out),
            loss_and_norm(&over_mpi),
            "{label}: losses and gradient norms differ from {mpi} over MPI"
        );
        assert!(
            weights_of(&out) == weights_of(&over_mpi),
            "{label}: weights differ from {mpi} over MPI"
        );
    }
}
