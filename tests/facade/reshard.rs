//! Sharded checkpoints reshard on load, through `Job` and `Resume`: a
//! job's step-3 checkpoint, written per rank in one layout, resumes in
//! another (TP, PP with interleaving, CP, DP, ZeRO stage and rank count all
//! changed), and steps 4 and 5 and the final weights equal the
//! uninterrupted one-rank job's (grad-accum 4, global batch 8) within the
//! equivalence tolerances of the layouts involved:
//! - gpt-mini tp2 x dp2 ZeRO-1 (a vocabulary padded over TP, an embedding
//!   tied to the head) resumes on one rank, on a pp2 pipeline (the tied
//!   embedding held by both end stages) and as tp2 x dp2 ZeRO-3;
//! - an interleaved pp2 checkpoint of llama-mini resumes as tp2 x dp2;
//! - the one-rank llama-mini checkpoint resumes as dp2 ZeRO-3, as cp2
//!   (whose data-parallel degree is 1, so the global batch is kept at the
//!   same grad-accum) and as tp2 x pp2 x dp2 (8 ranks, oversubscribed).
//!
//! Each resume continues a copy of its source run, opened with
//! [`Resume::open`] and validated with the run's own configuration in the
//! new layout ([`Resume::validate`]), as `ferrotron train --resume` does.
//! Four `mpirun` launches of this binary's worker ([`LAUNCHES`]: 2, 4, 2
//! and 8 ranks), each running the multi-rank source jobs of its rank count
//! and then the resumes whose source exists by then (rank 0 copies the
//! source, the others wait at a barrier); the one-rank jobs and resumes
//! run in the test's process. Refused resumes (another model, another
//! global batch, `--override`) are tested in the `cli` binary.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferrotron::job::config::PpSchedule;
use ferrotron::job::{ConfigError, PrintReport, Resume, ValidJob, World};
use ferrotron::parallel::comm::Communicator;
use ferrotron::parallel::zero::ZeroStage;
use ferrotron::{Job, JobConfig};

use crate::equivalence::jobs::{
    launch_with, mpi_built, run_prepared_on_every_rank, runs_dir, scratch, Prepare,
};
use crate::equivalence::layouts::{
    jobs_on, layout_run, one_rank, plain, run_one_rank, Layout, ModelLayouts,
};
use ferrotron_test_support::runs::{check_weights, copy_dir, step_records};

/// Largest difference between a resumed run's weights and the one-rank
/// run's, relative to the model's largest weight: the tolerance of the
/// tensor-parallel equivalence tests (`tensor_parallel`, which explains
/// it), since most resumed runs here have TP or CP on one side (CP's ring
/// rounds as TP does: `context_parallel`).
const MODEL_TOLERANCE: f32 = 1e-4;

/// Largest difference within one tensor, relative to its own largest
/// weight (`tensor_parallel`'s `TENSOR_TOLERANCE`).
const TENSOR_TOLERANCE: f32 = 5e-3;

/// The rank counts of the `mpirun` launches, in order: a resume runs in
/// the first launch of its rank count after its source job ran (gpt-mini's
/// 4-rank source resumes on 2 ranks, llama-mini's 2-rank one on 4).
const LAUNCHES: [usize; 4] = [2, 4, 2, 8];

/// The environment variable that tells a worker which of [`LAUNCHES`] it is.
const LAUNCH_ENV: &str = "FERROTRON_TEST_RESHARD_LAUNCH";

/// A checkpoint's model, the layout it is written in (one rank: the
/// one-rank reference job itself) and the layouts it resumes in.
struct Reshard {
    model: &'static str,
    from: Layout,
    to: Vec<Layout>,
}

/// A layout named `name` on `ranks` ranks with grad-accum `accum`.
fn layout(name: &'static str, ranks: usize, accum: usize, set: fn(&mut JobConfig)) -> Layout {
    Layout {
        name,
        ranks,
        accum,
        set,
    }
}

/// The checkpoints and their new layouts. A resumed job starts from the
/// run's own configuration, so each target layout sets every layout key
/// that differs from the source's.
fn reshards() -> Vec<Reshard> {
    let one = layout("one", 1, 4, |c| {
        c.parallelism.tp = 1;
        c.parallelism.pp = 1;
        c.parallelism.zero = ZeroStage::Off;
    });
    vec![
        Reshard {
            model: "gpt-mini",
            from: layout("tp2-dp2-zero1", 4, 2, |c| {
                c.parallelism.tp = 2;
                c.parallelism.zero = ZeroStage::One;
            }),
            to: vec![
                one,
                layout("pp2", 2, 4, |c| {
                    c.parallelism.tp = 1;
                    c.parallelism.pp = 2;
                    c.parallelism.zero = ZeroStage::Off;
                }),
                layout("tp2-dp2-zero3", 4, 2, |c| {
                    c.parallelism.tp = 2;
                    c.parallelism.zero = ZeroStage::Three;
                }),
            ],
        },
        Reshard {
            model: "llama-mini",
            from: layout("pp2-interleaved", 2, 4, |c| {
                c.parallelism.pp = 2;
                c.parallelism.pp_schedule = PpSchedule::Interleaved;
                c.parallelism.pp_virtual = 2;
            }),
            to: vec![layout("tp2-dp2", 4, 2, |c| {
                c.parallelism.tp = 2;
                c.parallelism.pp = 1;
                c.parallelism.pp_schedule = PpSchedule::OneFOneB;
                c.parallelism.pp_virtual = 1;
            })],
        },
        Reshard {
            model: "llama-mini",
            from: one_rank(4),
            to: vec![
                layout("dp2-zero3", 2, 2, |c| c.parallelism.zero = ZeroStage::Three),
                // dp 1: the global batch is kept at the same grad-accum.
                layout("cp2", 2, 4, |c| c.parallelism.cp = 2),
                layout("tp2-pp2-dp2", 8, 2, |c| {
                    c.parallelism.tp = 2;
                    c.parallelism.pp = 2;
                }),
            ],
        },
    ]
}

/// The minis, each with no setting beyond its layouts', and the
/// multi-rank source layouts among `cases`.
fn sources(cases: &[Reshard]) -> Vec<ModelLayouts> {
    let mut models: Vec<ModelLayouts> = Vec::new();
    for case in cases.iter().filter(|c| c.from.ranks > 1) {
        match models.iter_mut().find(|(m, ..)| *m == case.model) {
            Some((_, _, layouts)) => layouts.push(case.from),
            None => models.push((case.model, plain, vec![case.from])),
        }
    }
    models
}

/// The run directory of the copy of `case`'s source resumed in `to`.
fn resumed_run(runs: &Path, case: &Reshard, to: &Layout) -> PathBuf {
    runs.join(format!("{}-{}-to-{}", case.model, case.from.name, to.name))
}

/// The copy `run` resumed from its step-3 checkpoint in layout `to`,
/// validated for `world` (`ferrotron train --resume RUN/checkpoints/step-3
/// --grad-accum N` with `to`'s layout flags).
fn resumed_job(run: &Path, to: &Layout, world: &World) -> Result<ValidJob, Vec<ConfigError>> {
    let checkpoint = run.join("checkpoints").join("step-3");
    let resume =
        Resume::open(&checkpoint).unwrap_or_else(|e| panic!("{}: {e:#}", checkpoint.display()));
    let mut config = resume.config.clone();
    config.schedule.grad_accum = to.accum;
    (to.set)(&mut config);
    resume.validate(&config, world)
}

/// The launch a source job runs in: the first of its rank count (`None`
/// for a one-rank source, the reference job run before the launches).
fn source_launch(case: &Reshard) -> Option<usize> {
    LAUNCHES.iter().position(|&n| n == case.from.ranks)
}

/// The launch `case`'s resume in `to` runs in: the first of `to`'s rank
/// count at or after its source's, where `LAUNCHES.len()` stands for the
/// test's process after the launches (one rank); `None` if there is none.
fn resume_launch(case: &Reshard, to: &Layout) -> Option<usize> {
    let ranks = |i: usize| LAUNCHES.get(i).copied().unwrap_or(1);
    (0..=LAUNCHES.len())
        .find(|&i| ranks(i) == to.ranks && source_launch(case).is_none_or(|s| s <= i))
}

/// The resumes of launch `launch` ([`resume_launch`]), in `runs`: each
/// its label, target layout, source run and copy.
fn resumes_of(launch: usize, runs: &Path) -> Vec<(String, Layout, PathBuf, PathBuf)> {
    let mut out = Vec::new();
    for case in &reshards() {
        for to in &case.to {
            if resume_launch(case, to) == Some(launch) {
                let label = format!("{} {} -> {}", case.model, case.from.name, to.name);
                let source = layout_run(case.model, runs, &case.from);
                out.push((label, *to, source, resumed_run(runs, case, to)));
            }
        }
    }
    out
}

/// Checks the resumed run of `case` in `to` against the one-rank run
/// `single`: steps 4 and 5 resumed (replacing the copy's records), whose losses are within
/// 1e-5 relative of the one-rank run's, and the weights within
/// [`MODEL_TOLERANCE`] and [`TENSOR_TOLERANCE`].
fn check(runs: &Path, case: &Reshard, to: &Layout, single: &Path) {
    let label = format!("{} {} -> {}", case.model, case.from.name, to.name);
    let resumed = resumed_run(runs, case, to);
    let losses = |run: &Path| -> Vec<(u64, f64)> {
        step_records(run)
            .iter()
            .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
            .collect()
    };
    let (got, want) = (losses(&resumed), losses(single));
    assert_eq!(
        got.len(),
        5,
        "{label}: steps 4 and 5 resumed, each recorded once"
    );
    for ((s, g), (_, w)) in got[3..].iter().zip(&want[3..]) {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs(),
            "{label}: resumed step {s}: {g} vs {w}"
        );
    }
    check_weights(&label, &resumed, single, MODEL_TOLERANCE, TENSOR_TOLERANCE);
}

#[test]
fn sharded_checkpoints_resume_in_other_layouts_and_rank_counts_equal_to_one_rank() {
    if !mpi_built() {
        return;
    }
    let runs = scratch("reshard");
    let cases = reshards();
    for case in &cases {
        for to in &case.to {
            let label = format!("{} {} -> {}", case.model, case.from.name, to.name);
            assert!(
                resume_launch(case, to).is_some(),
                "{label}: no launch runs it"
            );
        }
    }
    let mut singles = Vec::new();
    for case in &cases {
        if !singles.iter().any(|(m, _)| *m == case.model) {
            singles.push((case.model, run_one_rank(case.model, &runs, 4, plain)));
        }
    }
    for (i, ranks) in LAUNCHES.into_iter().enumerate() {
        let env = [(LAUNCH_ENV, i.to_string())];
        launch_with(ranks, "reshard::worker", &runs, &env);
    }
    for (label, to, source, copy) in resumes_of(LAUNCHES.len(), &runs) {
        copy_dir(&source, &copy);
        let valid = resumed_job(&copy, &to, &World::SINGLE)
            .unwrap_or_else(|e| panic!("{label}: the job is refused: {e:?}"));
        Job::new(valid)
            .and_then(|job| job.run(&mut PrintReport))
            .unwrap_or_else(|e| panic!("{label}: {e:#}"));
    }
    for case in &cases {
        let single = &singles.iter().find(|(m, _)| *m == case.model).unwrap().1;
        for to in &case.to {
            check(&runs, case, to, single);
        }
    }
    let _ = std::fs::remove_dir_all(&runs);
}

/// Every rank of one launch of [`LAUNCHES`] (which one: [`LAUNCH_ENV`]):
/// the source jobs of its rank count (the first launch of that count),
/// then its resumes, each of a copy that rank 0 makes while the others
/// wait. Run only under mpirun by the test above.
#[test]
#[ignore = "runs under mpirun, started by sharded_checkpoints_resume_in_other_layouts_and_rank_counts_equal_to_one_rank"]
fn worker() {
    let launch: usize = std::env::var(LAUNCH_ENV)
        .unwrap_or_else(|_| panic!("{LAUNCH_ENV} is not set: the worker runs under the test"))
        .parse()
        .unwrap();
    let ranks = LAUNCHES[launch];
    let runs = runs_dir();
    let mut jobs: Vec<(String, Prepare)> = Vec::new();
    let first: Vec<Reshard> = reshards()
        .into_iter()
        .filter(|case| source_launch(case) == Some(launch))
        .collect();
    for (label, config) in jobs_on(ranks, &runs, &sources(&first)) {
        let prepare = move |world: &World, _: &Arc<dyn Communicator>| config.validate(world);
        jobs.push((label, Box::new(prepare)));
    }
    for (label, to, source, copy) in resumes_of(launch, &runs) {
        let prepare = move |world: &World, comm: &Arc<dyn Communicator>| {
            if world.rank == 0 {
                copy_dir(&source, &copy);
            }
            comm.barrier().unwrap();
            resumed_job(&copy, &to, world)
        };
        jobs.push((label, Box::new(prepare)));
    }
    run_prepared_on_every_rank(jobs);
}
