//! The head and the loss over blocks of rows (`ops::linear_cross_entropy`,
//! what a model runs on the CPU backends) against the plain reference
//! (whole logits, then the reference cross-entropy): the loss and the
//! gradients of `x` and the weight, ignored targets, a tied head, the
//! upstream gradient, finite differences of a plain f64 host loss, and the
//! three decoder families in f32 (bf16 keeps the whole logits).

use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, FloatDType, Int, Tensor, TensorData, TensorPrimitive};
use ferrotron_engine::lm::CausalLm;
use ferrotron_engine::precision::Precision;
use ferrotron_models::ops::{
    linear_cross_entropy_blocks, linear_cross_entropy_reference, HeadLoss, KernelBackend,
};
use ferrotron_models::presets::preset;
use ferrotron_models::{Decoder, DecoderConfig, Kernels};

use crate::common;
use crate::common::values;
use common::assert_gradients_match;

type Ad = Autodiff<Flex>;

fn leaf<B: AutodiffBackend>(v: Vec<f32>, shape: [usize; 2]) -> Tensor<B, 2> {
    Tensor::<B, 2>::from_data(TensorData::new(v, shape), &Default::default()).require_grad()
}

fn ids<B: burn::tensor::backend::Backend>(v: &[i64]) -> Tensor<B, 1, Int> {
    Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), &Default::default())
}

fn read<const D: usize, B: burn::tensor::backend::Backend>(t: Tensor<B, D>) -> Vec<f32> {
    t.cast(FloatDType::F32).into_data().to_vec::<f32>().unwrap()
}

/// `max |a - b|` over `max |b|` (0 when both are zero).
fn relative_gap(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let gap = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    let scale = b.iter().map(|y| y.abs()).fold(0.0, f32::max);
    if scale == 0.0 {
        gap
    } else {
        gap / scale
    }
}

/// Loss and `[d_x, d_w]` of the reference on the autodiff backend.
fn reference(x: &[f32], w: &[f32], targets: &[i64], dims: [usize; 3]) -> (f32, [Vec<f32>; 2]) {
    let [rows, hidden, vocab] = dims;
    let (x, w) = (
        leaf::<Ad>(x.to_vec(), [rows, hidden]),
        leaf::<Ad>(w.to_vec(), [hidden, vocab]),
    );
    let loss = linear_cross_entropy_reference(x.clone(), w.clone(), ids(targets));
    let value = read(loss.clone())[0];
    let g = loss.backward();
    (
        value,
        [read(x.grad(&g).unwrap()), read(w.grad(&g).unwrap())],
    )
}

/// Loss and `[d_x, d_w]` of [`linear_cross_entropy_blocks`] with `block`
/// rows per block, on the CPU backend without autodiff.
fn blocks(
    x: &[f32],
    w: &[f32],
    targets: &[i64],
    dims: [usize; 3],
    block: usize,
) -> (f32, [Vec<f32>; 2]) {
    let [rows, hidden, vocab] = dims;
    let t = |v: &[f32], shape| {
        Tensor::<Flex, 2>::from_data(TensorData::new(v.to_vec(), shape), &Default::default())
    };
    let (loss, grads) = linear_cross_entropy_blocks(
        t(x, [rows, hidden]),
        t(w, [hidden, vocab]),
        ids(targets),
        block,
        true,
    );
    let grads = grads.expect("asked for the gradients");
    (read(loss)[0], [read(grads.x), read(grads.weight)])
}

/// 37 rows in blocks of 5 (the last one ragged), with ignored targets:
/// the loss and both gradients equal the reference's.
#[test]
fn blocks_equal_the_reference_in_loss_and_gradients() {
    let dims @ [rows, hidden, vocab] = [37, 8, 23];
    let x = values(rows * hidden, 1);
    let w: Vec<f32> = values(hidden * vocab, 2).iter().map(|v| 3.0 * v).collect();
    let targets: Vec<i64> = (0..rows as i64)
        .map(|i| {
            if i % 7 == 3 {
                -100
            } else {
                (i * 5) % vocab as i64
            }
        })
        .collect();
    let (want_loss, want) = reference(&x, &w, &targets, dims);
    for block in [5, 16, 37, 64] {
        let (loss, got) = blocks(&x, &w, &targets, dims, block);
        assert!(
            (loss - want_loss).abs() <= 1e-6 * want_loss.abs(),
            "block {block}: loss {loss} against {want_loss}"
        );
        for (name, g, w) in [("d_x", &got[0], &want[0]), ("d_w", &got[1], &want[1])] {
            let gap = relative_gap(g, w);
            assert!(gap < 1e-5, "block {block} {name}: relative gap {gap}");
        }
    }
}

/// Every target ignored: the loss is 0 and no gradient flows, as in the
/// reference.
#[test]
fn all_ignored_targets_give_zero_loss_and_gradients() {
    let dims @ [rows, hidden, vocab] = [6, 4, 9];
    let (x, w) = (values(rows * hidden, 3), values(hidden * vocab, 4));
    let targets = [-100i64; 6];
    let (loss, got) = blocks(&x, &w, &targets, dims, 4);
    let (want_loss, want) = reference(&x, &w, &targets, dims);
    assert_eq!((loss, want_loss), (0.0, 0.0));
    for g in got.iter().chain(&want) {
        assert!(g.iter().all(|&v| v == 0.0), "a gradient is not zero: {g:?}");
    }
}

/// The plain mean cross-entropy of `x w` in f64 on the host.
fn host_loss(x: &[f64], w: &[f64], targets: &[i64], dims: [usize; 3]) -> f64 {
    let [rows, hidden, vocab] = dims;
    let (mut sum, mut kept) = (0.0, 0usize);
    for (r, &t) in targets.iter().enumerate().take(rows) {
        if t < 0 {
            continue;
        }
        let logits: Vec<f64> = (0..vocab)
            .map(|v| {
                (0..hidden)
                    .map(|h| x[r * hidden + h] * w[h * vocab + v])
                    .sum()
            })
            .collect();
        let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + logits.iter().map(|l| (l - max).exp()).sum::<f64>().ln();
        sum += lse - logits[t as usize];
        kept += 1;
    }
    sum / kept.max(1) as f64
}

/// Central differences of [`host_loss`] with respect to each entry of
/// `which` (0: `x`, 1: `w`).
fn finite_diff(x: &[f64], w: &[f64], targets: &[i64], dims: [usize; 3], which: usize) -> Vec<f32> {
    let h = 1e-5;
    let n = if which == 0 { x.len() } else { w.len() };
    (0..n)
        .map(|i| {
            let at = |delta: f64| {
                let (mut x, mut w) = (x.to_vec(), w.to_vec());
                if which == 0 {
                    x[i] += delta;
                } else {
                    w[i] += delta;
                }
                host_loss(&x, &w, targets, dims)
            };
            ((at(h) - at(-h)) / (2.0 * h)) as f32
        })
        .collect()
}

/// A tiny case in two blocks: both gradients match central differences of
/// a plain f64 host loss, and the loss the host loss.
#[test]
fn gradients_match_finite_differences() {
    let dims @ [rows, hidden, vocab] = [5, 3, 6];
    let x = values(rows * hidden, 5);
    let w: Vec<f32> = values(hidden * vocab, 6).iter().map(|v| 2.0 * v).collect();
    let targets = [1i64, -100, 5, 0, 5];
    let (loss, got) = blocks(&x, &w, &targets, dims, 3);
    let (x64, w64): (Vec<f64>, Vec<f64>) = (
        x.iter().map(|&v| v as f64).collect(),
        w.iter().map(|&v| v as f64).collect(),
    );
    let want_loss = host_loss(&x64, &w64, &targets, dims);
    assert!(
        (loss as f64 - want_loss).abs() < 1e-6,
        "loss {loss} against {want_loss}"
    );
    for (which, name) in [(0, "d_x"), (1, "d_w")] {
        let fd = finite_diff(&x64, &w64, &targets, dims, which);
        let gap = relative_gap(&got[which], &fd);
        assert!(
            gap < 1e-4,
            "{name}: relative gap {gap} to finite differences"
        );
    }
}

/// The autodiff node (`KernelBackend::chunked_linear_cross_entropy`) with a
/// tied weight (the transposed embedding, which also feeds `x` through a
/// row lookup) and an upstream gradient of 3: the embedding's summed
/// gradient equals the reference's.
#[test]
fn autodiff_node_sums_a_tied_weight_and_scales_by_the_upstream_gradient() {
    let (rows, hidden, vocab) = (9, 4, 11);
    let embed_values = values(vocab * hidden, 7);
    let rows_ids: Vec<i64> = (0..rows as i64).map(|i| (i * 4) % vocab as i64).collect();
    let targets: Vec<i64> = (0..rows as i64)
        .map(|i| {
            if i == 2 {
                -100
            } else {
                (i * 3 + 1) % vocab as i64
            }
        })
        .collect();
    let run = |chunked: bool| {
        let embed = leaf::<Ad>(embed_values.clone(), [vocab, hidden]);
        let x = embed.clone().select(0, ids(&rows_ids)).mul_scalar(1.5);
        let w = embed.clone().transpose();
        let loss = if chunked {
            Tensor::<Ad, 1>::from_primitive(TensorPrimitive::Float(
                <Ad as KernelBackend>::chunked_linear_cross_entropy(
                    x.into_primitive().tensor(),
                    w.into_primitive().tensor(),
                    ids::<Ad>(&targets).into_primitive(),
                ),
            ))
        } else {
            linear_cross_entropy_reference(x, w, ids(&targets))
        };
        let value = read(loss.clone())[0];
        let g = loss.mul_scalar(3.0).backward();
        (value, read(embed.grad(&g).unwrap()))
    };
    let (loss, got) = run(true);
    let (want_loss, want) = run(false);
    assert!(
        (loss - want_loss).abs() <= 1e-6 * want_loss,
        "loss {loss} against {want_loss}"
    );
    let gap = relative_gap(&got, &want);
    assert!(gap < 1e-5, "tied embedding gradient: relative gap {gap}");
}

/// Every parameter's gradient, by its position in the module, as f32.
struct Grads<'a, B: AutodiffBackend> {
    grads: &'a B::Gradients,
    out: Vec<Vec<f32>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Grads<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let g = param
            .val()
            .grad(self.grads)
            .expect("every parameter has a gradient");
        assert_eq!(g.dtype(), DType::F32, "the master gradient is f32");
        self.out.push(read(g));
    }
}

/// A small model of `family` with `kernels` (absent: what the CPU backend
/// resolves, the chunked head) in `precision`; 2 x 16 tokens, some targets
/// ignored. Returns the chosen head, the loss, the no-grad loss of the same
/// model without autodiff, and every gradient.
fn model_run(
    family: &str,
    kernels: Option<Kernels>,
    precision: Precision,
) -> (HeadLoss, f32, f32, Vec<Vec<f32>>) {
    let config = DecoderConfig {
        vocab_size: 96,
        hidden_size: 96,
        n_layers: 2,
        ffn_size: 192,
        max_seq_len: 32,
        kernels,
        precision,
        ..preset(family).unwrap()
    };
    let device = Default::default();
    let model = Decoder::<Ad>::new(&config, 11, &device).unwrap();
    let inputs: Vec<i64> = (0..32).map(|i| (i * 37 + i / 5) % 96).collect();
    let targets: Vec<i64> = (0..32)
        .map(|i| if i % 9 == 4 { -100 } else { (i * 11 + 3) % 96 })
        .collect();
    let two =
        |v: &[i64]| Tensor::<Ad, 2, Int>::from_data(TensorData::new(v.to_vec(), [2, 16]), &device);
    let loss = model.loss(two(&inputs), two(&targets));
    assert_eq!(loss.dtype(), DType::F32, "{family}: the loss is f32");
    let value = read(loss.clone())[0];
    let inner = model.valid();
    let two_inner = |v: &[i64]| {
        Tensor::<Flex, 2, Int>::from_data(TensorData::new(v.to_vec(), [2, 16]), &device)
    };
    let no_grad = read(inner.loss(two_inner(&inputs), two_inner(&targets)))[0];
    let grads = loss.backward();
    let mut visitor = Grads::<Ad> {
        grads: &grads,
        out: Vec::new(),
    };
    model.visit(&mut visitor);
    (model.ops().head_loss(), value, no_grad, visitor.out)
}

const FAMILIES: [&str; 3] = ["gpt-mini", "llama-mini", "bloom-mini"];

/// The decoder of each family (GPT-2 and BLOOM with the tied head, Llama
/// untied) in f32: the chunked head's loss, its no-grad loss and every
/// gradient (tied embedding included) equal the reference head's.
#[test]
fn chunked_head_gives_the_reference_loss_and_gradients_for_every_family() {
    for family in FAMILIES {
        let (head, loss, no_grad, got) = model_run(family, None, Precision::Fp32);
        let (ref_head, want_loss, want_no_grad, want) =
            model_run(family, Some(Kernels::Reference), Precision::Fp32);
        assert_eq!((head, ref_head), (HeadLoss::Chunked, HeadLoss::Logits));
        assert!(
            (loss - want_loss).abs() <= 1e-6 * want_loss,
            "{family}: loss {loss} against {want_loss}"
        );
        assert!(
            (no_grad - want_no_grad).abs() <= 1e-6 * want_no_grad,
            "{family}: no-grad loss {no_grad} against {want_no_grad}"
        );
        assert_gradients_match(family, &got, &want);
    }
}

/// A bf16 model keeps the whole-logits head (the chunked op runs in f32
/// only, see `OpsChoice::linear_cross_entropy`): its loss and gradients
/// are exactly those of the reference head.
#[test]
fn bf16_model_keeps_the_whole_logits_head() {
    for family in FAMILIES {
        let (_, loss, _, got) = model_run(family, None, Precision::Bf16);
        let (_, want_loss, _, want) = model_run(family, Some(Kernels::Reference), Precision::Bf16);
        assert_eq!(loss, want_loss, "{family}: loss");
        assert_eq!(got, want, "{family}: gradients");
    }
}
