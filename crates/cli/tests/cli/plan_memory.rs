//! `ferrotron plan --explain` against Ferrotron itself: small CPU jobs
//! (one rank, 2 ranks under ZeRO 0, 1, 2 and 3, and pp2 x dp2 on 4 ranks
//! under ZeRO 0, 1 and 2) report parameter, gradient and optimizer bytes
//! in `metrics.jsonl`; `ferrotron plan --explain LABEL --json` of the same
//! layout must give exactly those bytes, as the host copy of an
//! `--async-checkpoint` exactly the bytes rank 0 stores of a checkpoint,
//! and the same HFU / MFU ratio. (The activation peak is checked in
//! `plan_activations.rs`.)
//!
//! The planner's side is the command: its flags build the planner's input
//! (the CPU path's activation model, the chunked head, the overlapped
//! reduction), and that input is what must match the trainer, so this
//! stays a command-line test. The jobs are what `ferrotron train` runs for
//! the same flags (parsed by the library's `JobFlags` and run through
//! `Job`, as `train` does), the one-rank ones in the test's process and
//! the others in two `mpirun` launches of this binary's worker (2 ranks:
//! 8 jobs, 4 ranks: 6), which reads each launch's jobs from the TOML files
//! the test writes.

use std::path::{Path, PathBuf};

use clap::Parser;
use ferrotron_job::comm::{open, Transport};
use ferrotron_job::{Job, JobConfig, JobFlags, PrintReport, World};
use ferrotron_parallel::comm::DEFAULT_TIMEOUT;
use ferrotron_parallel::launch::detect;
use ferrotron_test_support::skip::skip;

use crate::common::{corpus, scratch, step_records};
use crate::mpirun::DEADLINE;
use crate::plan::{plan_explain, train_args, MICRO};

/// The environment variable that names a worker's directory of jobs.
const JOBS_ENV: &str = "FERROTRON_TEST_PLAN_JOBS";

/// `ferrotron train`'s flags that set job keys.
#[derive(Parser)]
struct TrainFlags {
    #[command(flatten)]
    job: JobFlags,
}

/// The job `ferrotron train ARGS` runs (no `--config`, no `--resume`).
fn job_of(args: &[String]) -> JobConfig {
    let flags =
        TrainFlags::try_parse_from(std::iter::once("train").chain(args.iter().map(String::as_str)))
            .unwrap_or_else(|e| panic!("train {args:?}: {e}"));
    let mut config = JobConfig::default();
    flags.job.apply(&mut config);
    config
}

/// The layouts each mini trains: (ranks, ZeRO stage, the planner's label).
/// Without the `mpi` feature only the one-rank layout (and a printed skip).
fn layouts() -> Vec<(usize, u8, String)> {
    let mut layouts = vec![(1, 0, format!("dp1-tp1-pp1-z0-mb{MICRO}-none"))];
    if !cfg!(feature = "mpi") {
        skip("the dp2 and pp2 runs: ferrotron was built without the `mpi` feature");
        return layouts;
    }
    for zero in 0..=3u8 {
        let rc = if zero == 3 { "full" } else { "none" };
        layouts.push((2, zero, format!("dp2-tp1-pp1-z{zero}-mb{MICRO}-{rc}")));
    }
    for zero in 0..=2u8 {
        layouts.push((4, zero, format!("dp2-tp1-pp2-z{zero}-mb{MICRO}-none")));
    }
    layouts
}

/// The directory of the jobs of the launch on `ranks` ranks.
fn jobs_dir(dir: &Path, ranks: usize) -> PathBuf {
    dir.join(format!("jobs-np{ranks}"))
}

/// Also pp2 x dp2 on 4 ranks under ZeRO 0, 1 and 2: rank 0, which writes
/// the metrics, is the first stage, whose layout lists the other stage's
/// tensors as one-value placeholders.
#[test]
fn planned_memory_classes_equal_the_measured_ones_on_one_rank_dp2_zero_0_to_3_and_pp2() {
    let dir = scratch("plan-validate");
    let corpus = corpus(&dir);
    let mut planned = Vec::new();
    for model in ["gpt-mini", "llama-mini"] {
        for (ranks, zero, label) in layouts() {
            let out: PathBuf = dir.join(format!("{model}-{label}"));
            let plan = plan_explain(model, ranks, &label);
            let mut args = train_args(model, &corpus, &out, zero);
            if label.contains("-pp2-") {
                assert_eq!(plan["memory"]["stage"], "first", "{model} {label}");
                let split: Vec<String> = plan["stage_layers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n.to_string())
                    .collect();
                // The plan's 2 micro-batches per DP rank, on its split.
                let pp = [
                    "--pp",
                    "2",
                    "--grad-accum",
                    "2",
                    "--pp-layers",
                    &split.join(","),
                ];
                args.extend(pp.map(String::from));
            }
            let config = job_of(&args);
            if ranks == 1 {
                let valid = config
                    .validate(&World::SINGLE)
                    .unwrap_or_else(|e| panic!("{model} {label}: refused: {e:?}"));
                Job::new(valid)
                    .and_then(|job| job.run(&mut PrintReport))
                    .unwrap_or_else(|e| panic!("{model} {label}: {e:#}"));
            } else {
                let jobs = jobs_dir(&dir, ranks);
                std::fs::create_dir_all(&jobs).unwrap();
                let n = std::fs::read_dir(&jobs).unwrap().count();
                let file = jobs.join(format!("{n:02}-{model}-{label}.toml"));
                std::fs::write(file, config.to_toml()).unwrap();
            }
            planned.push((format!("{model} {label}"), out, plan));
        }
    }
    for ranks in [2, 4] {
        let jobs = jobs_dir(&dir, ranks);
        if jobs.exists() {
            let env = format!("{JOBS_ENV}={}", jobs.display());
            let (o, text) = ferrotron_test_support::mpirun::worker(
                ranks,
                &["-x", &env],
                "plan_memory::worker",
                DEADLINE,
            );
            assert!(o.status.success(), "the jobs on {ranks} ranks:\n{text}");
            assert_eq!(text.matches("1 passed").count(), ranks, "{text}");
        }
    }
    for (label, out, plan) in planned {
        check(&label, &out, &plan);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Compares the run `out` with the plan of its layout (the module doc).
fn check(label: &str, out: &Path, plan: &serde_json::Value) {
    // An async checkpoint's host copy is what rank 0 stores: the tensor
    // bytes of its file of the step-2 checkpoint.
    let stored = tensor_bytes(&out.join("checkpoints/step-2/rank-00000.safetensors"));
    let background = &plan["memory"]["checkpoint"]["background"];
    println!("{label} checkpoint: stored {stored}, planned {background}");
    assert_eq!(background.as_f64(), Some(stored as f64), "{label}");
    let last = step_records(out).pop().unwrap();
    let state = &plan["memory"]["state"];
    for class in ["param_bytes", "grad_bytes", "optimizer_bytes"] {
        println!(
            "{label} {class}: measured {}, planned {}",
            last[class], state[class]
        );
        assert_eq!(last[class], state[class], "{label} {class}");
    }
    // MFU and HFU mean the same in both: their ratio is the hardware FLOPs
    // (recomputation included) over the model's.
    let ratio = |v: &serde_json::Value| v["hfu"].as_f64().unwrap() / v["mfu"].as_f64().unwrap();
    let (trained, planned) = (ratio(&last), ratio(&plan["time"]));
    println!("{label}: HFU/MFU trained {trained:.6}, planned {planned:.6}");
    assert!(
        (trained / planned - 1.0).abs() < 1e-9,
        "{label}: HFU/MFU {trained} vs {planned}"
    );
    if label.ends_with("-full") {
        assert!(
            planned > 1.2,
            "full recomputation adds a forward: {planned}"
        );
    }
}

/// Bytes of tensor data in the safetensors file `path` (the file less its
/// 8-byte header length and the header).
fn tensor_bytes(path: &Path) -> u64 {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    bytes.len() as u64 - 8 - header
}

/// Every rank of one launch: the jobs in the directory [`JOBS_ENV`] names
/// (TOML files, in name order), one after another on one MPI
/// communicator. Run only under mpirun by the test above.
#[test]
#[ignore = "runs under mpirun, started by planned_memory_classes_equal_the_measured_ones_on_one_rank_dp2_zero_0_to_3_and_pp2"]
fn worker() {
    let jobs: PathBuf = std::env::var_os(JOBS_ENV)
        .unwrap_or_else(|| panic!("{JOBS_ENV} is not set: the worker runs under the test"))
        .into();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&jobs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let world = detect().unwrap();
    let comm = open(&world, Transport::Mpi, DEFAULT_TIMEOUT).unwrap();
    for file in files {
        let label = file.display();
        let valid = JobConfig::from_file(&file)
            .unwrap_or_else(|e| panic!("{label}: {e:?}"))
            .validate(&world)
            .unwrap_or_else(|e| panic!("{label}: refused: {e:?}"));
        Job::on(valid, comm.clone())
            .and_then(|job| job.run(&mut PrintReport))
            .unwrap_or_else(|e| panic!("{label}: {e:#}"));
    }
}
