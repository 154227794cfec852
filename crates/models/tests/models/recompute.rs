//! Activation recomputation changes what backward keeps, never what it
//! computes: with selective recomputation (the attention core recomputed in
//! backward) and full recomputation (each block recomputed from its input)
//! the gradients equal those of plain autodiff, up to the order of
//! floating-point sums, for every family (GPT: learned positions; Llama:
//! RoPE and grouped-query attention; BLOOM: ALiBi).

use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use ferrotron_engine::data::{Batch, BatchSampler};
use ferrotron_engine::lm::{CausalLm, LmUnits};
use ferrotron_engine::optim::{AdamWConfig, LrSchedule};
use ferrotron_engine::params::named_tensors;
use ferrotron_models::layers::position::{Heads, PositionContext};
use ferrotron_models::ops::{attention, AttentionBias, AttentionImpl, OpsChoice};
use ferrotron_models::presets::preset;
use ferrotron_models::{Decoder, DecoderConfig, Kernels, Position};
use ferrotron_parallel::groups::ProcessGroups;
use ferrotron_parallel::recompute::Recompute;
use ferrotron_parallel::train::{ParallelConfig, StepConfig, Trainer};

type B = Autodiff<Flex>;

const FAMILIES: [&str; 3] = ["gpt-mini", "llama-mini", "bloom-mini"];

/// A small model of `family` (6 heads; llama-mini's 2 KV heads: GQA), on
/// the reference ops, whose attention keeps its score matrices unless
/// recomputed (flex's default host-buffer attention never keeps them).
fn tiny(family: &str) -> DecoderConfig {
    DecoderConfig {
        vocab_size: 64,
        hidden_size: 48,
        n_layers: 3,
        ffn_size: 96,
        max_seq_len: 32,
        kernels: Some(Kernels::Reference),
        ..preset(family).unwrap()
    }
}

fn pseudo_random(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = (i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(seed.wrapping_mul(97));
            ((x >> 8) % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn leaf(shape: [usize; 4], seed: u32) -> Tensor<B, 4> {
    let n = shape.iter().product();
    Tensor::<B, 4>::from_data(
        TensorData::new(pseudo_random(n, seed), shape),
        &Default::default(),
    )
    .require_grad()
}

/// `max |a - b|` over `max |b|`.
fn relative_gap(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let gap = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    let scale = b.iter().map(|y| y.abs()).fold(0.0, f32::max);
    gap / scale
}

fn values<const D: usize, K: Backend>(t: Tensor<K, D>) -> Vec<f32> {
    t.into_data().to_vec().unwrap()
}

/// The attention core alone, for causal GQA (6 query heads over 2
/// key/value heads) with and without ALiBi: the recomputed node's `dq`,
/// `dk`, `dv`, and those of flex's host-buffer node, equal autodiff of the
/// reference.
#[test]
fn recomputed_attention_node_has_the_reference_gradients() {
    let (b, heads, kv, len, hd) = (2, 6, 2, 7, 8);
    for position in [
        Position::Alibi,
        Position::Rope {
            theta: 10000.0,
            scaling: None,
        },
    ] {
        let context = PositionContext::<B>::new(
            &position,
            &Heads::all(heads),
            hd,
            0,
            len,
            &OpsChoice::reference(),
            &Default::default(),
        );
        let weight = Tensor::<B, 4>::from_data(
            TensorData::new(pseudo_random(b * heads * len * hd, 9), [b, heads, len, hd]),
            &Default::default(),
        );
        let mut grads = Vec::new();
        assert!(matches!(context.attn_bias, AttentionBias::Matrix(_)));
        assert_eq!(context.attention, AttentionImpl::Reference);
        let variants = [
            context.attention,
            context.attention.recomputed(true),
            AttentionImpl::Host,
        ];
        assert_eq!(variants[1], AttentionImpl::Recomputed);
        for op in variants {
            let (q, k, v) = (
                leaf([b, heads, len, hd], 1),
                leaf([b, kv, len, hd], 2),
                leaf([b, kv, len, hd], 3),
            );
            let out = attention(op, q.clone(), k.clone(), v.clone(), &context.attn_bias);
            let g = (out * weight.clone()).sum().backward();
            grads.push([q, k, v].map(|t| values(t.grad(&g).unwrap())));
        }
        for (node, node_grads) in ["recomputed", "host"].iter().zip(&grads[1..]) {
            for (name, (got, want)) in ["dq", "dk", "dv"]
                .iter()
                .zip(node_grads.iter().zip(&grads[0]))
            {
                let gap = relative_gap(got, want);
                println!("{position:?} {node} {name}: relative gap {gap:e}");
                assert!(gap < 1e-5, "{position:?} {node} {name}: relative gap {gap}");
            }
        }
    }
}

/// Gradients of every parameter, by id.
fn gradients(
    model: &Decoder<B>,
    inputs: Tensor<B, 2, Int>,
    targets: Tensor<B, 2, Int>,
) -> GradientsParams {
    GradientsParams::from_grads(model.loss(inputs, targets).backward(), model)
}

/// The whole model's gradients with the attention core recomputed equal
/// those of plain autodiff, parameter by parameter.
#[test]
fn selective_recompute_gradients_equal_plain_autodiff_for_every_family() {
    let device = Default::default();
    let ids: Vec<i64> = (0..2 * 12).map(|i| (i * 7 % 64) as i64).collect();
    let targets: Vec<i64> = ids.iter().map(|i| (i * 3 + 1) % 64).collect();
    let inputs = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [2, 12]), &device);
    let targets = Tensor::<B, 2, Int>::from_data(TensorData::new(targets, [2, 12]), &device);
    for family in FAMILIES {
        let plain = Decoder::<B>::new(&tiny(family), 5, &device).unwrap();
        let selective = plain.clone().with_attention_recompute(true);
        let want = gradients(&plain, inputs.clone(), targets.clone());
        let got = gradients(&selective, inputs.clone(), targets.clone());
        let (mut gap, mut scale, mut checked) = (0f32, 0f32, 0);
        for (id, name) in ferrotron_engine::params::param_names(&plain) {
            let w = grad_of(&want, id, &plain);
            let g = grad_of(&got, id, &plain);
            for (a, b) in g.iter().zip(&w) {
                gap = gap.max((a - b).abs());
                scale = scale.max(b.abs());
            }
            // Parameters with a real gradient match tensor by tensor too
            // (the key biases' gradient is analytically zero: rounding only).
            if !name.contains("k.bias") {
                let tensor_gap = relative_gap(&g, &w);
                assert!(
                    tensor_gap < 1e-4,
                    "{family} {name}: relative gap {tensor_gap}"
                );
            }
            checked += 1;
        }
        assert!(checked > 10, "{family}: only {checked} parameters");
        println!("{family} selective: gradients differ by {gap:e} (largest {scale:e})");
        assert!(
            gap <= 1e-5 * scale,
            "{family}: gradients differ by {gap} (largest {scale})"
        );
    }
}

/// Parameter `id`'s gradient in `grads` (the tensor's rank found in `model`).
fn grad_of(grads: &GradientsParams, id: ParamId, model: &Decoder<B>) -> Vec<f32> {
    struct Find<'a> {
        id: ParamId,
        grads: &'a GradientsParams,
        out: Option<Vec<f32>>,
    }
    impl burn::module::ModuleVisitor<B> for Find<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if param.id == self.id {
                let g = self
                    .grads
                    .get::<Flex, D>(param.id)
                    .expect("every parameter has a gradient");
                self.out = Some(values(g));
            }
        }
    }
    let mut find = Find {
        id,
        grads,
        out: None,
    };
    model.visit(&mut find);
    find.out.expect("the parameter is in the model")
}

/// One optimizer step whose update is the gradient itself: AdamW's first
/// update is `lr m / (sqrt(v) + eps)` with `m = g`, `sqrt(v) = |g|`; with
/// `eps = lr = 1e6` it is `g / (1 + |g| 1e-6)`, and no weight decay or
/// clipping. Returns each parameter's `before - after`, by name.
fn gradient_step(
    config: &DecoderConfig,
    recompute: Recompute,
    batches: &[Batch],
) -> Vec<(String, Vec<f32>)> {
    let device = Default::default();
    let model = Decoder::<B>::new(config, 3, &device).unwrap();
    let before = named_tensors(&model.valid());
    let step = StepConfig {
        adamw: AdamWConfig {
            eps: 1e6,
            weight_decay: 0.0,
            ..AdamWConfig::default()
        },
        schedule: LrSchedule {
            max_lr: 1e6,
            min_lr: 1e6,
            warmup_steps: 0,
            total_steps: 1,
        },
        grad_clip: 0.0,
    };
    let parallel = ParallelConfig {
        recompute,
        ..ParallelConfig::default()
    };
    let mut trainer =
        Trainer::parallel(model, step, device, ProcessGroups::single(), parallel).unwrap();
    assert_eq!(trainer.recompute(), recompute);
    trainer.step(batches).unwrap();
    let after = named_tensors(&trainer.full_model().unwrap().valid());
    before
        .into_iter()
        .zip(after)
        .map(|((name, b), (_, a))| {
            let (b, a) = (b.to_vec::<f32>().unwrap(), a.to_vec::<f32>().unwrap());
            (name, b.iter().zip(&a).map(|(x, y)| x - y).collect())
        })
        .collect()
}

/// The trainer with each recomputation takes the same step (two
/// micro-batches): selective runs the attention node, full the
/// block-by-block schedule with a no-grad forward.
#[test]
fn every_recompute_mode_gives_the_plain_gradients_for_every_family() {
    let tokens: Vec<u32> = (0..3_000u32).map(|i| (i * 7 + i / 13) % 64).collect();
    let mut sampler = BatchSampler::new(tokens.len(), 16, 5).unwrap();
    let batches = [
        sampler.next_batch(&tokens, 2),
        sampler.next_batch(&tokens, 2),
    ];
    for family in FAMILIES {
        let config = tiny(family);
        let want = gradient_step(&config, Recompute::None, &batches);
        let scale = want
            .iter()
            .flat_map(|(_, g)| g.iter().map(|v| v.abs()))
            .fold(0.0, f32::max);
        assert!(scale > 1e-3, "{family}: the step moved nothing ({scale})");
        for mode in [Recompute::Selective, Recompute::Full] {
            let got = gradient_step(&config, mode, &batches);
            let mut gap = 0f32;
            for ((name, g), (want_name, w)) in got.iter().zip(&want) {
                assert_eq!(name, want_name);
                for (a, b) in g.iter().zip(w) {
                    gap = gap.max((a - b).abs());
                }
            }
            println!("{family} {mode}: gradients differ by {gap:e} (largest {scale:e})");
            assert!(
                gap <= 1e-5 * scale,
                "{family} {mode}: gradients differ by {gap} (largest {scale})"
            );
        }
    }
}

/// ZeRO-3 runs block by block, so the trainer reports full recomputation
/// for it, and refuses selective with it (it would be full anyway).
#[test]
fn zero3_is_full_recomputation_and_refuses_selective() {
    use ferrotron_parallel::zero::ZeroStage;
    let device = Default::default();
    let step = StepConfig {
        adamw: AdamWConfig::default(),
        schedule: LrSchedule {
            max_lr: 1e-3,
            min_lr: 1e-3,
            warmup_steps: 0,
            total_steps: 1,
        },
        grad_clip: 1.0,
    };
    let config = tiny("gpt-mini");
    let build = |recompute| {
        Trainer::parallel(
            Decoder::<B>::new(&config, 3, &device).unwrap(),
            step.clone(),
            device,
            ProcessGroups::single(),
            ParallelConfig {
                zero: ZeroStage::Three,
                recompute,
                ..ParallelConfig::default()
            },
        )
    };
    assert_eq!(build(Recompute::None).unwrap().recompute(), Recompute::Full);
    assert_eq!(build(Recompute::Full).unwrap().recompute(), Recompute::Full);
    let err = build(Recompute::Selective).err().unwrap().to_string();
    assert!(err.contains("ZeRO-3"), "{err}");
}
