//! Layouts of the TP, PP and CP equivalence tests: each is a 5-step job of
//! a mini with a checkpoint at step 3, on some ranks, compared with the
//! one-rank job of the same global batch.

use std::path::{Path, PathBuf};

use ferrotron::JobConfig;

use super::jobs::{mini_job, run_single};

/// A multi-rank layout: its name, ranks, grad-accum (micro-batches of 2
/// sequences per DP rank and step) and what it sets in the job.
#[derive(Clone, Copy)]
pub struct Layout {
    pub name: &'static str,
    pub ranks: usize,
    pub accum: usize,
    pub set: fn(&mut JobConfig),
}

/// A mini, what every one of its jobs sets (the one-rank job's too)
/// before its layout's settings, and its layouts.
pub type ModelLayouts = (&'static str, fn(&mut JobConfig), Vec<Layout>);

/// No setting beyond the layout's.
pub fn plain(_: &mut JobConfig) {}

/// The one-rank layout with grad-accum `accum`.
pub fn one_rank(accum: usize) -> Layout {
    Layout {
        name: "single",
        ranks: 1,
        accum,
        set: |_| {},
    }
}

/// The job of `model` in `layout`, in `runs/{model}-{name}`: 5 steps, a
/// checkpoint at step 3 (and after the last), with `extra` applied to
/// every layout of the model before the layout's own settings.
pub fn layout_job(
    model: &str,
    runs: &Path,
    layout: &Layout,
    extra: fn(&mut JobConfig),
) -> JobConfig {
    let name = format!("{model}-{}", layout.name);
    let mut c = mini_job(model, runs, &name, 5, layout.accum);
    c.checkpoint.save_every = Some(3);
    extra(&mut c);
    (layout.set)(&mut c);
    c
}

/// The run directory of [`layout_job`].
pub fn layout_run(model: &str, runs: &Path, layout: &Layout) -> PathBuf {
    runs.join(format!("{model}-{}", layout.name))
}

/// Runs the one-rank job of `model` (grad-accum `accum`) in this process;
/// returns its run directory.
pub fn run_one_rank(model: &str, runs: &Path, accum: usize, extra: fn(&mut JobConfig)) -> PathBuf {
    run_single(model, layout_job(model, runs, &one_rank(accum), extra))
}

/// The jobs of a worker on `ranks` ranks: of each of `models`, the
/// layouts of that many ranks.
pub fn jobs_on(ranks: usize, runs: &Path, models: &[ModelLayouts]) -> Vec<(String, JobConfig)> {
    let mut jobs = Vec::new();
    for (model, extra, layouts) in models {
        for layout in layouts.iter().filter(|l| l.ranks == ranks) {
            let label = format!("{model} {}", layout.name);
            jobs.push((label, layout_job(model, runs, layout, *extra)));
        }
    }
    jobs
}
