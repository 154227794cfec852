//! The step-1 gradient of a job, per tensor and whole whatever the layout,
//! the weights of a short one-rank run, and how two of them are compared
//! (shared by `gradients_parallel` and `gradients_precision`).
//!
//! The gradient is read where the trainer keeps it after the sync: the
//! jobs here set `optimizer.beta1 = 0` and `optimizer.grad_clip = 0`, so
//! AdamW's first moment after one step is `m = 0 * 0 + 1 * g = g`, exactly,
//! the gradient averaged over the DP group and clipped by nothing; the
//! trainer's checkpoint holds it as `m.NAME` in every rank's share (TP
//! blocks, pipeline stages, ZeRO pieces), read back whole by the
//! checkpoint reader.
//! [`step_one`] checks that reading against the step's own gradient norm.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use burn::backend::{Autodiff, Flex};
use burn::tensor::TensorData;
use ferrotron_engine::data::Batch;
use ferrotron_job::{parallelize, JobConfig, Parallelized, ValidJob, World};
use ferrotron_models::Decoder;
use ferrotron_parallel::groups::ProcessGroups;
use ferrotron_parallel::train::checkpoint::read::Reader;
use ferrotron_parallel::train::{StepOutput, Trainer};

/// The backend of the one-rank and multi-rank runs: f32 on the CPU.
type B = Autodiff<Flex>;

/// Vocabulary of the jobs (the CLI tests' `--vocab-size 300`).
pub const VOCAB: usize = 300;
/// Tokens per sequence.
pub const SEQ: usize = 16;
/// Sequences per micro-batch.
pub const ROWS: usize = 2;
/// Micro-batches in the global batch.
pub const MICRO_BATCHES: usize = 4;

/// Whole tensors (gradients or weights) by parameter name.
pub type Tensors = BTreeMap<String, TensorData>;

/// The job of `model` on `world` (vocabulary [`VOCAB`], micro-batches of
/// [`ROWS`] x [`SEQ`], [`MICRO_BATCHES`] of them per step over the DP
/// group, AdamW's `beta1` 0 and no clipping: see the module doc), with
/// `layout` applied to the configuration before it is validated.
pub fn job(model: &str, world: &World, layout: impl FnOnce(&mut JobConfig)) -> ValidJob {
    let mut c = JobConfig::default();
    c.model.name = model.into();
    c.model.vocab_size = Some(VOCAB);
    c.schedule.seq_len = SEQ;
    c.schedule.micro_batch = ROWS;
    c.schedule.steps = 1;
    c.optimizer.beta1 = 0.0;
    c.optimizer.grad_clip = 0.0;
    c.checkpoint.out = Some(std::env::temp_dir().join("ferrotron-gradients-never-written"));
    layout(&mut c);
    let par = &c.parallelism;
    let dp = world.world_size / (par.tp * par.cp * par.pp);
    c.schedule.grad_accum = MICRO_BATCHES / dp;
    c.validate(world)
        .unwrap_or_else(|e| panic!("{model}: the job is refused: {e:?}"))
}

/// The global batch: [`MICRO_BATCHES`] micro-batches of [`ROWS`] x [`SEQ`]
/// token ids in `0..VOCAB` from a fixed linear congruential sequence,
/// targets the next id of the same sequence.
pub fn global_batch() -> Vec<Batch> {
    let mut x: u64 = 0x5eed;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((x >> 33) % VOCAB as u64) as i64
    };
    (0..MICRO_BATCHES)
        .map(|_| {
            let (mut inputs, mut targets) = (Vec::new(), Vec::new());
            for _ in 0..ROWS {
                let ids: Vec<i64> = (0..=SEQ).map(|_| next()).collect();
                inputs.extend_from_slice(&ids[..SEQ]);
                targets.extend_from_slice(&ids[1..]);
            }
            Batch {
                inputs,
                targets,
                batch: ROWS,
                seq_len: SEQ,
            }
        })
        .collect()
}

/// The step-1 gradient of `job` on `groups` (a collective: every rank of
/// the job calls it): the model built from the job's seed as `Job` builds
/// it, [`parallelize`]d, one step over this DP rank's share of
/// [`global_batch`], the first moments gathered whole. Checks that their
/// norm is the step's gradient norm (relative 1e-5: f32 sums in another
/// order) and that the step was applied.
pub fn step_one(job: &ValidJob, groups: ProcessGroups) -> Tensors {
    let (trainer, out) = first_step(job, groups.clone());
    assert!(!out.skipped, "step 1 was not applied: {out:?}");
    let whole = whole_state(&trainer, &groups);
    let grads: Tensors = whole
        .iter()
        .filter_map(|(name, data)| Some((name.strip_prefix("m.")?.to_string(), data.clone())))
        .collect();
    let params = whole
        .keys()
        .filter(|n| !n.starts_with("m.") && !n.starts_with("v."))
        .count();
    assert_eq!(grads.len(), params, "a first moment per parameter");
    let squares: f64 = grads
        .values()
        .flat_map(values)
        .map(|g| f64::from(g) * f64::from(g))
        .sum();
    let norm = squares.sqrt();
    assert!(
        (norm - out.grad_norm).abs() <= 1e-5 * out.grad_norm && norm > 0.0,
        "the first moments' norm {norm} is not the step's gradient norm {}",
        out.grad_norm
    );
    grads
}

/// The trainer of `job` on `groups` (the model built from the job's seed
/// as `Job` builds it, [`parallelize`]d) after one step over this DP
/// rank's share of [`global_batch`], and what the step reported. A
/// collective: every rank of the job calls it.
pub fn first_step(job: &ValidJob, groups: ProcessGroups) -> (Parallelized<B>, StepOutput) {
    let device = Default::default();
    let (dp, dp_rank) = (groups.mesh().dp, groups.coord().dp);
    let model = Decoder::<B>::new(job.model(), job.config().schedule.seed, &device).unwrap();
    let mut trainer = parallelize(model, groups, job, &device).unwrap();
    let batches = global_batch();
    let share = batches.len() / dp;
    let out = trainer
        .step(&batches[dp_rank * share..(dp_rank + 1) * share])
        .unwrap();
    (trainer, out)
}

/// The whole weights of `job` (one rank) before and after `steps`
/// optimizer steps, each over [`global_batch`]; every step applied.
pub fn weights_before_and_after(job: &ValidJob, steps: usize) -> (Tensors, Tensors) {
    let device = Default::default();
    let model = Decoder::<B>::new(job.model(), job.config().schedule.seed, &device).unwrap();
    let mut trainer = parallelize(model, ProcessGroups::single(), job, &device).unwrap();
    let whole = |t: &ferrotron_job::Parallelized<B>| -> Tensors {
        t.whole_parameters().unwrap().into_iter().collect()
    };
    let before = whole(&trainer);
    for step in 1..=steps {
        let out = trainer.step(&global_batch()).unwrap();
        assert!(!out.skipped, "step {step} was not applied: {out:?}");
    }
    (before, whole(&trainer))
}

/// Per tensor, `|got - want| / |want - init|` in the Euclidean norm: the
/// difference between two runs' weights relative to how far the reference
/// run moved that tensor from its initial value `init` (0 when equal,
/// infinite when only the reference stayed put), by name. Tensors that
/// [`changes_no_output`] are left out: their walks differ by design.
pub fn relative_to_movement(got: &Tensors, want: &Tensors, init: &Tensors) -> Vec<(String, f32)> {
    assert_eq!(got.len(), want.len(), "parameter count");
    let distance = |a: &[f32], b: &[f32]| {
        let squares: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
        squares.sqrt()
    };
    want.iter()
        .filter(|(name, _)| !changes_no_output(name))
        .map(|(name, w)| {
            let (g, w, i) = (values(&got[name]), values(w), values(&init[name]));
            assert!(g.iter().all(|x| x.is_finite()), "{name}: not finite");
            let diff = distance(&g, &w);
            let rel = if diff == 0.0 {
                0.0
            } else {
                diff / distance(&w, &i)
            };
            (name.clone(), rel as f32)
        })
        .collect()
}

/// `max |a - b|` over the elements.
fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "element count");
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// The f32 values of `data`.
pub fn values(data: &TensorData) -> Vec<f32> {
    data.to_vec::<f32>().unwrap()
}

/// Whether the parameter `name` changes no output: the attention key bias
/// adds `q . b` to every score of a query, which the softmax takes away.
/// Its gradient is zero in exact arithmetic, so the computed one is
/// rounding noise, which AdamW's normalised update turns into a random
/// walk of the bias.
pub fn changes_no_output(name: &str) -> bool {
    name.ends_with("attn.k.bias")
}

/// Per tensor, `max |got - want| / max |want|` (0 when both are zero,
/// infinite when only `want` is), by name; panics if the names or shapes
/// differ. A tensor that [`changes_no_output`] is measured against the
/// largest `|want|` of the whole model instead of its own noise.
pub fn relative_errors(got: &Tensors, want: &Tensors) -> Vec<(String, f32)> {
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "parameter names"
    );
    let largest = |w: &[f32]| w.iter().fold(0f32, |m, x| m.max(x.abs()));
    let model = want
        .values()
        .map(|w| largest(&values(w)))
        .fold(0f32, f32::max);
    want.iter()
        .map(|(name, w)| {
            let g = &got[name];
            assert_eq!(g.shape, w.shape, "{name}: shape");
            let (g, w) = (values(g), values(w));
            let scale = if changes_no_output(name) {
                model
            } else {
                largest(&w)
            };
            let diff = max_abs_diff(&g, &w);
            assert!(g.iter().all(|x| x.is_finite()), "{name}: not finite");
            let rel = if diff == 0.0 { 0.0 } else { diff / scale };
            (name.clone(), rel)
        })
        .collect()
}

/// The tensor with the largest [`relative_errors`] entry.
pub fn worst(errors: &[(String, f32)]) -> (String, f32) {
    errors
        .iter()
        .cloned()
        .fold((String::new(), 0.0), |a, b| if b.1 > a.1 { b } else { a })
}

/// Every tensor of `trainer`'s checkpoint, whole (a collective: every rank
/// of `groups` writes its share into one temporary directory, which rank 0
/// removes once every rank has read it).
fn whole_state(trainer: &Trainer<B, Decoder<B>>, groups: &ProcessGroups) -> Tensors {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let world = groups.world();
    // Rank 0's process id names the directory on every rank.
    let mut pid = [std::process::id() as f32];
    world.broadcast(&mut pid, 0).unwrap();
    let call = CALLS.fetch_add(1, Ordering::SeqCst);
    let root = std::env::temp_dir().join(format!("ferrotron-gradients-{}-{call}", pid[0]));
    trainer.write_checkpoint(&root, None, &[], 1).unwrap();
    world.barrier().unwrap();
    let whole = Reader::open(&root.join("step-1"))
        .unwrap()
        .read_whole()
        .unwrap();
    world.barrier().unwrap();
    if world.rank() == 0 {
        std::fs::remove_dir_all(&root).unwrap();
    }
    whole
}
