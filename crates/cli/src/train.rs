//! `ferrotron train`: parse, validate, [`Job::run`], print. Everything a
//! training job does lives in the `ferrotron-job` library; this adds the
//! signal handlers and the progress bar.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context;
use ferrotron_engine::metrics::StepRecord;
use ferrotron_job::error::usage_lines;
use ferrotron_job::{Job, JobConfig, Report, Resume};
use ferrotron_parallel::launch;
use ferrotron_parallel::train::Progress;
use indicatif::{ProgressBar, ProgressStyle};
use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};

use crate::args::TrainArgs;
use crate::error::usage;

/// Runs `ferrotron train`. Every input is checked before anything is written.
///
/// In a multi-rank job (launched by `mpirun` or `srun`) every rank runs
/// this; rank 0 alone writes the run directory and prints progress, and an
/// error on any rank aborts the whole job.
pub fn train(args: TrainArgs) -> anyhow::Result<()> {
    let world = launch::detect().map_err(|e| usage(format!("launcher variables: {e}")))?;
    if args.job.model.is_some() && args.job.hf_dir.is_some() {
        return Err(usage(
            "--model with --hf-dir: the model comes from --hf-dir's config.json; give one of them",
        ));
    }
    if args.resume.is_none() && !args.overrides.is_empty() {
        return Err(usage(
            "--override without --resume: a new run takes its settings from --config and the flags",
        ));
    }
    let (mut config, resume) = match (&args.resume, &args.config) {
        (Some(_), Some(_)) => {
            return Err(usage(
                "--config with --resume: a resumed run keeps its own settings (give flags to change what may change)",
            ))
        }
        (Some(path), None) => {
            let r = Resume::open(path)?.overriding(args.overrides.clone());
            (r.config.clone(), Some(r))
        }
        (None, Some(path)) => (JobConfig::from_file(path).map_err(|e| usage_lines(&e))?, None),
        (None, None) => (JobConfig::default(), None),
    };
    args.job.apply(&mut config);
    if args.print_config {
        print!("{}", config.to_toml());
        return Ok(());
    }
    let valid = match resume {
        Some(r) => r.validate(&config, &world),
        None => config.validate(&world),
    }
    .map_err(|e| usage_lines(&e))?;
    let lead = world.rank == 0;
    let job = Job::new(valid)?.with_stop(stop_on_signals()?);
    let bar = if lead {
        ProgressBar::new(config.schedule.steps as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} step {pos}/{len} | {msg} | ETA {eta}")
            .expect("the progress template is valid"),
    );
    let result = job.run(&mut Bar(&bar));
    bar.finish_and_clear();
    result.map(|_| ())
}

/// A flag that SIGINT, SIGTERM and SIGUSR1 set (the loop then checkpoints
/// and stops after the current step); a second signal ends the process at
/// once with exit code 130, leaving the last checkpoint as it was.
///
/// SIGUSR1 is the one Open MPI's `mpirun` forwards to every rank and
/// nothing more: on SIGTERM or SIGINT it sends the ranks SIGTERM and,
/// a second later, SIGKILL (see docs/checkpoints.md).
fn stop_on_signals() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [SIGINT, SIGTERM, SIGUSR1] {
        // The shutdown hook first: it fires only if the flag is already set.
        signal_hook::flag::register_conditional_shutdown(signal, 130, stop.clone())
            .context("installing the signal handlers")?;
        signal_hook::flag::register(signal, stop.clone())
            .context("installing the signal handlers")?;
    }
    Ok(stop)
}

/// The progress bar and the log lines of `ferrotron train` (rank 0).
struct Bar<'a>(&'a ProgressBar);

impl Report for Bar<'_> {
    fn line(&mut self, text: &str) {
        self.0.suspend(|| println!("{text}"));
    }
}

impl Progress for Bar<'_> {
    fn step(&mut self, r: &StepRecord) {
        self.0.set_position(r.step as u64);
        let bubble = r.pipeline.as_ref().map_or(String::new(), |p| {
            format!(
                " | bubble {:.0}% (formula {:.0}%)",
                100.0 * p.bubble,
                100.0 * p.bubble_formula
            )
        });
        self.0.set_message(format!(
            "loss {:.4} | {:.0} tokens/s | MFU {:.1}%{bubble}",
            r.loss,
            r.tokens_per_s,
            100.0 * r.mfu
        ));
    }

    fn validation(&mut self, step: usize, val_loss: f64, last: Option<&StepRecord>) {
        let line = match last {
            None => format!("step {step}: val_loss {val_loss:.4}"),
            Some(r) => format!(
                "step {step}: loss {:.4} | val_loss {val_loss:.4} | {:.0} tokens/s | grad_norm {:.3} | lr {:.2e}",
                r.loss, r.tokens_per_s, r.grad_norm, r.lr
            ),
        };
        self.0.suspend(|| println!("{line}"));
    }
}
