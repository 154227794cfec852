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
