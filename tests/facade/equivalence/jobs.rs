//! The jobs of the equivalence tests: a small training job built in code,
//! run on one rank in the test's process or on several ranks by this
//! binary's workers under `mpirun`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ferrotron::job::comm::{open, Transport, MPI_BUILT};
use ferrotron::job::config::CommChoice;
use ferrotron::job::{ConfigError, PrintReport, ValidJob, World};
use ferrotron::parallel::comm::nccl::{NcclCommunicator, NcclLibrary, LIBRARY_ENV};
use ferrotron::parallel::comm::{Communicator, DEFAULT_TIMEOUT};
use ferrotron::parallel::launch::detect;
use ferrotron::{Job, JobConfig};
use ferrotron_test_support::{mpirun, skip::skip};

/// The environment variable that names the directory of a launch's runs
/// (passed to every rank with `mpirun -x`).
pub const RUNS_ENV: &str = "FERROTRON_TEST_RUNS";

/// Longest one `mpirun` launch may take before it is killed and fails the
/// test: far beyond its jobs' time, even on 2 shared cores.
pub const DEADLINE: Duration = Duration::from_secs(900);

/// `false` (and a printed skip) when the library was built without the
/// `mpi` feature.
pub fn mpi_built() -> bool {
    if !MPI_BUILT {
        skip(
            "built without the `mpi` feature; run with \
             `--features ferrotron/mpi` (scripts/test --mpi)",
        );
    }
    MPI_BUILT
}

/// A new empty directory `ferrotron-facade-{name}-{pid}` under the system
/// temp dir; it holds the corpus ([`corpus`]) and every run of one test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrotron-facade-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    write_corpus(&dir);
    dir
}

/// The corpus of the runs in `runs`: `runs/small.txt`.
pub fn corpus(runs: &Path) -> PathBuf {
    runs.join("small.txt")
}

/// A 400-line text corpus in [`corpus`] (the command-line tests' corpus).
fn write_corpus(runs: &Path) {
    ferrotron_test_support::corpus::write_lines(&corpus(runs));
}

/// The job of the equivalence runs: `model` with a 300-token vocabulary
/// trained on [`corpus`] of `runs`, `steps` steps of `accum` micro-batches
/// of 2 sequences of 32 tokens per DP rank, validated on 2 batches after
/// the last step, no end-of-run sample, an MFU peak of 1 TFLOP/s, into
/// `runs/name`. (The command-line tests' `--vocab-size 300 --seq-len 32
/// --micro-batch 2 --eval-batches 2 --sample-tokens 0 --peak-tflops 1`.)
pub fn mini_job(model: &str, runs: &Path, name: &str, steps: usize, accum: usize) -> JobConfig {
    let mut c = JobConfig::default();
    c.model.name = model.into();
    c.model.vocab_size = Some(300);
    c.data.corpus = Some(corpus(runs));
    c.schedule.seq_len = 32;
    c.schedule.micro_batch = 2;
    c.schedule.steps = steps;
    c.schedule.grad_accum = accum;
    c.schedule.eval_every = steps;
    c.schedule.eval_batches = 2;
    c.metrics.sample_tokens = 0;
    c.metrics.peak_tflops = Some(1.0);
    c.checkpoint.out = Some(runs.join(name));
    c
}

/// Validates `config` for one rank and runs it through [`Job`] in this
/// process; panics naming `label` if it is refused or fails. Returns its
/// run directory.
pub fn run_single(label: &str, config: JobConfig) -> PathBuf {
    let valid = config
        .validate(&World::SINGLE)
        .unwrap_or_else(|e| panic!("{label}: the job is refused: {e:?}"));
    let out = valid.out().to_path_buf();
    Job::new(valid)
        .and_then(|job| job.run(&mut PrintReport))
        .unwrap_or_else(|e| panic!("{label}: {e:#}"));
    out
}

/// Runs this binary's ignored test `worker` on `ranks` ranks under
/// `mpirun`, its runs going into `runs`; every rank must pass.
pub fn launch(ranks: usize, worker: &str, runs: &Path) {
    launch_with(ranks, worker, runs, &[]);
}

/// [`launch`] with the environment variables `env` (name, value) set on
/// every rank.
pub fn launch_with(ranks: usize, worker: &str, runs: &Path, env: &[(&str, String)]) {
    let mut vars = vec![format!("{RUNS_ENV}={}", runs.display())];
    vars.extend(env.iter().map(|(name, value)| format!("{name}={value}")));
    let extra: Vec<&str> = vars.iter().flat_map(|v| ["-x", v.as_str()]).collect();
    let (o, text) = mpirun::worker(ranks, &extra, worker, DEADLINE);
    assert!(o.status.success(), "{worker} on {ranks} ranks:\n{text}");
    assert_eq!(text.matches("1 passed").count(), ranks, "{text}");
}

/// In a worker: the directory of the launch's runs.
pub fn runs_dir() -> PathBuf {
    std::env::var_os(RUNS_ENV)
        .unwrap_or_else(|| panic!("{RUNS_ENV} is not set: workers run under launch()"))
        .into()
}

/// In a worker (every rank under `mpirun`): validates each of `jobs`
/// (label, configuration) for this launch's world and runs it through
/// [`Job::on`] ([`run_prepared_on_every_rank`]).
pub fn run_on_every_rank(jobs: Vec<(String, JobConfig)>) {
    let jobs = jobs.into_iter().map(|(label, config)| {
        let prepare: Prepare =
            Box::new(move |world: &World, _: &Arc<dyn Communicator>| config.validate(world));
        (label, prepare)
    });
    run_prepared_on_every_rank(jobs.collect());
}

/// How every rank of a worker validates one of its jobs, given the
/// launch's world and MPI communicator; every rank calls it at the same
/// point, so it may be collective (a barrier after rank 0 wrote files).
pub type Prepare =
    Box<dyn FnOnce(&World, &Arc<dyn Communicator>) -> Result<ValidJob, Vec<ConfigError>>>;

/// In a worker (every rank under `mpirun`): prepares each of `jobs`
/// (label, [`Prepare`]) and runs it through [`Job::on`], one after
/// another, on one world communicator: MPI's, or for the jobs with
/// `parallelism.comm = "nccl"` one NCCL communicator over it
/// ([`nccl_over`], opened at the first such job).
pub fn run_prepared_on_every_rank(jobs: Vec<(String, Prepare)>) {
    let world = detect().unwrap();
    let mpi = open(&world, Transport::Mpi, DEFAULT_TIMEOUT).unwrap();
    let mut nccl = None;
    for (label, prepare) in jobs {
        let valid =
            prepare(&world, &mpi).unwrap_or_else(|e| panic!("{label}: the job is refused: {e:?}"));
        let comm = match valid.config().parallelism.comm {
            CommChoice::Nccl => nccl.get_or_insert_with(|| nccl_over(&mpi)).clone(),
            CommChoice::Auto | CommChoice::Mpi => mpi.clone(),
        };
        Job::on(valid, comm)
            .and_then(|job| job.run(&mut PrintReport))
            .unwrap_or_else(|e| panic!("{label}: {e:#}"));
    }
}

/// An NCCL communicator over `world` (collective: every rank opens it at
/// the same job) on the library that `FERROTRON_NCCL_LIBRARY` names, as
/// `Job::new` opens for `parallelism.comm = "nccl"` on a CPU backend, here
/// over the launch's one MPI world (MPI starts once per process).
fn nccl_over(world: &Arc<dyn Communicator>) -> Arc<dyn Communicator> {
    let lib = NcclLibrary::load_from(std::env::var_os(LIBRARY_ENV).as_deref())
        .unwrap_or_else(|e| panic!("{LIBRARY_ENV}: {e}"));
    let nccl = NcclCommunicator::new(Arc::new(lib), world.clone(), DEFAULT_TIMEOUT)
        .unwrap_or_else(|e| panic!("starting NCCL: {e}"));
    Arc::new(nccl)
}
