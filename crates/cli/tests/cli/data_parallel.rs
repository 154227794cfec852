//! `ferrotron train` under `mpirun`: a mesh that does not fit the world is
//! refused on every rank, a failing or silent rank ends the job naming
//! it, a dp2 ZeRO-1 run resumes from the command line (exactly on 2
//! ranks, resharded onto one), and faults (SIGUSR1, SIGKILL, a panic, a
//! stall) stop cleanly or end the job. That multi-rank jobs equal the
//! one-rank job (DP, ZeRO) is tested through the library, in the facade's
//! `data_parallel` tests (tests/facade/data_parallel.rs).
//!
//! Needs the binary built with the `mpi` feature (`cargo test -p
//! ferrotron-cli --features mpi`) and Open MPI's `mpirun`; without the
//! feature the tests are skipped with a printed reason, with it a missing
//! `mpirun` is a failure. A run still going after its deadline is killed
//! and fails the test (a hang).

use std::path::Path;
use std::time::Duration;

use ferrotron_engine::checkpoint::load_safetensors;

use crate::common;
use crate::mpirun;

use common::{copy_dir, corpus, scratch, step_losses};
use ferrotron_test_support::deadline;
use ferrotron_test_support::runs::max_weight_rel_err;
use mpirun::{mpi_built, train, train_within, RunFlags};

/// Training losses of a run's metrics.jsonl, by step.
fn losses(run: &Path) -> Vec<f64> {
    step_losses(run).into_iter().map(|(_, loss)| loss).collect()
}

#[test]
fn a_mesh_that_does_not_fit_the_world_size_exits_2_on_every_rank() {
    if !mpi_built() {
        return;
    }
    let dir = scratch("mesh");
    let out = dir.join("run");
    let o = train(2, &["--dp", "3", "--out", out.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("must equal the world size 2"), "{err}");
    assert!(!out.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_failing_rank_aborts_the_job_instead_of_hanging() {
    if !mpi_built() {
        return;
    }
    let dir = scratch("abort");
    let out = dir.join("run");
    // Rank 0 finds the run directory not empty and fails after the other
    // rank has gone on to wait for it: MPI_Abort must end the job.
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("x"), "taken").unwrap();
    let o = train_within(
        2,
        &["--steps", "1", "--out", out.to_str().unwrap()],
        Duration::from_secs(120),
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("not empty"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Rank 0 trains the tokenizer (seconds on the embedded corpus) while rank 1
/// waits at a barrier: with a 1 ms `--comm-timeout`, rank 1 gives up, names
/// rank 0 on stderr, and aborts the job.
#[test]
fn a_rank_kept_waiting_past_comm_timeout_names_the_missing_rank() {
    if !mpi_built() {
        return;
    }
    let dir = scratch("timeout");
    let out = dir.join("run");
    let o = train_within(
        2,
        &["--comm-timeout", "0.001", "--out", out.to_str().unwrap()],
        Duration::from_secs(300),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    let want =
        "error (rank 1): barrier #1 did not complete within 1ms: rank 0 never arrived (rank 1 did)";
    assert!(err.contains(want), "missing `{want}` in:\n{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// dp2 + ZeRO-1 for 10 steps with checkpoints at 5 and 10; a copy resumed
/// from step 5 under mpirun repeats steps 6-10 bit for bit; a copy resumed
/// from step 5 on one rank (ZeRO 0, grad-accum 2: the same global batch)
/// reshards the optimizer state and matches to float tolerance.
#[test]
fn dp2_zero1_resumes_exactly_and_reshards_onto_one_rank() {
    if !mpi_built() {
        return;
    }
    let dir = scratch("resume");
    let corpus = corpus(&dir);
    let whole = dir.join("whole");
    let mut args = RunFlags {
        accum: Some("1"),
        eval_every: "5",
        save_every: Some("5"),
        ..RunFlags::new("llama-mini", &corpus, &whole, "10")
    }
    .args();
    args.extend(["--zero", "1", "--keep-checkpoints", "2"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = train(2, &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want = step_losses(&whole);
    assert_eq!(want.len(), 10);

    let exact = dir.join("exact");
    copy_dir(&whole, &exact);
    let from = exact.join("checkpoints").join("step-5");
    let o = train(
        2,
        &[
            "--resume",
            from.to_str().unwrap(),
            "--out",
            exact.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Steps 6-10 resumed under mpirun replaced the copy's records.
    assert_eq!(step_losses(&exact), want, "steps 6-10 resumed under mpirun");
    let a = load_safetensors(&whole.join("model.safetensors")).unwrap();
    let b = load_safetensors(&exact.join("model.safetensors")).unwrap();
    for (name, t) in &a {
        assert_eq!(
            t.to_vec::<f32>().unwrap(),
            b[name].to_vec::<f32>().unwrap(),
            "{name}"
        );
    }

    let one = dir.join("one");
    copy_dir(&whole, &one);
    let from = one.join("checkpoints").join("step-5");
    let o = train(
        1,
        &[
            "--resume",
            from.to_str().unwrap(),
            "--zero",
            "0",
            "--grad-accum",
            "2",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = step_losses(&one);
    assert_eq!(got.len(), 10, "each step recorded once");
    for ((s, g), (_, w)) in got[5..].iter().zip(&want[5..]) {
        assert!((g - w).abs() <= 1e-5 * w.abs(), "step {s}: {g} vs {w}");
    }
    let rel = max_weight_rel_err(&one, &whole);
    assert!(
        rel <= 1e-5,
        "resharded onto one rank: relative weight error {rel:e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The dp2 runs of the fault test: gpt-mini, 8 steps, a checkpoint every
/// 2, into `out`, a 3 s `--comm-timeout`, plus `extra`.
fn fault_args(corpus: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = RunFlags {
        save_every: Some("2"),
        ..RunFlags::new("gpt-mini", corpus, out, "8")
    }
    .args();
    args.extend(["--comm-timeout", "3"].map(String::from));
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// `ferrotron train args` on 2 ranks, with the environment variables
/// `env` passed to both, started to be signalled.
fn spawn_dp2(args: &[String], env: &[(&str, &str)]) -> deadline::Watched {
    let names: Vec<&str> = env.iter().map(|(n, _)| *n).collect();
    let mut cmd = mpirun::ferrotron_on(2, &names);
    cmd.envs(env.iter().copied()).arg("train").args(args);
    deadline::spawn_within(&mut cmd, mpirun::DEADLINE).expect("mpirun runs")
}

/// Resumes `run` on 2 ranks to the end; its losses must be `want`'s.
fn resume_dp2_to(run: &Path, want: &[f64], what: &str) {
    let o = train(2, &["--resume", run.to_str().unwrap()]);
    assert!(
        o.status.success(),
        "{what}: the resume failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let got = losses(run);
    let resumed_from = got.len() - want.len();
    assert_eq!(
        &got[resumed_from..],
        want,
        "{what}: losses after the resume"
    );
}

/// How long a rank may take to notice a lost one: the 3 s timeout, its
/// grace period, and start-up slack on 2 shared cores.
const NOTICED_WITHIN: Duration = Duration::from_secs(30);

/// Faults under `mpirun -np 2`, against an uninterrupted dp2 run:
/// - SIGUSR1 to `mpirun` (forwarded to every rank): every rank stops at
///   the same step, rank 0 writes one checkpoint, the job exits 75, and
///   `--resume` reproduces the uninterrupted losses;
/// - SIGKILL to rank 1 mid-run: the job ends non-zero, the output names
///   rank 1, and the latest checkpoint resumes to the same losses;
/// - rank 1 panics (test hook): the job ends non-zero within the
///   timeout, rank 1's error names it;
/// - rank 1 stalls inside step 3 (test hook): rank 0 names it as never
///   arrived after the 3 s timeout and the job ends non-zero.
#[test]
fn dp2_faults_stop_cleanly_or_end_the_job_naming_the_rank() {
    if !mpi_built() {
        return;
    }
    let dir = scratch("faults");
    let corpus = corpus(&dir);
    let whole = dir.join("whole");
    let o = train(2, &str_args(&fault_args(&corpus, &whole, &[])));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want = losses(&whole);
    assert_eq!(want.len(), 8);

    let stopped = dir.join("usr1");
    let mut job = spawn_dp2(&fault_args(&corpus, &stopped, &[]), &[]);
    job.wait_until("two logged steps", || losses(&stopped).len() >= 2);
    job.signal(job.pid(), "USR1");
    let o = job.finish().unwrap();
    let text = output_text(&o);
    assert_eq!(o.status.code(), Some(75), "{text}");
    let at = losses(&stopped).len();
    assert!(at < 8, "stopped after step {at}");
    let latest = std::fs::read_to_string(stopped.join("checkpoints/latest")).unwrap();
    assert_eq!(latest.trim(), format!("step-{at}"));
    resume_dp2_to(&stopped, &want[at..], "after SIGUSR1");

    let killed = dir.join("kill");
    let mut job = spawn_dp2(&fault_args(&corpus, &killed, &[]), &[]);
    job.wait_until("three logged steps", || losses(&killed).len() >= 3);
    let rank1 = ferrotron_test_support::mpirun::rank_pid(job.pid(), 1).expect("rank 1's process");
    let t = std::time::Instant::now();
    job.signal(rank1, "KILL");
    let o = job.finish().unwrap();
    let (took, text) = (t.elapsed(), output_text(&o));
    assert!(
        !o.status.success() && took < NOTICED_WITHIN,
        "{took:?}: {text}"
    );
    assert!(
        text.contains("rank 1"),
        "the lost rank is not named:\n{text}"
    );
    let done = losses(&killed).len();
    let latest = std::fs::read_to_string(killed.join("checkpoints/latest")).unwrap();
    let from: usize = latest.trim()["step-".len()..].parse().unwrap();
    assert!(
        from >= 2 && from <= done,
        "latest {from}, {done} steps logged"
    );
    resume_dp2_to(&killed, &want[from..], "after SIGKILL");

    for (hook, value, needle) in [
        (
            "FERROTRON_TEST_PANIC_AT_STEP",
            "1:3",
            "error (rank 1): panicked",
        ),
        (
            "FERROTRON_TEST_STALL_AT_STEP",
            "1:3:60",
            "rank 1 never arrived",
        ),
    ] {
        let out = dir.join(hook);
        let t = std::time::Instant::now();
        let o = spawn_dp2(&fault_args(&corpus, &out, &[]), &[(hook, value)])
            .finish()
            .unwrap();
        let (took, text) = (t.elapsed(), output_text(&o));
        assert!(!o.status.success(), "{hook}: {text}");
        assert!(
            took < NOTICED_WITHIN,
            "{hook}: the job took {took:?}:\n{text}"
        );
        assert!(text.contains(needle), "{hook}: no `{needle}` in:\n{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn str_args(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

fn output_text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
