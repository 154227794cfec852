//! A child process under a deadline, for the tests whose regression is a
//! hang (`mpirun` jobs that should end when a rank fails or times out).
//! Without a deadline such a regression hangs CI; with one, the test fails
//! with what the child printed.
//!
//! The child runs in its own process group, so `mpirun`, its daemons and
//! its ranks are killed together: killing `mpirun` alone would leave ranks
//! holding the output pipes open, and reading them would hang in turn.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The deadline of [`output`]: longer than any single test process runs.
pub const DEFAULT: Duration = Duration::from_secs(600);

/// [`output_within`] with the [`DEFAULT`] deadline; panics naming the
/// command if it cannot start.
pub fn output(cmd: &mut Command) -> Output {
    let what = format!("{cmd:?}");
    output_within(cmd, DEFAULT).unwrap_or_else(|e| panic!("{what} could not start: {e}"))
}

/// Runs `cmd` like `Command::output`, but if it has not ended after
/// `deadline`, kills its process group and panics with the command, the
/// deadline and everything it printed. An error only when it cannot start.
pub fn output_within(cmd: &mut Command, deadline: Duration) -> std::io::Result<Output> {
    spawn_within(cmd, deadline)?.finish()
}

/// A child started by [`spawn_within`], that the test may signal while it
/// runs; [`Watched::finish`] collects its output under the deadline.
pub struct Watched {
    what: String,
    child: Child,
    stdout: JoinHandle<Vec<u8>>,
    stderr: JoinHandle<Vec<u8>>,
    started: Instant,
    deadline: Duration,
}

/// Starts `cmd` in its own process group, its output read on threads; the
/// `deadline` counts from now. An error only when it cannot start.
pub fn spawn_within(cmd: &mut Command, deadline: Duration) -> std::io::Result<Watched> {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    Ok(Watched {
        what,
        child,
        stdout,
        stderr,
        started: Instant::now(),
        deadline,
    })
}

impl Watched {
    /// The child's process id (also its process group's).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (a name `kill -s` knows: `TERM`, `INT`, `USR1`,
    /// `KILL`) to process `pid` (the child or one of its descendants);
    /// panics if `kill` fails.
    pub fn signal(&self, pid: u32, signal: &str) {
        let ok = Command::new("kill")
            .args(["-s", signal, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -s {signal} {pid} failed ({})", self.what);
    }

    /// Waits, polling every 10 ms, until `ready()` holds; panics with what
    /// the child printed if it ends first or the deadline passes.
    pub fn wait_until(&mut self, waiting_for: &str, mut ready: impl FnMut() -> bool) {
        while !ready() {
            let ended = self.child.try_wait().ok().flatten();
            if ended.is_some() || self.started.elapsed() >= self.deadline {
                kill_group(&self.child);
                let _ = self.child.wait();
                panic!(
                    "{} ended ({ended:?}) or passed its deadline {:?} while the test waited for {waiting_for}",
                    self.what, self.deadline
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the child like `Command::output`; past the deadline, kills
    /// its process group and panics with everything it printed.
    pub fn finish(mut self) -> std::io::Result<Output> {
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break Some(status);
            }
            if self.started.elapsed() >= self.deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        // Also after a normal end: a process left in the group would keep the
        // pipes open.
        kill_group(&self.child);
        let timed_out = status.is_none();
        let status = match status {
            Some(status) => status,
            None => self.child.wait()?,
        };
        let (stdout, stderr) = (join(self.stdout), join(self.stderr));
        if timed_out {
            panic!(
                "{} was still running after {:?}: killed its process group (a hang)\n\
                 --- stdout ---\n{}\n--- stderr ---\n{}",
                self.what,
                self.deadline,
                String::from_utf8_lossy(&stdout),
                String::from_utf8_lossy(&stderr)
            );
        }
        Ok(Output {
            status,
            stdout,
            stderr,
        })
    }
}

/// Reads a pipe to its end on a thread, so a chatty child never blocks.
fn drain(pipe: Option<impl Read + Send + 'static>) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    })
}

fn join(reader: JoinHandle<Vec<u8>>) -> Vec<u8> {
    reader.join().unwrap_or_default()
}

/// SIGKILL to the child's process group (its pid: `process_group(0)`),
/// through the shell's `kill`, which every Debian image has.
fn kill_group(child: &Child) {
    let _ = Command::new("sh")
        .arg("-c")
        .arg(format!("kill -s KILL -- -{} 2>/dev/null", child.id()))
        .status();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_past_its_deadline_is_killed_with_its_descendants_and_fails_the_test() {
        // The background `sleep` holds the output pipe open: only killing the
        // whole group lets the reads end.
        let started = Instant::now();
        let result = std::panic::catch_unwind(|| {
            output_within(
                Command::new("sh").args(["-c", "echo started; sleep 30 & sleep 30"]),
                Duration::from_millis(500),
            )
        });
        let message = *result
            .expect_err("a hang must fail")
            .downcast::<String>()
            .unwrap();
        assert!(message.contains("killed its process group"), "{message}");
        assert!(message.contains("started"), "{message}");
        assert!(started.elapsed() < Duration::from_secs(10));

        let o = output_within(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(60),
        )
        .unwrap();
        assert_eq!(o.status.code(), Some(3));
        assert_eq!(
            (&o.stdout[..], &o.stderr[..]),
            (&b"out\n"[..], &b"err\n"[..])
        );
    }
}
