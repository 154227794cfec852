//! ZeRO's code paths on one rank, in every build: stages 1, 2 and 3 with a
//! DP group of one, trained by the library's loop, must train exactly like
//! the plain trainer (stage 3 runs the block-by-block forward with
//! recomputation in backward), and the decoder's units must compose to its
//! loss and hold every parameter once. The multi-rank equivalence runs
//! under `mpirun` in tests/facade/data_parallel.rs (through `Job`).

use std::collections::HashSet;

use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param, ParamId};
use burn::tensor::{Int, Tensor, TensorData};
use ferrotron_engine::data::BatchSampler;
use ferrotron_engine::lm::{CausalLm, LmUnit, LmUnits};
use ferrotron_engine::optim::{AdamWConfig, LrSchedule};
use ferrotron_engine::params::named_tensors;
use ferrotron_models::presets::preset;
use ferrotron_models::{Decoder, DecoderConfig};
use ferrotron_parallel::groups::ProcessGroups;
use ferrotron_parallel::train::checkpoint::{self, read::Reader};
use ferrotron_parallel::train::{
    self, LoopConfig, ParallelConfig, Silent, StepConfig, TokenWindows, Trainer,
};
use ferrotron_parallel::zero::ZeroStage;

type B = Autodiff<Flex>;

fn tiny(name: &str) -> DecoderConfig {
    DecoderConfig {
        vocab_size: 64,
        hidden_size: 48,
        n_layers: 3,
        ffn_size: 96,
        max_seq_len: 32,
        ..preset(name).unwrap()
    }
}

/// The optimizer settings of a 3-step run (warm-up 1, clipping at 0.5).
fn three_steps() -> StepConfig {
    StepConfig {
        adamw: AdamWConfig::default(),
        schedule: LrSchedule {
            max_lr: 3e-3,
            min_lr: 3e-4,
            warmup_steps: 1,
            total_steps: 3,
        },
        grad_clip: 0.5,
    }
}

/// A token stream with structure to learn (vocabulary 64).
fn token_stream() -> Vec<u32> {
    (0..5_000u32).map(|i| (i * 7 + i / 13) % 64).collect()
}

/// ZeRO `stage` on a one-rank DP group, with tiny buckets so stages 1 and 2
/// cut parameters into many units.
fn one_rank(stage: ZeroStage) -> ParallelConfig {
    ParallelConfig {
        zero: stage,
        bucket_mb: 0.002,
        ..ParallelConfig::default()
    }
}

/// Trains 3 steps of 2 micro-batches, with the plain trainer or on one
/// rank with `parallel`; returns the losses and the weights.
fn train(
    config: &DecoderConfig,
    parallel: Option<ParallelConfig>,
) -> (Vec<f64>, Vec<(String, Vec<f32>)>) {
    let device = Default::default();
    let model = Decoder::<B>::new(config, 3, &device).unwrap();
    let step = three_steps();
    let mut trainer = match parallel {
        None => Trainer::new(model, step, device),
        Some(parallel) => {
            Trainer::parallel(model, step, device, ProcessGroups::single(), parallel).unwrap()
        }
    };
    let tokens = token_stream();
    let sampler = BatchSampler::new(tokens.len(), 16, 5).unwrap();
    let mut batches = TokenWindows {
        sampler,
        tokens: &tokens,
        vocab_size: config.vocab_size,
    };
    let val = [BatchSampler::new(tokens.len(), 16, 6)
        .unwrap()
        .next_batch(&tokens, 2)];
    let plan = LoopConfig {
        steps: 3,
        micro_batch: 2,
        grad_accum: 2,
        eval_every: 2,
        ..LoopConfig::default()
    };
    let summary = train::run(&mut trainer, &mut batches, &val, &plan, &mut Silent).unwrap();
    let losses = summary.steps.iter().map(|r| r.loss).collect();
    let weights = named_tensors(&trainer.full_model().unwrap().valid())
        .into_iter()
        .map(|(name, t)| (name, t.to_vec::<f32>().unwrap()))
        .collect();
    (losses, weights)
}

#[test]
fn zero_stages_on_one_rank_train_like_the_plain_trainer() {
    for family in ["gpt-mini", "llama-mini", "bloom-mini"] {
        let config = tiny(family);
        let (want_losses, want_weights) = train(&config, None);
        for stage in [ZeroStage::One, ZeroStage::Two, ZeroStage::Three] {
            let (losses, weights) = train(&config, Some(one_rank(stage)));
            for (a, b) in losses.iter().zip(&want_losses) {
                assert!(
                    (a - b).abs() <= 1e-5 * b.abs(),
                    "{family} zero {stage}: {losses:?} vs {want_losses:?}"
                );
            }
            let (mut diff, mut scale) = (0f32, 0f32);
            for ((name, w), (want_name, v)) in weights.iter().zip(&want_weights) {
                assert_eq!(name, want_name);
                for (p, q) in w.iter().zip(v) {
                    diff = diff.max((p - q).abs());
                    scale = scale.max(q.abs());
                }
            }
            assert!(
                diff <= 1e-5 * scale,
                "{family} zero {stage}: weights differ by {diff} (max weight {scale})"
            );
        }
    }
}

/// The optimizer offloaded to host memory (`--offload optimizer`: AdamW's
/// moments, and under ZeRO-3 the parameter pieces, updated on the CPU)
/// trains exactly like the optimizer on the device under stages 1, 2 and
/// 3: losses and weights bit for bit (on flex both run the same host
/// update per element). Library-level: the job refuses offload on flex.
#[test]
fn offloaded_optimizer_trains_bit_identically_under_every_stage() {
    let config = tiny("llama-mini");
    let bits = |l: &[f64]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for stage in [ZeroStage::One, ZeroStage::Two, ZeroStage::Three] {
        let (want_losses, want_weights) = train(&config, Some(one_rank(stage)));
        let offloaded = ParallelConfig {
            offload_optimizer: true,
            ..one_rank(stage)
        };
        let (losses, weights) = train(&config, Some(offloaded));
        assert_eq!(bits(&losses), bits(&want_losses), "zero {stage}");
        assert!(weights == want_weights, "zero {stage}: the weights differ");
    }
    let refused = ParallelConfig {
        offload_optimizer: true,
        ..ParallelConfig::default()
    };
    let model = Decoder::<B>::new(&config, 3, &Default::default()).unwrap();
    let built = Trainer::parallel(
        model,
        three_steps(),
        Default::default(),
        ProcessGroups::single(),
        refused,
    );
    assert!(
        matches!(built, Err(train::step::BuildError::OffloadWithoutZero)),
        "offload without ZeRO is refused"
    );
}

/// ZeRO-3 on one rank (overlap on: the DP group is the only group) with
/// its gathers started 0, 1 (the default) and 2 blocks ahead: the
/// gathers' order changes, not one bit of the losses or weights.
#[test]
fn zero3_prefetch_depths_train_bit_identically() {
    let config = tiny("gpt-mini");
    let with = |n: usize| {
        let parallel = ParallelConfig {
            zero3_prefetch: n,
            ..one_rank(ZeroStage::Three)
        };
        assert!(parallel.overlap_grad_reduce);
        train(&config, Some(parallel))
    };
    let (want_losses, want_weights) = with(1);
    for n in [0, 2] {
        let (losses, weights) = with(n);
        let bits = |l: &[f64]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&losses), bits(&want_losses), "prefetch {n}");
        assert!(weights == want_weights, "prefetch {n}: the weights differ");
    }
}

/// Collects the ids of the parameters visited.
struct Ids(Vec<ParamId>);

impl<B: burn::tensor::backend::Backend> ModuleVisitor<B> for Ids {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.0.push(param.id);
    }
}

#[test]
fn every_parameter_belongs_to_exactly_one_unit() {
    for family in ["gpt-mini", "llama-mini", "bloom-mini"] {
        let model = Decoder::<Flex>::new(&tiny(family), 11, &Default::default()).unwrap();
        let mut all = Ids(Vec::new());
        model.visit(&mut all);
        let mut seen = HashSet::new();
        for unit in LmUnit::all(model.num_blocks()) {
            let mut ids = Ids(Vec::new());
            model.visit_unit(unit, &mut ids);
            assert!(!ids.0.is_empty(), "{family}: {unit:?} is empty");
            for id in ids.0 {
                assert!(seen.insert(id), "{family}: {unit:?} repeats a parameter");
            }
        }
        assert_eq!(seen, all.0.into_iter().collect(), "{family}");
    }
}

#[test]
fn units_compose_to_the_loss() {
    for family in ["gpt-mini", "llama-mini", "bloom-mini"] {
        let device = Default::default();
        let model = Decoder::<Flex>::new(&tiny(family), 11, &device).unwrap();
        let ids: Vec<i64> = (0..2 * 9).map(|i| (i * 5 % 64) as i64).collect();
        let inputs =
            Tensor::<Flex, 2, Int>::from_data(TensorData::new(ids.clone(), [2, 9]), &device);
        let targets = Tensor::<Flex, 2, Int>::from_data(
            TensorData::new(ids.iter().map(|i| (i + 1) % 64).collect::<Vec<_>>(), [2, 9]),
            &device,
        );
        let whole: f32 = model.loss(inputs.clone(), targets.clone()).into_scalar();
        let (mut x, context) = model.embed(inputs);
        for i in 0..model.num_blocks() {
            x = model.block(i, x, &context);
        }
        let staged: f32 = model.head_loss(x, targets).into_scalar();
        assert_eq!(whole, staged, "{family}");
    }
}

#[test]
fn zero3_evaluation_equals_the_plain_trainers() {
    let config = tiny("bloom-mini");
    let device = Default::default();
    let step = StepConfig {
        adamw: AdamWConfig::default(),
        schedule: LrSchedule {
            max_lr: 1e-3,
            min_lr: 1e-4,
            warmup_steps: 1,
            total_steps: 1,
        },
        grad_clip: 1.0,
    };
    let tokens: Vec<u32> = (0..2_000u32).map(|i| (i * 3 + i / 7) % 64).collect();
    let batches = [BatchSampler::new(tokens.len(), 16, 2)
        .unwrap()
        .next_batch(&tokens, 3)];
    let plain = Trainer::new(
        Decoder::<B>::new(&config, 3, &device).unwrap(),
        step.clone(),
        device,
    );
    let model = Decoder::<B>::new(&config, 3, &device).unwrap();
    let parallel = ParallelConfig {
        zero: ZeroStage::Three,
        ..ParallelConfig::default()
    };
    let zero3 = Trainer::parallel(model, step, device, ProcessGroups::single(), parallel).unwrap();
    assert_eq!(
        plain.evaluate(&batches).unwrap(),
        zero3.evaluate(&batches).unwrap()
    );
}

/// A trainer's checkpoint written after 2 steps and loaded into a trainer
/// built from other weights continues exactly as the trainer that never
/// stopped, under every ZeRO stage (stage 3 writes and loads its parameter
/// pieces, the model holding placeholders), with the optimizer offloaded
/// to host memory (its host moments and pieces saved and restored) and
/// across a change of offload between the save and the load.
#[test]
fn trainer_state_restores_exactly_under_every_stage() {
    let config = tiny("llama-mini");
    let device = burn::backend::flex::FlexDevice;
    let step = three_steps();
    let tokens = token_stream();
    let mut sampler = BatchSampler::new(tokens.len(), 16, 5).unwrap();
    let batches: Vec<_> = (0..3)
        .map(|_| {
            [
                sampler.next_batch(&tokens, 2),
                sampler.next_batch(&tokens, 2),
            ]
        })
        .collect();
    let make = |stage, offload_optimizer, model| {
        let parallel = ParallelConfig {
            offload_optimizer,
            ..one_rank(stage)
        };
        Trainer::parallel(
            model,
            step.clone(),
            device,
            ProcessGroups::single(),
            parallel,
        )
        .unwrap()
    };
    let fresh = |seed| Decoder::<B>::new(&config, seed, &device).unwrap();
    let weights = |t: &Trainer<B, Decoder<B>>| -> Vec<Vec<f32>> {
        named_tensors(&t.full_model().unwrap().valid())
            .into_iter()
            .map(|(_, d)| d.to_vec::<f32>().unwrap())
            .collect()
    };
    // (stage, offloaded when written, offloaded when loaded)
    for (stage, saved, loaded) in [
        (ZeroStage::Off, false, false),
        (ZeroStage::One, false, false),
        (ZeroStage::Two, false, false),
        (ZeroStage::Three, false, false),
        (ZeroStage::One, true, true),
        (ZeroStage::Two, true, false),
        (ZeroStage::Three, true, true),
        (ZeroStage::Three, false, true),
    ] {
        let what = format!("zero {stage}, offload {saved} then {loaded}");
        let mut whole = make(stage, saved, fresh(3));
        let want: Vec<f64> = batches
            .iter()
            .map(|b| whole.step(b).unwrap().loss)
            .collect();
        let mut first = make(stage, saved, fresh(3));
        for b in &batches[..2] {
            first.step(b).unwrap();
        }
        let root = std::env::temp_dir().join(format!(
            "ferrotron-zero-restore-{}-{stage}-{saved}-{loaded}",
            std::process::id()
        ));
        let dir = first
            .write_checkpoint(&root, None, &[], 1)
            .unwrap()
            .unwrap();
        let mut reader = Reader::open(&dir).unwrap();
        let tensors = reader.index().tensors.len();
        assert_eq!(tensors % 3, 0, "a parameter and its two moments");
        let mut resumed = make(stage, loaded, fresh(99));
        let state = checkpoint::read_state(&dir).unwrap();
        resumed.load(&mut reader, &state).unwrap();
        assert_eq!(resumed.steps_done(), 2);
        std::fs::remove_dir_all(&root).unwrap();
        let loss = resumed.step(&batches[2]).unwrap().loss;
        assert_eq!(loss, want[2], "{what}: third step's loss");
        assert_eq!(weights(&resumed), weights(&whole), "{what}: weights");
    }
}
