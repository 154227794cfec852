//! A rank that hangs or dies must not hang the job under `mpirun -np 3`.
//! A rank that hangs: the live ranks fail within the communicator timeout
//! with an error naming it, abort, and `mpirun` ends non-zero. A rank that
//! exits without finalizing MPI: `mpirun` itself ends the job, non-zero
//! (usually before the timeout, so no error of ours is printed then). As in `mpi_comm.rs`, each
//! launcher test re-runs this test binary under `mpirun`, selecting an
//! ignored worker test. Skipped (with a printed reason) without the `mpi`
//! feature; with it, a missing `mpirun` is a failure. A job still running
//! after `DEADLINE` is killed and fails the test (a hang).

use std::time::{Duration, Instant};

use ferrotron_test_support::mpirun;
use ferrotron_test_support::skip::skip;

/// The job must end well before the hanging rank would wake up.
const BOUND: Duration = Duration::from_secs(20);
/// When a job that never ends is killed: past `BOUND`, with room for a
/// slow machine to still report its time against `BOUND`.
const DEADLINE: Duration = Duration::from_secs(60);

/// Runs `worker` of this binary on 3 ranks; returns whether `mpirun`
/// succeeded, its stdout and stderr, and how long it took.
fn mpirun_3(worker: &str) -> (bool, String, Duration) {
    let started = Instant::now();
    let (o, text) = mpirun::worker(3, &[], worker, DEADLINE);
    (o.status.success(), text, started.elapsed())
}

#[test]
fn a_rank_that_hangs_past_the_timeout_is_named_and_the_job_ends() {
    if !cfg!(feature = "mpi") {
        skip("built without the `mpi` feature; run `cargo test -p ferrotron-parallel --features mpi`");
        return;
    }
    let (ok, text, took) = mpirun_3("mpi_timeout::hanging_rank_worker");
    eprintln!("mpirun took {took:?}");
    assert!(!ok, "mpirun must fail:\n{text}");
    assert!(took < BOUND, "mpirun took {took:?}:\n{text}");
    for rank in [0, 1] {
        let want = format!(
            "rank {rank} failed: all_reduce #2 did not complete within 2s: rank 2 never arrived (ranks 0, 1 did)"
        );
        assert!(text.contains(&want), "missing `{want}` in:\n{text}");
    }
}

#[test]
fn a_rank_that_exits_abruptly_ends_the_job() {
    if !cfg!(feature = "mpi") {
        skip("built without the `mpi` feature; run `cargo test -p ferrotron-parallel --features mpi`");
        return;
    }
    let (ok, text, took) = mpirun_3("mpi_timeout::exiting_rank_worker");
    eprintln!("mpirun took {took:?}");
    assert!(!ok, "mpirun must fail:\n{text}");
    assert!(took < BOUND, "mpirun took {took:?}:\n{text}");
}

/// Rank 2 sleeps past the timeout before the second all-reduce; ranks 0
/// and 1 print their error and abort the job.
#[test]
#[ignore = "runs under mpirun, started by a_rank_that_hangs_past_the_timeout_is_named_and_the_job_ends"]
fn hanging_rank_worker() {
    #[cfg(feature = "mpi")]
    worker::run(|| std::thread::sleep(worker::HANG));
}

/// Rank 2 exits without finalizing MPI before the second all-reduce.
#[test]
#[ignore = "runs under mpirun, started by a_rank_that_exits_abruptly_ends_the_job"]
fn exiting_rank_worker() {
    #[cfg(feature = "mpi")]
    worker::run(|| std::process::exit(3));
}

#[cfg(feature = "mpi")]
mod worker {
    use std::io::Write;
    use std::time::Duration;

    use ferrotron_parallel::comm::{CommError, Communicator, MpiCommunicator};

    /// The communicator timeout of the workers.
    const TIMEOUT: Duration = Duration::from_secs(2);
    /// How long the hanging rank sleeps: far beyond the timeout.
    pub const HANG: Duration = Duration::from_secs(30);

    /// One all-reduce on every rank, then `lose_rank_2` on rank 2, then a
    /// second all-reduce. A rank whose all-reduce fails prints the error,
    /// checks that it names rank 2, and aborts the job, as the training
    /// loop does.
    pub fn run(lose_rank_2: impl FnOnce()) {
        let c = MpiCommunicator::init_with_timeout(TIMEOUT).unwrap();
        let r = c.rank();
        let mut buf = [1.0f32; 4];
        c.all_reduce_sum(&mut buf).unwrap();
        assert_eq!(buf, [3.0; 4]);
        if r == 2 {
            lose_rank_2();
        }
        match c.all_reduce_sum(&mut buf) {
            Ok(()) => panic!("rank {r}: the all-reduce without rank 2 completed"),
            Err(e) => {
                // One write, so that the lines of two ranks do not interleave.
                let line = format!("rank {r} failed: {e}\n");
                let _ = std::io::stderr().write_all(line.as_bytes());
                assert!(
                    matches!(&e, CommError::Timeout { lost, .. } if lost == &[2]),
                    "{e:?}"
                );
                // Let the other live rank print its error before MPI_Abort
                // ends every process.
                std::thread::sleep(Duration::from_secs(1));
                c.abort(1);
            }
        }
    }
}
