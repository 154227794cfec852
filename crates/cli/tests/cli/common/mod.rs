//! What the command-line tests share: running `ferrotron` under a
//! deadline, a scratch directory, a small corpus, copying a run, reading
//! its step losses (comparing runs: `ferrotron_test_support::runs`).
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ferrotron_test_support::{deadline, runs};

/// `ferrotron ARGS`, killed and failing the test after the default deadline.
pub fn ferrotron(args: &[&str]) -> Output {
    deadline::output(Command::new(env!("CARGO_BIN_EXE_ferrotron")).args(args))
}

/// `ferrotron ARGS`, killed and failing the test after `limit`.
pub fn ferrotron_within(args: &[&str], limit: Duration) -> Output {
    deadline::output_within(
        Command::new(env!("CARGO_BIN_EXE_ferrotron")).args(args),
        limit,
    )
    .expect("the binary runs")
}

/// A new empty directory `ferrotron-{name}-{pid}-{n}` under the system temp
/// dir (`n` counts the calls: the command-line tests share one process).
pub fn scratch(name: &str) -> PathBuf {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ferrotron-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A 400-line text corpus (generated here) in `dir/small.txt`.
pub fn corpus(dir: &Path) -> PathBuf {
    let path = dir.join("small.txt");
    ferrotron_test_support::corpus::write_lines(&path);
    path
}

/// Every record (line) of a run's `metrics.jsonl`, in file order (a resumed
/// run appends); empty when there is no file yet.
pub fn records(run: &Path) -> Vec<serde_json::Value> {
    runs::records_so_far(run)
}

/// The step records (those with a `loss`) of [`records`].
pub fn step_records(run: &Path) -> Vec<serde_json::Value> {
    runs::steps(records(run))
}

/// `(step, loss)` of every step record of a run's `metrics.jsonl`
/// ([`step_records`]).
pub fn step_losses(run: &Path) -> Vec<(u64, f64)> {
    step_records(run)
        .iter()
        .filter_map(|v| Some((v["step"].as_u64()?, v["loss"].as_f64()?)))
        .collect()
}

/// Copies the directory tree `from` to `to` ([`runs::copy_dir`]).
pub fn copy_dir(from: &Path, to: &Path) {
    runs::copy_dir(from, to)
}

/// The flags of `ferrotron plan` for `model` (vocabulary `vocab`) on `gpus`
/// CPU ranks sized like the tests' training runs (16 GiB, 0.1 TFLOP/s,
/// links of 10 GB/s and 1 us within a node, 1 GB/s and 10 us between),
/// `global_batch` sequences of `seq` tokens.
pub fn plan_cpu_args(
    model: &str,
    vocab: usize,
    gpus: usize,
    global_batch: usize,
    seq: usize,
) -> Vec<String> {
    let (vocab, gpus, batch, seq) = (
        vocab.to_string(),
        gpus.to_string(),
        global_batch.to_string(),
        seq.to_string(),
    );
    [
        "plan",
        "--model",
        model,
        "--vocab",
        &vocab,
        "--gpus",
        &gpus,
        "--gpu",
        "cpu",
        "--gpu-mem-gib",
        "16",
        "--peak-tflops",
        "0.1",
        "--intra-gbps",
        "10",
        "--intra-us",
        "1",
        "--inter-gbps",
        "1",
        "--inter-us",
        "10",
        "--global-batch",
        &batch,
        "--seq-len",
        &seq,
    ]
    .map(String::from)
    .to_vec()
}
