//! Non-blocking collectives: `start` returns a [`Pending`] handle at once,
//! its `wait` returns the result, and the caller computes in between.
//!
//! A [`CommThread`] owns the operations of one communicator: a dedicated
//! thread runs the collectives started on it one after the other, in the
//! order they were started, each through the communicator's ordinary
//! (blocking, timed) call. Every rank starts the same collectives in the
//! same order, so every rank's thread runs them in the same order, as MPI
//! requires. A collective that times out fails exactly as it would on the
//! caller's thread ([`CommError::Timeout`] naming the ranks that never
//! arrived); `wait` returns that error.
//!
//! Why a thread rather than MPI's non-blocking requests kept open across
//! calls: the MPI communicator already runs each operation as a
//! non-blocking request tested under its timeout, with the announcements
//! that name missing ranks, and that protocol assumes one operation at a
//! time per communicator (`comm/mpi`); a thread that calls those
//! operations keeps all of it unchanged, and works for every
//! [`Communicator`] (MPI, NCCL, one rank, the latency double). MPI runs at
//! `MPI_THREAD_SERIALIZED`: no two threads may be inside MPI at once, on
//! any communicator. So while collectives are in flight the caller must
//! not call this communicator, or any other MPI communicator, itself: it
//! waits for every pending handle first. The trainer overlaps only when
//! the DP group is the one group of more than one rank.
//!
//! The thread also keeps the clock of [`GradCommTimes`]: its own time in
//! collectives, the callers' time in `wait`, and how many collectives were
//! in flight at once.

use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use ferrotron_engine::metrics::GradCommTimes;

use super::{check_blocks, CommError, Communicator};

/// One collective for the thread to run.
type Job = Box<dyn FnOnce(&dyn Communicator) + Send>;

/// The clock of the collectives since the last [`CommThread::take_times`].
#[derive(Default)]
struct Clock {
    comm_s: f64,
    wait_s: f64,
    ops: u64,
    in_flight: u64,
    max_in_flight: u64,
}

fn lock(clock: &Mutex<Clock>) -> MutexGuard<'_, Clock> {
    clock.lock().unwrap_or_else(|e| e.into_inner())
}

/// A thread that runs the collectives of one communicator in the order
/// they are started (see the module doc).
pub struct CommThread {
    comm: Arc<dyn Communicator>,
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    clock: Arc<Mutex<Clock>>,
}

impl CommThread {
    /// Starts the thread that will run `comm`'s collectives.
    ///
    /// # Errors
    /// The operating system refused a new thread.
    pub fn new(comm: Arc<dyn Communicator>) -> Result<Self, CommError> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let runs = Arc::clone(&comm);
        let thread = std::thread::Builder::new()
            .name("ferrotron-comm".into())
            .spawn(move || {
                for job in queue {
                    job(&*runs);
                }
            })
            .map_err(|e| CommError::Transport(format!("communication thread: {e}")))?;
        Ok(Self {
            comm,
            jobs: Some(jobs),
            thread: Some(thread),
            clock: Arc::default(),
        })
    }

    /// The communicator the collectives run on.
    pub fn comm(&self) -> &Arc<dyn Communicator> {
        &self.comm
    }

    /// Starts summing `buf` element-wise over the ranks; the handle's
    /// `wait` returns the sum (every rank gets it).
    pub fn start_all_reduce_sum(&self, mut buf: Vec<f32>) -> Pending<Vec<f32>> {
        self.start(move |c| c.all_reduce_sum(&mut buf).map(|()| buf))
    }

    /// Starts concatenating every rank's `send` (length `n`) in rank
    /// order; `wait` returns the `n * world_size` values.
    pub fn start_all_gather(&self, send: Vec<f32>) -> Pending<Vec<f32>> {
        self.start(move |c| {
            let mut recv = vec![0.0; send.len() * c.world_size()];
            c.all_gather(&send, &mut recv).map(|()| recv)
        })
    }

    /// Starts summing `send` (length `n * world_size`) over the ranks;
    /// `wait` returns this rank's block of the sum (length `n`).
    pub fn start_reduce_scatter_sum(&self, send: Vec<f32>) -> Pending<Vec<f32>> {
        self.start(move |c| {
            let world = c.world_size();
            check_blocks("reduce_scatter_sum", send.len() / world, send.len(), world)?;
            let mut recv = vec![0.0; send.len() / world];
            c.reduce_scatter_sum(&send, &mut recv).map(|()| recv)
        })
    }

    /// Starts `op`, a collective that runs on a transport of its own (NCCL
    /// on device tensors, [`crate::comm::nccl::device::SharedCollectives`]),
    /// in order with the collectives started on this thread and on the
    /// same clock; `wait` returns its result.
    pub fn start_own<T: Send + 'static>(
        &self,
        op: impl FnOnce() -> Result<T, CommError> + Send + 'static,
    ) -> Pending<T> {
        self.start(move |_| op())
    }

    /// The clock since the last call (or since the thread started), reset.
    pub fn take_times(&self) -> GradCommTimes {
        let mut c = lock(&self.clock);
        let times = GradCommTimes::new(c.comm_s, c.wait_s, c.ops, c.max_in_flight);
        *c = Clock {
            in_flight: c.in_flight,
            max_in_flight: c.in_flight,
            ..Clock::default()
        };
        times
    }

    /// Queues `op` on the thread, timed.
    fn start<T: Send + 'static>(
        &self,
        op: impl FnOnce(&dyn Communicator) -> Result<T, CommError> + Send + 'static,
    ) -> Pending<T> {
        let (done, result) = mpsc::sync_channel(1);
        let clock = Arc::clone(&self.clock);
        let job: Job = Box::new(move |comm: &dyn Communicator| {
            let t = Instant::now();
            let out = op(comm);
            let dt = t.elapsed().as_secs_f64();
            {
                let mut c = lock(&clock);
                c.comm_s += dt;
                c.ops += 1;
            }
            send_result(&done, out);
        });
        {
            let mut c = lock(&self.clock);
            c.in_flight += 1;
            c.max_in_flight = c.max_in_flight.max(c.in_flight);
        }
        if let Some(jobs) = &self.jobs {
            // A thread that has ended drops the job and its sender: `wait`
            // then reports it.
            let _ = jobs.send(job);
        }
        Pending {
            result,
            clock: Arc::clone(&self.clock),
            waited: false,
        }
    }
}

/// Hands `out` to the waiting handle (which may have been dropped).
fn send_result<T>(done: &SyncSender<Result<T, CommError>>, out: Result<T, CommError>) {
    let _ = done.send(out);
}

impl Drop for CommThread {
    fn drop(&mut self) {
        // Closing the queue ends the thread once it has run what it holds.
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A collective started on a [`CommThread`] and not yet waited for.
pub struct Pending<T> {
    result: Receiver<Result<T, CommError>>,
    clock: Arc<Mutex<Clock>>,
    waited: bool,
}

impl<T> Pending<T> {
    /// Blocks until the collective has completed; returns its result, or
    /// its error (a timeout names the ranks that never arrived).
    pub fn wait(mut self) -> Result<T, CommError> {
        let t = Instant::now();
        let out = self.result.recv();
        let dt = t.elapsed().as_secs_f64();
        self.waited = true;
        {
            let mut c = lock(&self.clock);
            c.wait_s += dt;
            c.in_flight -= 1;
        }
        out.unwrap_or_else(|_| {
            Err(CommError::Transport(
                "the communication thread stopped before the collective completed".into(),
            ))
        })
    }
}

/// A reduction started on a [`CommThread`]: on its communicator's host
/// path (`f32` values), or on collectives of its own that return a `T`
/// (a device tensor: [`CommThread::start_own`]).
pub enum Started<T> {
    /// Through the communicator's host path.
    Host(Pending<Vec<f32>>),
    /// On the caller's own collectives.
    Own(Pending<T>),
}

impl<T> Drop for Pending<T> {
    fn drop(&mut self) {
        if !self.waited {
            lock(&self.clock).in_flight -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::SingleProcess;

    #[test]
    fn collectives_return_their_results_in_any_wait_order() {
        let t = CommThread::new(Arc::new(SingleProcess)).unwrap();
        let a = t.start_all_reduce_sum(vec![1.0, 2.0]);
        let b = t.start_all_gather(vec![3.0]);
        let c = t.start_reduce_scatter_sum(vec![4.0, 5.0]);
        assert_eq!(c.wait().unwrap(), [4.0, 5.0]);
        assert_eq!(a.wait().unwrap(), [1.0, 2.0]);
        assert_eq!(b.wait().unwrap(), [3.0]);
        let times = t.take_times();
        assert_eq!(times.ops, 3);
        assert_eq!(times.max_in_flight, 3);
        assert!(times.comm_s >= 0.0 && times.wait_s >= 0.0);
        let one = t.start_all_reduce_sum(vec![0.5]);
        assert_eq!(one.wait().unwrap(), [0.5]);
        let times = t.take_times();
        assert_eq!((times.ops, times.max_in_flight), (1, 1));
    }

    #[test]
    fn a_failing_collective_reports_its_error_at_wait() {
        let t = CommThread::new(Arc::new(SingleProcess)).unwrap();
        let bad = t.start(|c| c.send(&[1.0], 0, 7));
        let err = bad.wait().unwrap_err();
        assert!(err.to_string().contains("no peer"), "{err}");
    }
}
