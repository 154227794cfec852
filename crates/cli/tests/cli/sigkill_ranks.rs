//! The 2-rank sibling of `resume.rs`'s SIGKILL test: a tp2 job under
//! `mpirun`, writing a checkpoint every step, is killed (SIGKILL of every
//! rank at once) at spread-out moments several times. Each time
//! `checkpoints/latest` must name a checkpoint whose every block loads,
//! and at the end that checkpoint must equal, bit for bit, the one an
//! uninterrupted tp2 run writes at the same step (same layout), and a run
//! resumed from it must succeed. The killed job writes its checkpoints in
//! the background (`--async-checkpoint`), so the kills also land during
//! background writes; the uninterrupted run writes them synchronously.
//!
//! Needs the binary built with the `mpi` feature and Open MPI's `mpirun`
//! (skipped with a printed reason otherwise).

use std::path::Path;
use std::time::Duration;

use ferrotron_parallel::train::checkpoint::read::Reader;
use ferrotron_parallel::train::checkpoint::{read_state, resolve};
use ferrotron_test_support::deadline;
use ferrotron_test_support::mpirun::rank_pid;

use crate::common::{corpus, scratch};
use crate::mpirun::{ferrotron_on, mpi_built, train};

/// How many times the job is killed.
const KILLS: u64 = 6;

/// When a killed job that never ends fails the test.
const DEADLINE: Duration = Duration::from_secs(300);

/// A tp2 gpt-mini run of `steps` steps on `corpus` into `out`, a
/// checkpoint after every step, written in the background if
/// `background`. The learning rate is constant after warm-up (`--min-lr`
/// = `--lr`), so runs of different lengths take the same steps.
fn flags(corpus: &Path, out: &Path, steps: u64, background: bool) -> Vec<String> {
    [
        "--model",
        "gpt-mini",
        "--vocab-size",
        "300",
        "--seq-len",
        "32",
        "--micro-batch",
        "2",
        "--eval-every",
        "1000",
        "--eval-batches",
        "1",
        "--sample-tokens",
        "0",
        "--peak-tflops",
        "1",
        "--warmup-steps",
        "2",
        "--lr",
        "1e-3",
        "--min-lr",
        "1e-3",
        "--tp",
        "2",
        "--save-every",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(["--corpus".into(), corpus.display().to_string()])
    .chain(["--out".into(), out.display().to_string()])
    .chain(["--steps".into(), steps.to_string()])
    .chain(background.then(|| "--async-checkpoint".to_string()))
    .collect()
}

/// `ferrotron train args` on 2 ranks, which must succeed.
fn ok(args: &[String], what: &str) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = train(2, &args);
    assert!(
        o.status.success(),
        "{what}:\n{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Step records of `run`'s `metrics.jsonl` (not its memory or
/// validation records).
fn records(run: &Path) -> usize {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .map_or(0, |t| t.lines().filter(|l| l.contains("\"loss\"")).count())
}

/// Starts the resumed job of `run` (to no end) and SIGKILLs both ranks
/// `wait` after it recorded its second step (each step ends with a
/// checkpoint written in the background, and the first step's is
/// published at the second's end, so the kill lands in a publication, a
/// background write or a step); returns once `mpirun` has ended.
fn kill_during_saves(run: &Path, wait: Duration, i: u64) {
    let mut cmd = ferrotron_on(2, &[]);
    cmd.env("OMPI_MCA_rmaps_base_oversubscribe", "1").args([
        "train",
        "--resume",
        &run.display().to_string(),
        "--steps",
        "100000",
        "--override",
        "schedule.steps",
    ]);
    let before = records(run);
    let mut job = deadline::spawn_within(&mut cmd, DEADLINE).expect("mpirun starts");
    let pid = job.pid();
    job.wait_until("two steps of the resumed job", || records(run) > before + 1);
    std::thread::sleep(wait);
    // Both ranks must still run (a job that was refused or crashed would
    // leave `latest` intact without testing anything).
    let ranks: Vec<u32> = (0..2)
        .map(|r| rank_pid(pid, r).unwrap_or_else(|| panic!("kill {i}: rank {r} ended first")))
        .collect();
    for r in ranks {
        job.signal(r, "KILL");
    }
    let o = job.finish().expect("mpirun is waited for");
    assert!(!o.status.success(), "kill {i}: the job ended well");
}

/// Whether a cut-off checkpoint write (`checkpoints/.step-N.tmp`) is in `run`.
fn cut_off(run: &Path) -> bool {
    std::fs::read_dir(run.join("checkpoints")).is_ok_and(|d| {
        d.flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
    })
}

#[test]
fn sigkill_of_both_ranks_during_checkpoint_writes_leaves_a_latest_that_resumes_exactly() {
    if !mpi_built() {
        return;
    }
    let dir = scratch("sigkill-ranks");
    let corpus = corpus(&dir);
    let run = dir.join("run");
    ok(&flags(&corpus, &run, 2, true), "the first two steps");
    let mut mid_write = 0;
    for i in 0..KILLS {
        // 0 to 0.9 s after the job's second step: in the publication of
        // the first step's checkpoint, the second's background write, or
        // a later step or write.
        kill_during_saves(&run, Duration::from_millis((i * 7919) % 900), i);
        mid_write += usize::from(cut_off(&run));
        let latest = resolve(&run).unwrap_or_else(|e| panic!("kill {i}: {e}"));
        let state = read_state(&latest).unwrap_or_else(|e| panic!("kill {i}: {e}"));
        assert!(state.step >= 2, "kill {i}");
        Reader::open(&latest)
            .and_then(|mut r| r.read_whole())
            .unwrap_or_else(|e| panic!("kill {i}: {e}"));
    }
    let latest = resolve(&run).unwrap();
    let step = read_state(&latest).unwrap().step as u64;
    eprintln!("{KILLS} kills of 2 ranks: {mid_write} cut a checkpoint off; latest is step {step}");
    assert!(
        step > 2,
        "no kill came after a step: the jobs never trained"
    );

    // The checkpoint the kills left equals an uninterrupted run's.
    let whole = dir.join("whole");
    ok(
        &flags(&corpus, &whole, step, false),
        "the uninterrupted run",
    );
    let reference = whole.join("checkpoints").join(format!("step-{step}"));
    let (got, want) = (
        Reader::open(&latest).unwrap().read_whole().unwrap(),
        Reader::open(&reference).unwrap().read_whole().unwrap(),
    );
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    for (name, t) in &got {
        assert_eq!(
            t.to_vec::<f32>().unwrap(),
            want[name].to_vec::<f32>().unwrap(),
            "{name} at step {step}"
        );
    }

    // And a job resumed after the kills goes on (removing what they left).
    let resume = [
        "--resume".to_string(),
        run.display().to_string(),
        "--steps".into(),
        (step + 1).to_string(),
        "--override".into(),
        "schedule.steps".into(),
    ];
    ok(&resume, "the run resumed after the kills");
    assert!(!cut_off(&run), "the resumed run removed the cut-off write");
    let _ = std::fs::remove_dir_all(&dir);
}
