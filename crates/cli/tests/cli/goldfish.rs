//! The goldfish loss from the command line: `--goldfish-k` / `--goldfish-context`
//! train, are recorded in the run and kept by `--resume`, leave the
//! validation loss unmasked, and bad values are refused. That goldfish
//! jobs under DP + ZeRO-3, TP + SP and PP equal the one-rank goldfish job
//! is tested through the library, in the facade's `goldfish` tests
//! (tests/facade/goldfish.rs). The ignored test
//! `goldfish_reproduces_fewer_training_continuations` is the memorisation
//! experiment of the README (minutes of CPU).

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use ferrotron_engine::data::{embedded_corpus, encode, split_lengths, Tokenizer};

use crate::common;

use common::{corpus, records, scratch, step_losses};

/// Longest one command may take before it is killed and fails the test.
const DEADLINE: Duration = Duration::from_secs(1800);

fn ferrotron(args: &[&str]) -> Output {
    common::ferrotron_within(args, DEADLINE)
}

fn succeeded(o: &Output) -> String {
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

/// A tiny GPT on `corpus` for `steps` steps into `out`, plus `extra` flags.
fn train(corpus: &Path, out: &Path, steps: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "train",
        "--model",
        "gpt-mini",
        "--vocab-size",
        "300",
        "--corpus",
        corpus.to_str().unwrap(),
        "--seq-len",
        "32",
        "--micro-batch",
        "4",
        "--steps",
        steps,
        "--eval-every",
        "2",
        "--eval-batches",
        "2",
        "--sample-tokens",
        "0",
        "--peak-tflops",
        "1",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    ferrotron(&args)
}

fn val_losses(run: &Path) -> Vec<f64> {
    records(run)
        .iter()
        .filter_map(|v| v.get("val_loss")?.as_f64())
        .collect()
}

#[test]
fn a_goldfish_run_trains_records_its_mask_and_validates_unmasked() {
    let dir = scratch("goldfish-run");
    let corpus = corpus(&dir);
    let plain = dir.join("plain");
    succeeded(&train(&corpus, &plain, "2", &[]));
    let fish = dir.join("fish");
    let stdout = succeeded(&train(
        &corpus,
        &fish,
        "2",
        &["--goldfish-k", "2", "--goldfish-context", "4"],
    ));
    assert!(
        stdout.contains(
            "goldfish loss: about 1 training target in 2 dropped, hashed on the 4 tokens before it"
        ),
        "{stdout}"
    );
    let config = std::fs::read_to_string(fish.join("config.toml")).unwrap();
    assert!(
        config.contains("goldfish_k = 2") && config.contains("goldfish_context = 4"),
        "{config}"
    );
    let plain_config = std::fs::read_to_string(plain.join("config.toml")).unwrap();
    assert!(!plain_config.contains("goldfish_k"), "{plain_config}");
    // The same seed, data and initial model: the step-0 validation (never
    // masked) is the same; the first training loss (over the kept targets
    // only) is not.
    let (p, f) = (val_losses(&plain), val_losses(&fish));
    assert_eq!(p[0], f[0]);
    let (p, f) = (step_losses(&plain), step_losses(&fish));
    assert_eq!((p.len(), f.len()), (2, 2));
    assert!(f.iter().all(|(_, l)| l.is_finite()));
    assert_ne!(p[0].1, f[0].1);

    // --resume keeps the mask and refuses to change it.
    let fish = fish.to_str().unwrap();
    let o = ferrotron(&[
        "train",
        "--resume",
        fish,
        "--steps",
        "4",
        "--override",
        "schedule.steps",
        "--goldfish-k",
        "3",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--goldfish-k") && err.trim_end().lines().count() == 1,
        "{err}"
    );
    let stdout = succeeded(&ferrotron(&[
        "train",
        "--resume",
        fish,
        "--steps",
        "4",
        "--override",
        "schedule.steps",
    ]));
    assert!(
        stdout.contains("goldfish loss: about 1 training target in 2"),
        "{stdout}"
    );
    let latest = Path::new(fish).join("checkpoints/step-4/config.toml");
    let config = std::fs::read_to_string(latest).unwrap();
    assert!(config.contains("goldfish_k = 2"), "{config}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_goldfish_values_are_one_line_errors_with_exit_code_2() {
    let dir = scratch("goldfish-bad");
    let out = dir.join("run");
    let o = out.to_str().unwrap();
    for (args, needle) in [
        (vec!["--goldfish-k", "1"], "--goldfish-k must be at least 2"),
        (vec!["--goldfish-k", "0"], "--goldfish-k must be at least 2"),
        (
            vec!["--goldfish-k", "4", "--goldfish-context", "0"],
            "--goldfish-context must be positive",
        ),
        (vec!["--goldfish-k=-3"], "--goldfish-k"),
    ] {
        let mut all = vec!["train", "--out", o];
        all.extend(&args);
        let r = ferrotron(&all);
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!out.exists(), "{args:?} wrote the run directory");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Tokens of the memorisation experiment's text: the first this many
/// characters of the embedded corpus.
const EXPERIMENT_CHARS: usize = 6_000;
/// Prefix and continuation lengths, tokens (the 32-token continuations).
const PREFIX: usize = 32;
const CONTINUATION: usize = 32;

/// Trains the experiment's model on `text`, with `extra` flags, into `out`.
fn train_experiment(text: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec![
        "train",
        "--model",
        "gpt-mini",
        "--vocab-size",
        "512",
        "--corpus",
        text.to_str().unwrap(),
        "--val-fraction",
        "0.05",
        "--seq-len",
        "64",
        "--micro-batch",
        "8",
        "--steps",
        "600",
        "--warmup-steps",
        "20",
        "--lr",
        "2e-3",
        "--min-lr",
        "2e-4",
        "--weight-decay",
        "0",
        "--eval-every",
        "600",
        "--save-every",
        "0",
        "--sample-tokens",
        "0",
        "--peak-tflops",
        "1",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    succeeded(&ferrotron(&args));
}

/// `(exact, tokens)`: how many continuations of `prefixes` greedy decoding
/// of `run` reproduces exactly, and how many continuation tokens it gets
/// right in all (position by position).
fn reproduced(run: &Path, prefixes: &[(Vec<u32>, Vec<u32>)]) -> (usize, usize) {
    let (mut exact, mut tokens) = (0, 0);
    for (prompt, truth) in prefixes {
        let ids: Vec<String> = prompt.iter().map(u32::to_string).collect();
        let ids = ids.join(",");
        let o = ferrotron(&[
            "generate",
            "--run",
            run.to_str().unwrap(),
            "--prompt-ids",
            &ids,
            "--greedy",
            "--ignore-eos",
            "--max-new-tokens",
            &CONTINUATION.to_string(),
        ]);
        let stdout = succeeded(&o);
        let line = stdout.lines().last().expect("generate prints the new ids");
        let got: Vec<u32> = serde_json::from_str(line).expect("a JSON array of ids");
        let right = got.iter().zip(truth).filter(|(g, t)| g == t).count();
        tokens += right;
        exact += usize::from(got == *truth);
    }
    (exact, tokens)
}

/// The memorisation experiment (README, `ferrotron train`): the same tiny
/// GPT trained for about 117 epochs on the first 6,000 characters of the
/// embedded corpus (2,631 training tokens), with and without
/// `--goldfish-k 4`; greedy decoding then continues 64 prefixes of 32
/// training tokens and the exact 32-token continuations are counted.
/// Prints the figures the README quotes.
#[test]
#[ignore = "the memorisation experiment: minutes of CPU; run with --ignored --nocapture"]
fn goldfish_reproduces_fewer_training_continuations() {
    let dir = scratch("goldfish-memorisation");
    let text: String = embedded_corpus().chars().take(EXPERIMENT_CHARS).collect();
    let path = dir.join("text.txt");
    std::fs::write(&path, &text).unwrap();
    let plain = dir.join("plain");
    let fish = dir.join("goldfish");
    train_experiment(&path, &plain, &[]);
    train_experiment(&path, &fish, &["--goldfish-k", "4"]);
    let tokenizer = Tokenizer::from_file(plain.join("tokenizer.json")).unwrap();
    let tokens = encode(&tokenizer, &text).unwrap();
    let (train_len, _) = split_lengths(tokens.len(), 0.05, 65).unwrap();
    let train = &tokens[..train_len];
    let window = PREFIX + CONTINUATION;
    let stride = (train_len - window) / 63;
    let prefixes: Vec<(Vec<u32>, Vec<u32>)> = (0..64)
        .map(|i| {
            let p = i * stride;
            (
                train[p..p + PREFIX].to_vec(),
                train[p + PREFIX..p + window].to_vec(),
            )
        })
        .collect();
    let runs: Vec<(&str, PathBuf)> = vec![("plain", plain), ("goldfish k=4", fish)];
    let mut results = Vec::new();
    for (name, run) in &runs {
        let (exact, right) = reproduced(run, &prefixes);
        let train_loss = step_losses(run).last().unwrap().1;
        let val = val_losses(run);
        println!(
            "{name}: {exact}/{} exact 32-token continuations, {right}/{} continuation tokens right, last training loss {train_loss:.3}, validation loss {:.3} ({} training tokens)",
            prefixes.len(),
            prefixes.len() * CONTINUATION,
            val.last().unwrap(),
            train_len
        );
        results.push(exact);
    }
    assert!(
        results[1] < results[0],
        "goldfish reproduced {} continuations, the plain run {}",
        results[1],
        results[0]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
