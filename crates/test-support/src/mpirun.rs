//! A test binary's own ignored worker test run on several ranks under
//! Open MPI's `mpirun` (as root, oversubscribed: the tests share 2 cores),
//! killed after a deadline.

use std::process::{Command, Output};
use std::time::Duration;

use crate::deadline;

/// Runs the ignored test `worker` of the calling test binary on `ranks`
/// processes (one test thread each, output not captured), with `extra` arguments to `mpirun`
/// before the binary, killed after `deadline`. Returns the output and its
/// stdout and stderr as one text. Panics if `mpirun` cannot start.
pub fn worker(ranks: usize, extra: &[&str], worker: &str, deadline: Duration) -> (Output, String) {
    let exe = std::env::current_exe().expect("the test executable's path");
    let o = deadline::output_within(
        Command::new("mpirun")
            .args(["--allow-run-as-root", "--oversubscribe", "-np"])
            .arg(ranks.to_string())
            .args(extra)
            .arg(&exe)
            .args([
                "--ignored",
                "--exact",
                worker,
                "--test-threads=1",
                "--nocapture",
            ]),
        deadline,
    )
    .expect("mpirun runs (is Open MPI installed?)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o, text)
}

/// The process id of rank `rank` of the job that `mpirun` (process
/// `mpirun_pid`, on this host) started: the child of `mpirun` whose
/// environment says `OMPI_COMM_WORLD_RANK=rank`. `None` while there is none.
pub fn rank_pid(mpirun_pid: u32, rank: usize) -> Option<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{mpirun_pid}/task/{mpirun_pid}/children")).ok()?;
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    children
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == want.as_bytes()))
        })
}
