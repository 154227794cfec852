//! Training from a Hugging Face model directory (`model.hf_dir`: the
//! committed gpt2 fixture of `scripts/make_hf_fixtures.py`) under
//! tp2 x pp2: each of the 4 ranks reads its part of the directory, and the
//! job equals the one-rank job from the same directory after 2 steps
//! (global batch 2 sequences of 16 tokens): losses and gradient norms
//! within 1e-5 relative, each tensor within `tensor_parallel`'s 5e-3 of
//! its own largest weight (measured: 6.6e-8). The whole-model bound is
//! 5e-3, not `tensor_parallel`'s 1e-4: the attention key biases, whose
//! gradient is only rounding noise that AdamW turns into steps of the
//! learning rate (`ferrotron_test_support::runs`' noise-only tensors),
//! move by more than 1e-4 of this fixture's small weights (measured:
//! 9.0e-4). Both jobs also export (`checkpoint.hf_out`).
//!
//! No launch of its own: `pipeline_parallel`'s 4-rank launch runs the job
//! after its own and its test compares it; the one-rank job runs in the
//! test's process. `ferrotron train --hf-dir` on one rank, its export and
//! `eval` of the result are tested in the `cli` binary (`hf`).

use std::path::{Path, PathBuf};

use ferrotron::JobConfig;
use ferrotron_test_support::runs::{check_steps, check_weights};

use crate::equivalence::jobs::run_single;

/// Largest difference of the tp2 x pp2 run's weights, relative to the
/// one-rank run's largest weight of the whole model (see the module doc).
const MODEL_TOLERANCE: f32 = 5e-3;

/// Largest difference within one tensor, relative to its own largest
/// weight (`tensor_parallel`'s `TENSOR_TOLERANCE`).
const TENSOR_TOLERANCE: f32 = 5e-3;

/// The gpt2 fixture's model directory.
fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/models/tests/fixtures/hf/gpt2/model")
}

/// The corpus of the jobs in `runs`: one line of words the fixture's
/// tokenizer knows, 200 times.
fn corpus(runs: &Path) -> PathBuf {
    runs.join("hf-corpus.txt")
}

/// The job from the fixture on `tp` x `pp` ranks into `runs/name` (and
/// its export into `runs/name-hf`): 2 steps of one micro-batch of 2
/// sequences of 16 tokens, validated on one batch after the last, no
/// sample, an MFU peak of 1 TFLOP/s.
fn job(runs: &Path, name: &str, tp: usize, pp: usize) -> JobConfig {
    let mut c = JobConfig::default();
    c.model.hf_dir = Some(fixture());
    c.data.corpus = Some(corpus(runs));
    c.schedule.steps = 2;
    c.schedule.seq_len = 16;
    c.schedule.micro_batch = 2;
    c.schedule.eval_every = 2;
    c.schedule.eval_batches = 1;
    c.metrics.sample_tokens = 0;
    c.metrics.peak_tflops = Some(1.0);
    c.checkpoint.out = Some(runs.join(name));
    c.checkpoint.hf_out = Some(runs.join(format!("{name}-hf")));
    c.parallelism.tp = tp;
    c.parallelism.pp = pp;
    c
}

/// The run directory of the tp2 x pp2 job.
const SPLIT: &str = "hf-gpt2-tp2-pp2";

/// Writes the corpus and runs the one-rank job in this process; returns
/// its run directory.
pub fn run_one_rank(runs: &Path) -> PathBuf {
    let text = "the king of love and the queen , my lord .\n".repeat(200);
    std::fs::write(corpus(runs), text).unwrap();
    run_single("gpt2 --hf-dir", job(runs, "hf-gpt2-single", 1, 1))
}

/// The tp2 x pp2 job, for the 4-rank worker.
pub fn jobs(runs: &Path) -> Vec<(String, JobConfig)> {
    vec![("gpt2 --hf-dir tp2 x pp2".into(), job(runs, SPLIT, 2, 2))]
}

/// Compares the tp2 x pp2 run in `runs` with the one-rank run `single`.
pub fn check(runs: &Path, single: &Path) {
    let label = "gpt2 --hf-dir tp2 x pp2";
    let split = runs.join(SPLIT);
    check_steps(label, &split, single, 1e-5);
    check_weights(label, &split, single, MODEL_TOLERANCE, TENSOR_TOLERANCE);
}
