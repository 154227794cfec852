//! End-to-end runs of the `ferrotron` binary.

use std::path::Path;
use std::process::Command;

use crate::common::{ferrotron, scratch};
use ferrotron_test_support::corpus::{write_words, WORDS};
use ferrotron_test_support::deadline;

/// Asserts exit code 2, a one-line error containing every `needle`, and an
/// untouched output directory.
fn assert_rejected(args: &[&str], needles: &[&str], out: &Path) {
    let o = ferrotron(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: '{err}' lacks '{n}'");
    }
    assert!(!out.exists(), "{args:?} wrote {}", out.display());
}

#[test]
fn bad_input_is_a_one_line_error_with_exit_code_2_and_writes_nothing() {
    let dir = scratch("bad");
    let out = dir.join("run");
    let o = out.to_str().unwrap();
    assert_rejected(
        &["train", "--out", o, "--model", "gpt7"],
        &["gpt7", "gpt-mini", "llama3-8b"],
        &out,
    );
    assert_rejected(
        &["train", "--out", o, "--config", "/nonexistent/x.toml"],
        &["/nonexistent/x.toml"],
        &out,
    );
    let bad_key = dir.join("bad.toml");
    std::fs::write(
        &bad_key,
        "[schedule]\nsteps = 3\n[optimizer]\nlearning_rate = 0.1\n",
    )
    .unwrap();
    assert_rejected(
        &["train", "--out", o, "--config", bad_key.to_str().unwrap()],
        &["learning_rate", "bad.toml"],
        &out,
    );
    assert_rejected(&["train", "--out", o, "--steps", "0"], &["--steps"], &out);
    assert_rejected(
        &["train", "--out", o, "--micro-batch", "0"],
        &["--micro-batch"],
        &out,
    );
    assert_rejected(
        &["train", "--out", o, "--backend", "cuda"],
        &["cuda", "flex"],
        &out,
    );
    assert_rejected(
        &["train", "--out", o, "--kernels", "fused"],
        &["--kernels fused", "flex", "reference"],
        &out,
    );
    assert_rejected(
        &["train", "--out", o, "--backend", "tpu"],
        &["tpu", "flex"],
        &out,
    );
    // Inputs and outputs that cannot work, refused before anything is written.
    let corpus_dir = dir.join("a-directory");
    std::fs::create_dir_all(&corpus_dir).unwrap();
    let empty = dir.join("empty.txt");
    std::fs::write(&empty, "\n  \n").unwrap();
    for (corpus, needle) in [
        (corpus_dir.to_str().unwrap(), "not a regular file"),
        ("/dev/zero", "not a regular file"),
        (empty.to_str().unwrap(), "is empty"),
    ] {
        assert_rejected(
            &["train", "--out", o, "--corpus", corpus],
            &[corpus, needle],
            &out,
        );
    }
    assert_rejected(
        &["train", "--out", o, "--model", "gpt-mini", "--hf-dir", "/x"],
        &["--model with --hf-dir"],
        &out,
    );
    let hf_out = dir.join("hf");
    let inside = hf_out.join("run");
    assert_rejected(
        &[
            "train",
            "--out",
            inside.to_str().unwrap(),
            "--hf-out",
            hf_out.to_str().unwrap(),
        ],
        &["one is inside the other"],
        &hf_out,
    );
    let text = dir.join("text.txt");
    std::fs::write(&text, "some text to train on\n").unwrap();
    let t = text.to_str().unwrap();
    let o2 = ferrotron(&["train", "--out", t, "--corpus", t]);
    let err = String::from_utf8_lossy(&o2.stderr);
    assert_eq!(o2.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--out") && err.contains("is also --corpus"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&text).unwrap(),
        "some text to train on\n"
    );
    assert_rejected(
        &["train", "--out", o, "--dp", "2"],
        &["--dp 2", "must equal the world size 1"],
        &out,
    );
    assert_rejected(
        &["train", "--out", o, "--bucket-mb", "0"],
        &["--bucket-mb"],
        &out,
    );
    assert_rejected(
        &["train", "--out", o, "--comm-timeout", "0"],
        &["--comm-timeout", "positive number of seconds"],
        &out,
    );
    assert_rejected(
        &["train", "--out", o, "--seq-len", "100000"],
        &["--seq-len", "max_seq_len", "--max-seq-len"],
        &out,
    );
    assert_rejected(
        &["train", "--out", o, "--max-seq-len", "0"],
        &["model.max_seq_len: --max-seq-len must be positive"],
        &out,
    );
    // An explicit warm-up longer than the run (the default shortens itself).
    assert_rejected(
        &["train", "--out", o, "--steps", "5", "--warmup-steps", "10"],
        &["optimizer.warmup_steps: --warmup-steps 10 exceeds --steps 5"],
        &out,
    );
    // A corpus too small for the vocabulary, or for the train/validation split.
    assert_rejected(
        &["train", "--out", o, "--corpus", t, "--vocab-size", "4096"],
        &["--corpus", "only supports a vocabulary of"],
        &out,
    );
    assert_rejected(
        &["train", "--out", o, "--corpus", t, "--vocab-size", "257"],
        &["--corpus", "split would have", "fewer than the minimum 129"],
        &out,
    );
    // A job larger than this host, refused before the model is allocated
    // (70 B parameters x 16 bytes of training state alone), naming the
    // estimate, the remedies and the flag that skips the check; with that
    // flag the same job passes the check (here refused for its steps only).
    assert_rejected(
        &["train", "--out", o, "--model", "llama3-70b"],
        &[
            "memory: the job needs about",
            "GiB per rank (parameters",
            "available memory (MemAvailable)",
            "raise --tp",
            "lower --micro-batch",
            "--no-memory-check",
        ],
        &out,
    );
    assert_rejected(
        &[
            "train",
            "--out",
            o,
            "--model",
            "llama3-70b",
            "--no-memory-check",
            "--steps",
            "0",
        ],
        &["schedule.steps: --steps must be positive"],
        &out,
    );
}

/// The job file: `--print-config` prints the job as TOML and reading that
/// back gives the same job; a misplaced key names its section; a file with
/// three mistakes reports three lines; the repository's gpt-mini job runs.
#[test]
fn job_files_round_trip_name_misplaced_keys_and_run() {
    let dir = scratch("job");
    let printed = ferrotron(&[
        "train",
        "--print-config",
        "--tp",
        "2",
        "--sp",
        "--lr",
        "3e-4",
        "--pp-layers",
        "2,2",
    ]);
    assert!(
        printed.status.success(),
        "{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    let text = String::from_utf8(printed.stdout).unwrap();
    assert!(
        text.contains("[parallelism]\ntp = 2\nsp = true") && text.contains("lr = 0.0003"),
        "{text}"
    );
    let file = dir.join("printed.toml");
    std::fs::write(&file, &text).unwrap();
    let again = ferrotron(&[
        "train",
        "--print-config",
        "--config",
        file.to_str().unwrap(),
    ]);
    assert_eq!(String::from_utf8(again.stdout).unwrap(), text);

    let out = dir.join("run");
    let o = out.to_str().unwrap();
    let misplaced = dir.join("misplaced.toml");
    std::fs::write(&misplaced, "[optimizer]\nsteps = 3\n").unwrap();
    assert_rejected(
        &["train", "--out", o, "--config", misplaced.to_str().unwrap()],
        &[
            "misplaced.toml",
            "[optimizer] has no key 'steps'",
            "[schedule]",
        ],
        &out,
    );
    let flat = dir.join("flat.toml");
    std::fs::write(&flat, "lr = 0.1\n").unwrap();
    assert_rejected(
        &["train", "--out", o, "--config", flat.to_str().unwrap()],
        &["'lr' is not a section", "[optimizer]", "optimizer.lr"],
        &out,
    );
    let three = dir.join("three.toml");
    std::fs::write(
        &three,
        "[schedule]\nsteps = 0\nmicro_batch = 0\n[parallelism]\ntp = 3\n",
    )
    .unwrap();
    let r = ferrotron(&["train", "--out", o, "--config", three.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(2), "{err}");
    let lines: Vec<&str> = err.trim_end().lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    assert!(lines.iter().all(|l| l.starts_with("error: ")), "{err}");
    assert!(
        lines[0].contains("schedule.steps: --steps must be positive")
            && lines[1].contains("schedule.micro_batch"),
        "{err}"
    );
    assert!(
        lines[2].contains("world size 1 is not divisible by --tp 3"),
        "{err}"
    );
    assert!(!out.exists());

    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/gpt-mini.toml");
    let run = ferrotron(&[
        "train",
        "--config",
        config.to_str().unwrap(),
        "--steps",
        "3",
        "--sample-tokens",
        "0",
        "--out",
        o,
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let resolved = std::fs::read_to_string(out.join("config.toml")).unwrap();
    assert!(
        resolved.contains("steps = 3") && resolved.contains("warmup_steps = 3"),
        "{resolved}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn train_writes_a_complete_run_directory_and_generate_reads_it() {
    let dir = scratch("run");
    let corpus = dir.join("corpus.txt");
    write_words(&corpus, &WORDS, 6000);
    let out = dir.join("run");
    let config = dir.join("run.toml");
    std::fs::write(
        &config,
        "[model]\nname = \"llama-mini\"\n[schedule]\nsteps = 12\nmicro_batch = 4\n",
    )
    .unwrap();
    let o = ferrotron(&[
        "train",
        "--config",
        config.to_str().unwrap(),
        "--corpus",
        corpus.to_str().unwrap(),
        "--vocab-size",
        "300",
        "--seq-len",
        "32",
        "--eval-every",
        "6",
        "--sample-tokens",
        "5",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for file in [
        "config.toml",
        "metrics.jsonl",
        "loss.svg",
        "tokenizer.json",
        "model.safetensors",
    ] {
        assert!(out.join(file).is_file(), "missing {file}");
    }
    let resolved = std::fs::read_to_string(out.join("config.toml")).unwrap();
    assert!(resolved.contains("name = \"llama-mini\"") && resolved.contains("steps = 12"));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let steps: Vec<_> = lines.iter().filter(|v| v.get("loss").is_some()).collect();
    let vals: Vec<_> = lines
        .iter()
        .filter(|v| v.get("val_loss").is_some())
        .collect();
    assert_eq!(steps.len(), 12);
    assert_eq!(vals.len(), 3, "validation at steps 0, 6 and 12");
    for key in ["step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu"] {
        assert!(steps[0][key].is_number(), "{key} in {}", steps[0]);
    }
    assert!(stdout.contains("--- sample ---"), "{stdout}");

    let g = deadline::output(
        Command::new(env!("CARGO_BIN_EXE_ferrotron"))
            .args([
                "generate",
                "--run",
                out.to_str().unwrap(),
                "--prompt",
                "The cat",
            ])
            .args(["--max-new-tokens", "8", "--temperature", "0"]),
    );
    assert!(g.status.success(), "{}", String::from_utf8_lossy(&g.stderr));
    assert!(String::from_utf8_lossy(&g.stdout).starts_with("The cat"));

    // A run directory is never overwritten.
    assert_eq!(
        ferrotron(&["train", "--out", out.to_str().unwrap()])
            .status
            .code(),
        Some(2)
    );
}

/// `--max-seq-len` sizes a new model's position table beyond its preset's,
/// and a resumed run keeps it.
#[test]
fn max_seq_len_sizes_the_position_table_of_a_new_model() {
    let dir = scratch("max-seq");
    let corpus = dir.join("corpus.txt");
    let text: String = (0..4000u64)
        .map(|i| format!("w{} ", (i * 2654435761) % 97))
        .collect();
    std::fs::write(&corpus, text).unwrap();
    let out = dir.join("run");
    let (c, o) = (corpus.to_str().unwrap(), out.to_str().unwrap());
    let args = [
        "train",
        "--out",
        o,
        "--corpus",
        c,
        "--vocab-size",
        "300",
        "--max-seq-len",
        "320",
        "--seq-len",
        "300",
        "--micro-batch",
        "1",
        "--steps",
        "1",
        "--eval-every",
        "1",
        "--eval-batches",
        "1",
        "--sample-tokens",
        "0",
    ];
    let run = ferrotron(&args);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    // The safetensors header: its length (u64, little-endian), then JSON.
    let weights = std::fs::read(out.join("model.safetensors")).unwrap();
    let len = u64::from_le_bytes(weights[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&weights[8..8 + len]).unwrap();
    assert_eq!(header["pos_embed"]["shape"], serde_json::json!([320, 192]));
    let resumed = ferrotron(&[
        "train",
        "--resume",
        o,
        "--max-seq-len",
        "256",
        "--steps",
        "2",
    ]);
    let err = String::from_utf8_lossy(&resumed.stderr);
    assert_eq!(resumed.status.code(), Some(2), "{err}");
    assert!(err.contains("--max-seq-len"), "{err}");
}
