//! The timeout of an NCCL communicator's operations: a watchdog thread
//! that ends the process when an operation runs past it.
//!
//! An NCCL call that waits for a rank that never comes cannot be
//! interrupted from the thread that made it, and the library does not say
//! which ranks are missing. As PyTorch's NCCL watchdog does
//! (`TORCH_NCCL_ASYNC_ERROR_HANDLING`), a thread per communicator watches
//! the operation in flight; past the timeout it writes one line naming the
//! operation, its number and the timeout to stderr and ends the process
//! with exit code 1, upon which the launcher (`mpirun`, `srun`) ends the
//! other ranks. The thread sleeps on a condition variable between
//! operations; an operation costs two lock round trips.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The operation in flight and whether the communicator is gone.
#[derive(Default)]
struct State {
    /// Name, number and start of the operation in flight.
    current: Option<(&'static str, u64, Instant)>,
    /// Set when the communicator is dropped: the thread ends.
    closed: bool,
}

/// What the thread and the communicator share.
type Shared = Arc<(Mutex<State>, Condvar)>;

/// The watchdog of one communicator; its thread ends when it is dropped.
pub(super) struct Watchdog {
    shared: Shared,
    thread: Option<JoinHandle<()>>,
}

/// An operation under watch; dropping it ends the watch.
pub(super) struct Watched<'a>(&'a Watchdog);

impl Watchdog {
    /// Starts the thread. `rank` (this process's rank in the whole job)
    /// and `transport` ("NCCL") are named in the line written on timeout.
    pub(super) fn start(
        rank: usize,
        transport: &'static str,
        timeout: Duration,
    ) -> std::io::Result<Self> {
        let shared: Shared = Arc::default();
        let theirs = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("{transport} watchdog"))
            .spawn(move || watch(&theirs, rank, transport, timeout))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Watches operation `op` #`seq` until the returned guard is dropped.
    pub(super) fn watch(&self, op: &'static str, seq: u64) -> Watched<'_> {
        self.lock().current = Some((op, seq, Instant::now()));
        self.shared.1.notify_one();
        Watched(self)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.shared)
    }
}

impl Drop for Watched<'_> {
    fn drop(&mut self) {
        self.0.lock().current = None;
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.lock().closed = true;
        self.shared.1.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The state, even if a panicking holder poisoned the lock.
fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.0.lock().unwrap_or_else(|e| e.into_inner())
}

/// The thread: sleeps until an operation is in flight, then until its
/// deadline; ends the process if it is still in flight then.
fn watch(shared: &Shared, rank: usize, transport: &str, timeout: Duration) {
    let mut state = lock(shared);
    loop {
        if state.closed {
            return;
        }
        state = match state.current {
            None => shared.1.wait(state).unwrap_or_else(|e| e.into_inner()),
            Some((op, seq, started)) => {
                let left = timeout.saturating_sub(started.elapsed());
                if left.is_zero() {
                    // One write, so that the lines of two ranks do not interleave.
                    let line = format!(
                        "error (rank {rank}): {op} #{seq} did not complete within {timeout:?} on {transport} \
                         ({transport} does not say which ranks are missing); ending this process so that the launcher ends the job\n"
                    );
                    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
                    std::process::exit(1);
                }
                shared
                    .1
                    .wait_timeout(state, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
        };
    }
}
