//! Running `ferrotron train` on several ranks under Open MPI's `mpirun`
//! (oversubscribed: the tests share 2 cores), killed after a deadline.
//! Included by the multi-rank test files (`#[path]`), whose crate root
//! declares the `deadline` module.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use ferrotron_test_support::deadline;
use ferrotron_test_support::skip::skip;

/// When a training run that never ends is killed: far beyond a normal run,
/// even on 2 shared cores.
pub const DEADLINE: Duration = Duration::from_secs(900);

/// `false` (and a printed reason) when the binary has no MPI support.
pub fn mpi_built() -> bool {
    if !cfg!(feature = "mpi") {
        skip("ferrotron was built without the `mpi` feature; run `cargo test -p ferrotron-cli --features mpi`");
    }
    cfg!(feature = "mpi")
}

/// Runs `ferrotron train` with `args` on `ranks` processes (1: no mpirun).
pub fn train(ranks: usize, args: &[&str]) -> Output {
    train_within(ranks, args, DEADLINE)
}

/// The command that starts the `ferrotron` binary on `ranks` processes:
/// the binary itself for 1, else `mpirun` (oversubscribed), which passes
/// the environment variables named in `exports` on to every rank.
pub fn ferrotron_on(ranks: usize, exports: &[&str]) -> Command {
    let bin = env!("CARGO_BIN_EXE_ferrotron");
    if ranks == 1 {
        return Command::new(bin);
    }
    let mut c = Command::new("mpirun");
    c.args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(ranks.to_string());
    for name in exports {
        c.args(["-x", name]);
    }
    c.arg(bin);
    c
}

/// `train`, killed and failing the test after `deadline`.
pub fn train_within(ranks: usize, args: &[&str], deadline: Duration) -> Output {
    let bin = env!("CARGO_BIN_EXE_ferrotron");
    let mut cmd = ferrotron_on(ranks, &[]);
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

/// The flags of a small training run: `model` with `--vocab-size 300` on
/// `corpus`, micro-batches of 2 sequences of 32 tokens, no samples,
/// `--peak-tflops 1`, into `out`; the schedule is the fields'.
pub struct RunFlags<'a> {
    /// `--model`.
    pub model: &'a str,
    /// `--corpus`.
    pub corpus: &'a Path,
    /// `--out`.
    pub out: &'a Path,
    /// `--steps`.
    pub steps: &'a str,
    /// `--grad-accum`; `None` leaves it out (the default, 1).
    pub accum: Option<&'a str>,
    /// `--eval-every`.
    pub eval_every: &'a str,
    /// `--eval-batches`.
    pub eval_batches: &'a str,
    /// `--save-every`; `None` leaves it out (no checkpoints).
    pub save_every: Option<&'a str>,
}

impl<'a> RunFlags<'a> {
    /// `steps` steps of `model` into `out`, evaluated on 2 batches after
    /// the last, no `--grad-accum`, no checkpoints.
    pub fn new(model: &'a str, corpus: &'a Path, out: &'a Path, steps: &'a str) -> Self {
        Self {
            model,
            corpus,
            out,
            steps,
            accum: None,
            eval_every: steps,
            eval_batches: "2",
            save_every: None,
        }
    }

    /// The command-line flags.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "--model",
            self.model,
            "--vocab-size",
            "300",
            "--corpus",
            self.corpus.to_str().unwrap(),
            "--seq-len",
            "32",
            "--micro-batch",
            "2",
            "--steps",
            self.steps,
        ];
        if let Some(accum) = self.accum {
            args.extend(["--grad-accum", accum]);
        }
        args.extend(["--eval-every", self.eval_every]);
        if let Some(every) = self.save_every {
            args.extend(["--save-every", every]);
        }
        args.extend([
            "--eval-batches",
            self.eval_batches,
            "--sample-tokens",
            "0",
            "--peak-tflops",
            "1",
            "--out",
            self.out.to_str().unwrap(),
        ]);
        args.into_iter().map(String::from).collect()
    }
}

/// The training flags of the multi-rank equivalence runs of `model`: 5
/// steps of 2 sequences x `accum` micro-batches of 32 tokens, `--vocab-size
/// 300`, evaluation at step 5, a checkpoint at step 3, run directory `out`.
pub fn equivalence_args(model: &str, corpus: &Path, out: &Path, accum: &str) -> Vec<String> {
    RunFlags {
        accum: Some(accum),
        save_every: Some("3"),
        ..RunFlags::new(model, corpus, out, "5")
    }
    .args()
}

/// Runs `ferrotron train` on `ranks` with `args` plus `extra`; fails the
/// test, naming `label`, if it fails; else returns its output.
pub fn run(label: &str, ranks: usize, args: Vec<String>, extra: &[&str]) -> Output {
    let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
    all.extend(extra);
    let o = train(ranks, &all);
    assert!(
        o.status.success(),
        "{label} failed:\n{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}
