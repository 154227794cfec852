//! The reference path: the decoder's reference implementations
//! (`ferrotron_models::ops`, plain Burn ops) on `Autodiff<Flex>` (the default
//! CPU backend), forward then `backward()`.

use std::time::Instant;

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::BackendTypes;
use burn::tensor::{Int, Tensor, TensorData};
use ferrotron_models::layers::Norm;
use ferrotron_models::ops::{attention_reference, cross_entropy, rope_reference, swiglu};
use ferrotron_models::{Kernels, NormKind};

use super::alloc::CountingAlloc;
use super::cases::{pattern, targets, Case, NORM_EPS, ROPE_THETA};
use super::kernels::Sample;

type B = Autodiff<Flex>;

/// Runs forward + backward of `case` once. The clock covers the forward and
/// `backward()` (gradients seeded with ones); inputs and constant tables
/// (causal mask, RoPE cos/sin) are built before it. Memory is the peak of
/// the Rust heap from before the inputs are built to the end of the
/// backward, minus the heap before.
pub fn run(case: &Case) -> Sample {
    let base = CountingAlloc::reset_peak();
    let elapsed_from = |start: Instant| Sample {
        elapsed: start.elapsed(),
        peak_bytes: CountingAlloc::peak().saturating_sub(base) as u64,
    };
    let dev = Default::default();
    let rand = |shape: Vec<usize>, salt: u64| {
        let n = shape.iter().product();
        TensorData::new(pattern(n, salt), shape)
    };
    match *case {
        Case::Attention {
            batch,
            heads,
            seq,
            head_dim,
        } => {
            let shape = vec![batch, heads, seq, head_dim];
            let [q, k, v] = [1, 2, 3].map(|salt| {
                Tensor::<B, 4>::from_data(rand(shape.clone(), salt), &dev).require_grad()
            });
            let mask: Vec<f32> = (0..seq * seq)
                .map(|i| {
                    if i % seq > i / seq {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
                .collect();
            let mask = Tensor::<B, 4>::from_data(TensorData::new(mask, [1, 1, seq, seq]), &dev);
            let start = Instant::now();
            let _grads = attention_reference(q, k, v, &mask).backward();
            elapsed_from(start)
        }
        Case::Swiglu { rows, ffn } => {
            let [gate, up] = [1, 2].map(|salt| {
                Tensor::<B, 2>::from_data(rand(vec![rows, ffn], salt), &dev).require_grad()
            });
            let start = Instant::now();
            let _grads = swiglu(Kernels::Reference, gate, up).backward();
            elapsed_from(start)
        }
        Case::Norm {
            layer,
            batch,
            seq,
            hidden,
        } => {
            let kind = if layer {
                NormKind::LayerNorm
            } else {
                NormKind::RmsNorm
            };
            let norm = Norm::<B>::new(kind, hidden, f64::from(NORM_EPS), Kernels::Reference, &dev);
            let x =
                Tensor::<B, 3>::from_data(rand(vec![batch, seq, hidden], 1), &dev).require_grad();
            let start = Instant::now();
            let _grads = norm.forward(x).backward();
            elapsed_from(start)
        }
        Case::Rope {
            batch,
            heads,
            seq,
            head_dim,
        } => {
            let x = Tensor::<B, 4>::from_data(rand(vec![batch, heads, seq, head_dim], 1), &dev)
                .require_grad();
            let (cos, sin) = rope_tables(seq, head_dim, &dev);
            let start = Instant::now();
            let _grads = rope_reference(x, &cos, &sin).backward();
            elapsed_from(start)
        }
        Case::CrossEntropy { rows, vocab } => {
            let logits =
                Tensor::<B, 3>::from_data(rand(vec![1, rows, vocab], 1), &dev).require_grad();
            let ids: Vec<i64> = targets(rows, vocab).into_iter().map(i64::from).collect();
            let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, rows]), &dev);
            let start = Instant::now();
            let _grads = cross_entropy(Kernels::Reference, logits, ids).backward();
            elapsed_from(start)
        }
    }
}

/// RoPE `cos` and `sin` tables `[1, 1, seq, head_dim]` for positions
/// `0..seq`, angle `pos * theta^(-2 i / head_dim)` radians, repeated over
/// both halves of the head (the `rotate_half` convention of `rope_reference`).
fn rope_tables(
    seq: usize,
    head_dim: usize,
    dev: &<B as BackendTypes>::Device,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let half = head_dim / 2;
    let angle = |s: usize, j: usize| {
        let i = (j % half) as f32;
        s as f32 * ROPE_THETA.powf(-2.0 * i / head_dim as f32)
    };
    let table = |f: fn(f32) -> f32| {
        let v: Vec<f32> = (0..seq * head_dim)
            .map(|n| f(angle(n / head_dim, n % head_dim)))
            .collect();
        Tensor::<B, 4>::from_data(TensorData::new(v, [1, 1, seq, head_dim]), dev)
    };
    (table(f32::cos), table(f32::sin))
}
