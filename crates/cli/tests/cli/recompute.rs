//! `ferrotron train --recompute`: the refused combinations, and the
//! metrics of each mode (peak activation bytes, FLOPs counting the
//! recomputation).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ferrotron_test_support::corpus::write_words;
use ferrotron_test_support::deadline;

use crate::common;

use common::{scratch, step_records};

fn ferrotron(args: &[&str]) -> Output {
    deadline::output(Command::new(env!("CARGO_BIN_EXE_ferrotron")).args(args))
}

/// A corpus of a few thousand words (a tokenizer of 300 trains in well
/// under a second).
fn corpus(dir: &Path) -> PathBuf {
    let words = [
        "the", "cat", "sat", "on", "a", "mat", "while", "dogs", "ran", "under", "bright", "stars",
        "and", "quiet", "rivers", "sang", "of", "old", "kings",
    ];
    let path = dir.join("corpus.txt");
    write_words(&path, &words, 8000);
    path
}

#[test]
fn refused_combinations_name_the_flags_and_write_nothing() {
    let dir = scratch("recompute-refused");
    let out = dir.join("run");
    let o = out.to_str().unwrap();
    // (flags, needles, lines): every problem is one line; on one rank a
    // pipeline of 2 stages is a second problem.
    for (args, needles, lines) in [
        (
            vec!["--recompute", "none", "--zero", "3"],
            vec!["--recompute none", "--zero 3", "--recompute full"],
            1,
        ),
        (
            vec!["--recompute", "selective", "--zero", "3"],
            vec!["--recompute selective", "--zero 3"],
            1,
        ),
        (
            vec!["--recompute", "full", "--pp", "2"],
            vec![
                "parallelism.recompute: --recompute full with --pp 2",
                "none or selective",
                "world size 1 is not divisible by --tp 1 x --pp 2",
            ],
            2,
        ),
    ] {
        let mut all = vec!["train", "--out", o];
        all.extend(&args);
        let r = ferrotron(&all);
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), lines, "{err}");
        for n in needles {
            assert!(err.contains(n), "{args:?}: '{err}' lacks '{n}'");
        }
        assert!(!out.exists(), "{args:?} wrote {}", out.display());
    }
}

/// FLOPs per token of gpt-mini (hidden 192, 4 layers, GELU 4h, tied head)
/// with vocabulary `v` at sequence `s`, written out from Megatron's
/// counting: `3x` the forward (`2` FLOPs per weight, `4 s h` for the
/// attention per layer), plus the recomputed forward.
fn gpt_mini_flops(v: f64, s: f64, mode: &str) -> f64 {
    let (h, l) = (192.0, 4.0);
    let block = 12.0 * h * h;
    let forward_block = 2.0 * block + 4.0 * s * h;
    let base = 3.0 * (l * forward_block + 2.0 * h * v);
    match mode {
        "none" => base,
        "selective" => base + l * 4.0 * s * h,
        "full" => base + l * forward_block,
        _ => unreachable!(),
    }
}

#[test]
fn each_mode_records_its_peak_activation_bytes_and_counts_its_flops() {
    let dir = scratch("recompute-modes");
    let corpus = corpus(&dir);
    let mut peaks = Vec::new();
    // Burn's reference attention in the three modes, then flex's
    // host-buffer attention (the default kernels), which keeps no score
    // matrices under `none` either.
    let runs = [
        ("none", "reference"),
        ("selective", "reference"),
        ("full", "reference"),
        ("none", "default"),
    ];
    for (mode, kernels) in runs {
        let out = dir.join(format!("{mode}-{kernels}"));
        let kernel_flags = match kernels {
            "reference" => vec!["--kernels", "reference"],
            _ => vec![],
        };
        let r = ferrotron(
            &[
                "train",
                "--model",
                "gpt-mini",
                "--corpus",
                corpus.to_str().unwrap(),
                "--vocab-size",
                "300",
                "--seq-len",
                "128",
                "--micro-batch",
                "4",
                "--steps",
                "2",
                "--eval-every",
                "2",
                "--eval-batches",
                "1",
                "--sample-tokens",
                "0",
                "--peak-tflops",
                "1",
                "--recompute",
                mode,
                "--out",
                out.to_str().unwrap(),
            ]
            .into_iter()
            .chain(kernel_flags)
            .collect::<Vec<_>>(),
        );
        let stdout = String::from_utf8_lossy(&r.stdout);
        assert!(
            r.status.success(),
            "{mode}: {stdout}\n{}",
            String::from_utf8_lossy(&r.stderr)
        );
        assert!(stdout.contains(&format!("recompute {mode}")), "{stdout}");
        let steps = step_records(&out);
        assert_eq!(steps.len(), 2);
        let last = &steps[1];
        let peak = last["peak_activation_bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("{mode}: no peak_activation_bytes in {last}"));
        let flops = last["tflops_per_device"].as_f64().unwrap() * 1e12
            / last["tokens_per_s"].as_f64().unwrap();
        let want = gpt_mini_flops(300.0, 128.0, mode);
        assert!(
            (flops / want - 1.0).abs() < 1e-6,
            "{mode}: {flops} FLOPs per token, want {want}"
        );
        println!("{mode}, {kernels} kernels: peak activation {peak} bytes");
        peaks.push(peak);
    }
    // Selective drops the [4, 6, 128, 128] score matrices of every layer;
    // full keeps one block's input per block (plus one block rebuilt); the
    // host-buffer attention drops them too.
    assert!(
        peaks[2] < peaks[1] && peaks[1] < peaks[0] && peaks[3] < peaks[0],
        "none, selective, full (reference), none (default): {peaks:?}"
    );
}
