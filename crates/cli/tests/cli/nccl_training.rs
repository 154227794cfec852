//! `ferrotron train --comm nccl`: the CPU training path through the NCCL
//! communicator and the real binding, on the NCCL test double
//! (`crates/nccl-double`, loaded through `FERROTRON_NCCL_LIBRARY`). Data
//! parallelism on 2 ranks, with ZeRO 0, 1 and 3, tensor parallelism
//! (`--tp 2`) and pipeline parallelism (`--pp 2`, 1F1B: activations and
//! their gradients as grouped `ncclSend`/`ncclRecv`, the GPT mini's tied
//! embedding summed over the first and last stage) equal the one-rank run
//! on the same global batch (the tolerances of the facade's equivalence
//! tests: tests/facade/{data,tensor,pipeline}_parallel.rs); `--comm nccl` without
//! a usable library is refused before anything is written.
//!
//! The multi-rank tests need the `mpi` feature (which also builds the
//! double) and Open MPI's `mpirun`; without the feature they are skipped
//! with a printed reason, with it a missing `mpirun` or double is a
//! failure. A run still going after its deadline is killed and fails the
//! test (a hang).

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common;
use crate::mpirun;
use ferrotron_test_support::deadline;
use ferrotron_test_support::nccl_double;
use ferrotron_test_support::skip::skip;

use common::{corpus, max_weight_rel_err, scratch, step_losses};
use mpirun::{ferrotron_on, RunFlags, DEADLINE};

/// Runs `ferrotron train` with `args` on `ranks` processes (1: no mpirun),
/// with `FERROTRON_NCCL_LIBRARY` set to `library` if given.
fn train(ranks: usize, args: &[&str], library: Option<&Path>) -> Output {
    let mut cmd = ferrotron_on(ranks, &["FERROTRON_NCCL_LIBRARY"]);
    cmd.env_remove("FERROTRON_NCCL_LIBRARY");
    if let Some(lib) = library {
        cmd.env("FERROTRON_NCCL_LIBRARY", lib);
    }
    cmd.arg("train").args(args);
    deadline::output_within(&mut cmd, DEADLINE).unwrap_or_else(|e| {
        panic!("could not start {cmd:?} (is Open MPI's mpirun installed?): {e}")
    })
}

/// Everything a run printed.
fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Trains `model` on one rank (MPI's default transport, grad-accum 2), then
/// on 2 ranks through NCCL with ZeRO 0, 1 and 3 (grad-accum 1: the same
/// global batch of 4 sequences), `--tp 2` and `--pp 2` (grad-accum 2), and
/// compares losses and weights.
fn dp2_through_nccl_matches_single_rank(model: &str) {
    if !cfg!(feature = "mpi") {
        skip("ferrotron was built without the `mpi` feature; run `cargo test -p ferrotron-cli --features mpi`");
        return;
    }
    let lib = nccl_double::library();
    let dir = scratch(&format!("nccl-{model}"));
    let corpus = corpus(&dir);
    let run = |ranks: usize, zero: u64, tp: &str, pp: &str| -> PathBuf {
        let out = dir.join(format!("np{ranks}-zero{zero}-tp{tp}-pp{pp}"));
        // The same global batch of 4 sequences: 2 x grad-accum over dp ranks.
        let dp = ranks / tp.parse::<usize>().unwrap() / pp.parse::<usize>().unwrap();
        let accum = (2 / dp).to_string();
        let zero = zero.to_string();
        let flags = RunFlags {
            accum: Some(&accum),
            ..RunFlags::new(model, &corpus, &out, "5")
        }
        .args();
        let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
        args.extend(["--zero", &zero, "--tp", tp, "--pp", pp]);
        if ranks > 1 {
            args.extend(["--comm", "nccl"]);
        }
        let o = train(ranks, &args, (ranks > 1).then_some(lib.as_path()));
        assert!(
            o.status.success(),
            "{model} on {ranks} ranks, zero {zero}:\n{}",
            text(&o)
        );
        out
    };
    let single = run(1, 0, "1", "1");
    let want: Vec<f64> = step_losses(&single).into_iter().map(|(_, l)| l).collect();
    assert_eq!(want.len(), 5);
    // The tolerances of tests/facade/data_parallel.rs, for tp2 the
    // whole-model weight tolerance of tests/facade/tensor_parallel.rs (TP
    // reorders sums; see there) and for pp2 pipeline_parallel.rs's.
    for (zero, tp, pp, weights) in [
        (0, "1", "1", 1e-5),
        (1, "1", "1", 1e-5),
        (3, "1", "1", 1e-5),
        (0, "2", "1", 1e-4),
        (0, "1", "2", 1e-5),
    ] {
        let out = run(2, zero, tp, pp);
        let got: Vec<f64> = step_losses(&out).into_iter().map(|(_, l)| l).collect();
        assert_eq!(got.len(), want.len());
        for (step, (g, w)) in got.iter().zip(&want).enumerate() {
            let rel = (g - w).abs() / w.abs();
            assert!(
                rel <= 1e-5,
                "{model} nccl np2 zero {zero} tp {tp} pp {pp} step {}: loss {g} vs {w} (rel {rel:e})",
                step + 1
            );
        }
        let rel = max_weight_rel_err(&out, &single);
        eprintln!(
            "{model} nccl np2 zero {zero} tp {tp} pp {pp}: max relative weight error {rel:e}"
        );
        assert!(
            rel <= weights,
            "{model} nccl np2 zero {zero} tp {tp} pp {pp}: weights differ, relative error {rel:e}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gpt_dp2_zero_1_3_tp2_and_pp2_through_nccl_equal_single_rank() {
    dp2_through_nccl_matches_single_rank("gpt-mini");
}

#[test]
fn llama_dp2_zero_1_3_tp2_and_pp2_through_nccl_equal_single_rank() {
    dp2_through_nccl_matches_single_rank("llama-mini");
}

/// `--comm nccl` on the CPU backend without `FERROTRON_NCCL_LIBRARY`, and
/// with it naming a file that does not exist: exit 2, one line naming the
/// problem, no run directory.
#[test]
fn comm_nccl_without_a_usable_library_exits_2_before_writing() {
    let dir = scratch("nccl-refused");
    let out = dir.join("run");
    let missing = dir.join("libnccl.so.2");
    for library in [None, Some(missing.as_path())] {
        let o = train(
            1,
            &[
                "--comm",
                "nccl",
                "--steps",
                "1",
                "--out",
                out.to_str().unwrap(),
            ],
            library,
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        match library {
            None => assert!(
                err.contains("--comm nccl with --backend flex")
                    && err.contains("FERROTRON_NCCL_LIBRARY"),
                "{err}"
            ),
            Some(path) => assert!(
                err.contains(&format!("FERROTRON_NCCL_LIBRARY={}", path.display())),
                "{err}"
            ),
        }
        assert!(!out.exists(), "{} was written", out.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
