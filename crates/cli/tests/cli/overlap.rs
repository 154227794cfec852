//! The measurements of gradient reduction overlapped with backward
//! (`--overlap-grad-reduce`) and of ZeRO-3's prefetch depth
//! (`--zero3-prefetch`), behind docs/parallelism.md: ignored benchmarks
//! that train gpt-mini on 2 ranks under `mpirun` with the latency double
//! (`FERROTRON_TEST_COMM_BYTES_PER_S` slows the DP communicator to a fixed
//! transfer rate) and print the step times as JSON. That the runs with and
//! without overlap are bit-identical, and what overlapped, is tested
//! through the library (tests/facade/overlap.rs).

use std::path::Path;

use ferrotron_test_support::deadline;

use crate::common::{corpus, scratch, step_records};
use crate::mpirun::{self, mpi_built};

/// The test-only variable that slows the gradient sync's communicator.
const RATE_ENV: &str = "FERROTRON_TEST_COMM_BYTES_PER_S";

/// Runs `ferrotron train` on 2 ranks with `args` (which name the run
/// directory), the DP communicator slowed to `rate` bytes/s; fails the
/// test, naming `name`, if the run fails.
fn run_dp2(name: &str, rate: u64, args: &[String]) {
    let mut cmd = mpirun::ferrotron_on(2, &[RATE_ENV]);
    cmd.env(RATE_ENV, rate.to_string()).arg("train").args(args);
    let o = deadline::output_within(&mut cmd, mpirun::DEADLINE).expect("mpirun runs");
    assert!(
        o.status.success(),
        "{name} failed:\n{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Trains gpt-mini on 2 ranks for 16 steps with `flags` into `dir/name`,
/// micro-batches of 8 sequences of 32 tokens, the DP communicator slowed
/// by the latency double to `rate` bytes/s; returns the median step time
/// of steps 2-16 and the means of their communication time, wait and
/// hidden fraction, as JSON.
fn measure(dir: &Path, corpus: &Path, name: &str, rate: u64, flags: &[&str]) -> serde_json::Value {
    let out = dir.join(name);
    let mut args: Vec<String> = [
        "--model",
        "gpt-mini",
        "--vocab-size",
        "300",
        "--seq-len",
        "32",
        "--micro-batch",
        "8",
        "--steps",
        "16",
        "--eval-every",
        "16",
        "--eval-batches",
        "1",
        "--sample-tokens",
        "0",
        "--peak-tflops",
        "1",
    ]
    .iter()
    .chain(flags)
    .map(|s| s.to_string())
    .collect();
    args.extend(["--corpus".into(), corpus.display().to_string()]);
    args.extend(["--out".into(), out.display().to_string()]);
    run_dp2(name, rate, &args);
    let records = step_records(&out);
    let later = &records[1..];
    let mean = |k: &str| {
        later
            .iter()
            .map(|r| r["grad_comm"][k].as_f64().unwrap())
            .sum::<f64>()
            / later.len() as f64
    };
    let mut times: Vec<f64> = later
        .iter()
        .map(|r| r["step_time_s"].as_f64().unwrap())
        .collect();
    times.sort_by(f64::total_cmp);
    serde_json::json!({
        "step_s_median": times[times.len() / 2],
        "comm_s_mean": mean("comm_s"),
        "wait_s_mean": mean("wait_s"),
        "hidden_mean": mean("hidden"),
    })
}

/// The bench's rate, bytes/s: `FERROTRON_BENCH_RATE`, default 40 MB/s.
fn bench_rate() -> u64 {
    std::env::var("FERROTRON_BENCH_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40_000_000)
}

/// The measurement behind docs/parallelism.md: DDP (full recomputation,
/// 0.25 MiB buckets) and ZeRO-3 training gpt-mini on 2 ranks ([`measure`])
/// with and without overlap, the DP communicator slowed by the latency
/// double to `FERROTRON_BENCH_RATE` bytes/s (default 40 MB/s) under DDP
/// and three times that under ZeRO-3 (which moves three times the bytes:
/// the same communication time per step). Prints one JSON object for
/// docs/benchmarks/: per layout the median step time of steps 2-16, the
/// mean communication time and hidden fraction, and the step time saved.
#[test]
#[ignore = "a measurement of about two minutes; run with --ignored --nocapture"]
fn overlap_speedup_benchmark() {
    if !mpi_built() {
        return;
    }
    let dir = scratch("overlap-bench");
    let corpus = corpus(&dir);
    let rate = bench_rate();
    let layouts: [(&str, u64, &[&str]); 2] = [
        ("ddp", rate, &["--recompute", "full", "--bucket-mb", "0.25"]),
        ("zero3", 3 * rate, &["--zero", "3"]),
    ];
    let mut results = Vec::new();
    for (label, rate, flags) in layouts {
        let mut row = serde_json::Map::new();
        row.insert("layout".into(), label.into());
        row.insert("rate_bytes_per_s".into(), rate.into());
        for (on, key) in [("false", "no_overlap"), ("true", "overlap")] {
            let mut all = flags.to_vec();
            all.extend(["--overlap-grad-reduce", on]);
            let stats = measure(&dir, &corpus, &format!("{label}-{on}"), rate, &all);
            row.insert(key.into(), stats);
        }
        let t = |k: &str| row[k]["step_s_median"].as_f64().unwrap();
        let saved = 1.0 - t("overlap") / t("no_overlap");
        row.insert("step_time_saved".into(), saved.into());
        results.push(serde_json::Value::Object(row));
    }
    let out = serde_json::json!({
        "what": "ignored test overlap::overlap_speedup_benchmark: gpt-mini (vocab 300), 2 ranks under mpirun, micro-batch 8 x 32 tokens, 16 steps (median of steps 2-16), DP communicator slowed by the latency double (comm::Latency)",
        "results": results,
    });
    println!("{}", serde_json::to_string_pretty(&out).unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}

/// ZeRO-3 with overlap and its gathers started 0, 1 and 2 blocks ahead
/// (`--zero3-prefetch`), and without overlap, on gpt-mini as
/// [`overlap_speedup_benchmark`] measures it, at three times
/// `FERROTRON_BENCH_RATE`. Prints one JSON object for docs/benchmarks/.
#[test]
#[ignore = "a measurement of about two minutes; run with --ignored --nocapture"]
fn zero3_prefetch_benchmark() {
    if !mpi_built() {
        return;
    }
    let dir = scratch("prefetch-bench");
    let corpus = corpus(&dir);
    let rate = 3 * bench_rate();
    let runs: [(&str, &[&str]); 4] = [
        ("no_overlap", &["--overlap-grad-reduce", "false"]),
        ("prefetch_0", &["--zero3-prefetch", "0"]),
        ("prefetch_1", &["--zero3-prefetch", "1"]),
        ("prefetch_2", &["--zero3-prefetch", "2"]),
    ];
    let mut results = serde_json::Map::new();
    for (label, flags) in runs {
        let mut all = vec!["--zero", "3"];
        all.extend(flags);
        results.insert(label.into(), measure(&dir, &corpus, label, rate, &all));
    }
    let out = serde_json::json!({
        "what": "ignored test overlap::zero3_prefetch_benchmark: gpt-mini (vocab 300, 4 blocks), ZeRO-3 on 2 ranks under mpirun, micro-batch 8 x 32 tokens, 16 steps (median of steps 2-16), DP communicator slowed by the latency double (comm::Latency)",
        "rate_bytes_per_s": rate,
        "results": results,
    });
    println!("{}", serde_json::to_string_pretty(&out).unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}
