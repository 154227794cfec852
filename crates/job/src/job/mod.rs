//! `Job`: a validated job run end to end on this rank — open the
//! communicator, read and tokenize the data, write the run directory, then
//! on the job's backend build or load the model, `parallelize` it, restore
//! a resumed run, train with checkpoints, and at the end export and sample.
//! `ferrotron train` is this plus argument parsing and a progress bar.
//!
//! ```no_run
//! use ferrotron_job::{JobConfig, Job, PrintReport, World};
//! let mut config = JobConfig::default();
//! config.schedule.steps = 20;
//! config.checkpoint.out = Some("runs/example".into());
//! let valid = config.validate(&World::SINGLE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
//! let summary = Job::new(valid)?.run(&mut PrintReport)?;
//! println!("{:?}", summary.map(|s| s.validations));
//! # Ok::<(), anyhow::Error>(())
//! ```

mod finish;
pub use finish::sample;
mod prepare;
mod train;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use ferrotron_parallel::comm::Communicator;
use ferrotron_parallel::train::{Progress, RunSummary};

use crate::backend::dispatch;
use crate::comm;
use crate::error::{Interrupted, UsageError};
use crate::validate::ValidJob;

/// Where a job's log lines and progress go (rank 0 only).
pub trait Report: Progress {
    /// One line of the job's log.
    fn line(&mut self, text: &str);
}

/// Prints the log lines on standard output and reports no progress.
pub struct PrintReport;

impl Progress for PrintReport {}

impl Report for PrintReport {
    fn line(&mut self, text: &str) {
        println!("{text}");
    }
}

/// A validated job with its communicator.
pub struct Job {
    valid: ValidJob,
    comm: Arc<dyn Communicator>,
    stop: Option<Arc<AtomicBool>>,
}

impl Job {
    /// The job with the communicator of its world (MPI, or NCCL over MPI;
    /// none for one rank).
    pub fn new(valid: ValidJob) -> anyhow::Result<Self> {
        let comm = comm::open(
            &valid.world,
            valid.transport.clone(),
            valid.config.comm_timeout(),
        )?;
        Ok(Self {
            valid,
            comm,
            stop: None,
        })
    }

    /// The job on `comm`, a communicator over the whole world that the
    /// caller opened, for several jobs in one process: MPI can be
    /// initialised once per process, so [`Job::new`] works once there.
    /// `comm` is used as it is: `parallelism.comm` and `comm_timeout_s`
    /// do not apply. Fails when `comm`'s rank or size is not the job's
    /// world's.
    pub fn on(valid: ValidJob, comm: Arc<dyn Communicator>) -> anyhow::Result<Self> {
        let world = &valid.world;
        if (comm.rank(), comm.world_size()) != (world.rank, world.world_size) {
            anyhow::bail!(
                "the communicator is rank {} of {}, the job's world rank {} of {}",
                comm.rank(),
                comm.world_size(),
                world.rank,
                world.world_size
            );
        }
        Ok(Self {
            valid,
            comm,
            stop: None,
        })
    }

    /// Stops the job after the current step, with a checkpoint, when `flag`
    /// is set (by SIGINT / SIGTERM in `ferrotron train`).
    pub fn with_stop(mut self, flag: Arc<AtomicBool>) -> Self {
        self.stop = Some(flag);
        self
    }

    /// Runs the job; rank 0 gets the loop's summary. In a multi-rank job an
    /// error or a panic on any rank (other than a requested stop) aborts
    /// the whole job (`MPI_Abort`, exit 2 for bad input, else 1) after
    /// printing it with the rank's number, instead of leaving the other
    /// ranks waiting.
    pub fn run(self, report: &mut dyn Report) -> anyhow::Result<Option<RunSummary>> {
        let comm = self.comm.clone();
        let result = if comm.world_size() > 1 {
            // The panic itself was printed by the panic hook; the abort
            // below names the rank.
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run_here(report)))
                .unwrap_or_else(|payload| {
                    Err(anyhow::anyhow!("panicked: {}", panic_text(&*payload)))
                })
        } else {
            self.run_here(report)
        };
        if let Err(e) = &result {
            if comm.world_size() > 1 && e.downcast_ref::<Interrupted>().is_none() {
                let code = if e.downcast_ref::<UsageError>().is_some() {
                    2
                } else {
                    1
                };
                // One write, so that the lines of two failing ranks do not interleave.
                let line = format!("error (rank {}): {e:#}\n", comm.rank());
                let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
                comm.abort(code);
            }
        }
        result
    }

    fn run_here(self, report: &mut dyn Report) -> anyhow::Result<Option<RunSummary>> {
        let Job {
            mut valid,
            comm,
            stop,
        } = self;
        if comm.rank() == 0 {
            for note in &valid.notes {
                report.line(note);
            }
        }
        let prepared = prepare::prepare(&mut valid, &comm, report)?;
        let (kind, gpu) = (valid.kind, valid.world.local_rank);
        let task = train::TrainTask {
            job: valid,
            prepared,
            comm,
            stop,
            report,
        };
        dispatch(kind, gpu, task)
    }
}

/// The message of a panic's payload (a `&str` or a `String`).
fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}
