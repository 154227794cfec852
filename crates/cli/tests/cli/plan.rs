//! `ferrotron plan` and energy in `metrics.jsonl`.
//!
//! - The command: the ranked table, `--json`, `--explain`, bad input, and
//!   its `today` column against what `ferrotron train` accepts. (Its
//!   memory classes against the trainer's: `plan_memory.rs`; the
//!   activation peak: `plan_activations.rs`.)
//! - Energy: a run on a fake powercap tree whose counter advances writes
//!   `energy_j` and `tokens_per_joule` per step and prints the total; a run
//!   without a counter prints one line naming what is missing and writes
//!   no energy.

use std::path::Path;
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common;
use crate::mpirun;
use ferrotron_test_support::deadline;
use ferrotron_test_support::skip::skip;

use common::{corpus, ferrotron, plan_cpu_args, scratch, step_records};
use mpirun::{ferrotron_on, DEADLINE};

/// `ferrotron train ARGS` on `ranks` processes (1: no mpirun), under the
/// deadline; it must succeed.
fn train(ranks: usize, args: &[String], env: &[(&str, &Path)]) -> Output {
    let out = train_output(ranks, args, env);
    assert!(
        out.status.success(),
        "train {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `ferrotron train ARGS` on `ranks` processes (1: no mpirun), under the
/// deadline, whatever its exit status.
fn train_output(ranks: usize, args: &[String], env: &[(&str, &Path)]) -> Output {
    let mut cmd = ferrotron_on(ranks, &[]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.arg("train").args(args);
    deadline::output_within(&mut cmd, DEADLINE).unwrap_or_else(|e| {
        panic!("could not start ferrotron or mpirun (is Open MPI installed?): {e}")
    })
}

const SEQ: usize = 32;
/// Sequences per micro-batch of the training runs and the plans.
pub const MICRO: usize = 2;
const BUCKET_MB: &str = "0.05";

/// The flags of a 2-step training run of `model` into `out`.
pub fn train_args(model: &str, corpus: &Path, out: &Path, zero: u8) -> Vec<String> {
    [
        "--model",
        model,
        "--vocab-size",
        "300",
        "--corpus",
        corpus.to_str().unwrap(),
        "--seq-len",
        &SEQ.to_string(),
        "--micro-batch",
        &MICRO.to_string(),
        "--steps",
        "2",
        "--eval-every",
        "2",
        "--eval-batches",
        "1",
        "--sample-tokens",
        "0",
        "--peak-tflops",
        "0.1",
        "--bucket-mb",
        BUCKET_MB,
        "--zero",
        &zero.to_string(),
        "--out",
        out.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec()
}

/// `ferrotron plan --explain LABEL --json` for `model` on `gpus` CPU ranks
/// with the training runs' shape.
pub fn plan_explain(model: &str, gpus: usize, label: &str) -> serde_json::Value {
    plan_explain_with(model, gpus, label, &[])
}

/// [`plan_explain`] with `extra` flags.
fn plan_explain_with(model: &str, gpus: usize, label: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = plan_cpu_args(model, 300, gpus, gpus * MICRO, SEQ);
    args.extend(["--bucket-mb", BUCKET_MB, "--explain", label, "--json"].map(String::from));
    args.extend(extra.iter().map(|f| f.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = ferrotron(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The `today` column against `ferrotron train`: each layout below is
/// planned for gpt-mini on its CPU ranks (2, or 4 for ZeRO-2 on a pipeline
/// with dp 2) and trained with the same flags; a layout the planner marks
/// as running today trains, a layout it marks no for its recomputation or
/// ZeRO stage is refused with exit 2 before anything is written, and a
/// bf16 layout, marked no because train keeps f32 state where the plan
/// counts 2 + 2 + 12 bytes per parameter, trains.
#[test]
fn the_today_column_is_what_train_accepts() {
    if !cfg!(feature = "mpi") {
        skip("ferrotron was built without the `mpi` feature (2- and 4-rank runs)");
        return;
    }
    let dir = scratch("plan-today");
    let corpus = corpus(&dir);
    // (label, ranks, --precision, train flags beyond the layout's, runs
    // today); each trains exactly when it runs today, but the bf16 layout.
    let cases: [(&str, usize, &str, &[&str], bool); 6] = [
        (
            "dp1-tp1-pp2-z0-mb2-sel",
            2,
            "fp32",
            &["--pp", "2", "--recompute", "selective"],
            true,
        ),
        (
            "dp1-tp1-pp2-z0-mb2-full",
            2,
            "fp32",
            &["--pp", "2", "--recompute", "full"],
            false,
        ),
        (
            "dp2-tp1-pp1-z3-mb2-sel",
            2,
            "fp32",
            &["--recompute", "selective"],
            false,
        ),
        (
            "dp1-tp2sp-pp1-z0-mb2-none",
            2,
            "fp32",
            &["--tp", "2", "--sp"],
            true,
        ),
        ("dp1-tp2-pp1-z0-mb2-none", 2, "bf16", &["--tp", "2"], false),
        ("dp2-tp1-pp2-z2-mb2-none", 4, "fp32", &["--pp", "2"], true),
    ];
    for (label, ranks, precision, flags, today) in cases {
        let plan = plan_explain_with("gpt-mini", ranks, label, &["--precision", precision]);
        assert_eq!(
            plan["runs_today"], today,
            "{label} {precision}: the planner's column"
        );
        let out = dir.join(label);
        let zero = label.split('-').nth(3).unwrap()[1..].parse().unwrap();
        let mut args = train_args("gpt-mini", &corpus, &out, zero);
        // The plan's global batch of `ranks` x 2 sequences, as micro-batches
        // of 2 on each of the dp ranks.
        let dp: usize = label.split('-').next().unwrap()[2..].parse().unwrap();
        let accum = (ranks / dp).to_string();
        args.extend(["--grad-accum", &accum, "--precision", precision].map(String::from));
        args.extend(flags.iter().map(|f| f.to_string()));
        let result = train_output(ranks, &args, &[]);
        let stderr = String::from_utf8_lossy(&result.stderr);
        println!(
            "{label} {precision}: planner {today}, train exit {:?}",
            result.status.code()
        );
        if today || precision == "bf16" {
            assert!(
                result.status.success(),
                "{label}: train refused it:\n{stderr}"
            );
        } else {
            assert_eq!(result.status.code(), Some(2), "{label}: {stderr}");
            assert!(
                !out.join("metrics.jsonl").exists(),
                "{label}: wrote metrics"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn plan_ranks_llama3_8b_on_64_a100s_and_explains_a_choice() {
    let args = [
        "plan",
        "--model",
        "llama3-8b",
        "--gpus",
        "64",
        "--gpus-per-node",
        "4",
        "--gpu",
        "a100-40gb",
        "--global-batch",
        "512",
        "--seq-len",
        "4096",
        // Without rings: with them, cp2 layouts (twice the micro-batches,
        // half the bubble) are the fastest and every faster choice fits.
        "--no-cp",
    ];
    let out = ferrotron(&args);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    println!("{text}");
    assert!(text.contains("rank  choice"), "{text}");
    let first = text
        .lines()
        .find(|l| l.trim_start().starts_with("1 "))
        .expect("a first-ranked row");
    let label = first.split_whitespace().nth(1).unwrap().to_string();
    // Faster choices need more than 40 GB (dp64 without TP, large micro-batches).
    assert!(text.contains("needs "), "{text}");
    let mut explain = args.to_vec();
    explain.extend(["--explain", &label]);
    let out = ferrotron(&explain);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with(&label), "{text}");
    for part in [
        "parameters",
        "activations: layers",
        "pipeline bubble",
        "an estimate",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
    let mut json = args.to_vec();
    json.push("--json");
    let out = ferrotron(&json);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let feasible = v["feasible"].as_array().unwrap();
    assert_eq!(feasible[0]["label"], label.as_str());
    let times: Vec<f64> = feasible
        .iter()
        .map(|e| e["time"]["step_s"].as_f64().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert!(!v["rejected"].as_array().unwrap().is_empty());
}

/// `--emit-config`: the best layout `train` runs today becomes a job file
/// that `train --config` reads and that names the planner's choice.
#[test]
fn plan_emits_the_best_runnable_layout_as_a_job_file() {
    let dir = scratch("plan-emit");
    let file = dir.join("job.toml");
    let f = file.to_str().unwrap();
    let args = [
        "plan",
        "--model",
        "llama3-8b",
        "--gpus",
        "8",
        "--global-batch",
        "64",
        "--seq-len",
        "2048",
        "--precision",
        "fp32",
    ];
    let mut emit = args.to_vec();
    emit.extend(["--emit-config", f]);
    let out = ferrotron(&emit);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let label = stdout
        .lines()
        .next()
        .unwrap()
        .rsplit('(')
        .next()
        .unwrap()
        .trim_end_matches(')')
        .to_string();
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains(&format!("({label})")) && text.contains("name = \"llama3-8b\""),
        "{text}"
    );
    // The planner's table names the same layout as the best one that runs today.
    let mut json = args.to_vec();
    json.push("--json");
    let v: serde_json::Value = serde_json::from_slice(&ferrotron(&json).stdout).unwrap();
    let today = v["feasible"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["runs_today"] == true)
        .unwrap();
    assert_eq!(today["label"], label.as_str());
    let dp = today["choice"]["dp"].as_u64().unwrap();
    assert!(text.contains(&format!("dp = {dp}")), "{text}");
    let printed = ferrotron(&["train", "--config", f, "--print-config"]);
    assert!(
        printed.status.success(),
        "{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    // Shape flags cannot be written into a job file: refused, nothing written.
    let other = dir.join("shaped.toml");
    let mut shaped = emit.clone();
    shaped.extend(["--layers", "8"]);
    *shaped.iter_mut().find(|a| **a == f).unwrap() = other.to_str().unwrap();
    let out = ferrotron(&shaped);
    assert_eq!(out.status.code(), Some(2));
    assert!(!other.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn plan_bad_input_exits_2_naming_the_flag() {
    for (args, flag) in [
        (vec!["--model", "nope"], "--model"),
        (vec!["--model", "gpt2", "--gpu", "tpu"], "--gpu"),
        (vec!["--model", "gpt2", "--gpu", "cpu"], "--gpu cpu"),
        (
            vec!["--model", "gpt2", "--explain", "dp3-tp1-pp1-z0-mb1-none"],
            "--explain",
        ),
        (vec!["--model", "gpt2", "--explain", "garbage"], "--explain"),
        (vec!["--model", "gpt2", "--precision", "fp8"], "--precision"),
        (vec!["--model", "gpt2", "--zero", "4"], "--zero"),
        (
            vec!["--model", "gpt2", "--recompute", "partial"],
            "--recompute",
        ),
        (vec!["--hidden", "64"], "missing --layers"),
    ] {
        let mut all = vec!["plan", "--gpus", "8", "--global-batch", "16"];
        all.extend(args);
        let out = ferrotron(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{all:?}: {err}");
        assert!(err.contains(flag), "{all:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

/// `--recompute` takes the names `train --recompute` takes.
#[test]
fn plan_takes_the_recompute_names_of_train() {
    for names in ["none,selective,full", "sel"] {
        let out = ferrotron(&[
            "plan",
            "--model",
            "gpt2",
            "--gpus",
            "8",
            "--global-batch",
            "16",
            "--recompute",
            names,
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "--recompute {names}: {err}");
    }
}

/// A powercap tree with one package whose counter advances by 1 J every
/// 10 ms while `running` is set.
fn fake_powercap(root: &Path, running: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    let pkg = root.join("intel-rapl:0");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(pkg.join("max_energy_range_uj"), "262143328850\n").unwrap();
    std::fs::write(pkg.join("energy_uj"), "1000\n").unwrap();
    std::thread::spawn(move || {
        let mut uj: u64 = 1000;
        while running.load(Ordering::SeqCst) {
            uj += 1_000_000;
            let tmp = pkg.join("energy_uj.tmp");
            std::fs::write(&tmp, format!("{uj}\n")).unwrap();
            std::fs::rename(&tmp, pkg.join("energy_uj")).unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
    })
}

#[test]
fn energy_from_a_fake_powercap_tree_lands_in_metrics_and_the_summary() {
    let dir = scratch("plan-energy");
    let corpus = corpus(&dir);
    let root = dir.join("powercap");
    let running = Arc::new(AtomicBool::new(true));
    let ticker = fake_powercap(&root, running.clone());
    let run = dir.join("run");
    let out = train(
        1,
        &train_args("gpt-mini", &corpus, &run, 0),
        &[("FERROTRON_POWERCAP_ROOT", &root)],
    );
    running.store(false, Ordering::SeqCst);
    ticker.join().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("energy: measured by RAPL (intel-rapl:0)"),
        "{text}"
    );
    let mut total = 0.0;
    for r in step_records(&run) {
        let j = r["energy_j"].as_f64().expect("energy_j");
        // The counter advances 1 J per 10 ms: at least a step's wall time.
        let dt = r["step_time_s"].as_f64().unwrap();
        assert!(j >= 1.0 && j <= 100.0 * dt + 2.0, "{j} J in {dt} s");
        let tokens = r["tokens_per_s"].as_f64().unwrap() * dt;
        let tpj = r["tokens_per_joule"].as_f64().unwrap();
        assert!(
            (tpj - tokens / j).abs() < 1e-6 * tpj,
            "{tpj} vs {}",
            tokens / j
        );
        total += j;
    }
    let line = text
        .lines()
        .find(|l| l.starts_with("energy: ") && l.contains(" kJ over 2 steps"));
    let line = line.unwrap_or_else(|| panic!("no total line: {text}"));
    let kj: f64 = line["energy: ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((kj - total / 1e3).abs() < 0.051, "{line} vs {total} J");

    // No counter: one line naming what is missing, no energy in the metrics.
    let empty = dir.join("empty-powercap");
    std::fs::create_dir_all(&empty).unwrap();
    let run = dir.join("run-none");
    let out = train(
        1,
        &train_args("gpt-mini", &corpus, &run, 0),
        &[("FERROTRON_POWERCAP_ROOT", &empty)],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("energy")).collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(
        lines[0].contains("not measured (no RAPL energy counter: no intel-rapl:N domain under"),
        "{}",
        lines[0]
    );
    assert!(step_records(&run)
        .iter()
        .all(|r| r.get("energy_j").is_none()));
    std::fs::remove_dir_all(&dir).unwrap();
}
