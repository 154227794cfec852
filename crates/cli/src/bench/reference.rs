//! The reference path: the decoder's reference implementations
//! (`ferrotron_models::ops`, plain Burn ops) on any autodiff backend, forward
//! then `backward()`.

use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use ferrotron_models::init::Init;
use ferrotron_models::layers::Norm;
use ferrotron_models::ops::{
    attention_reference, cross_entropy, rope_reference, swiglu, KernelBackend,
};
use ferrotron_models::rope_scaling::inv_freq;
use ferrotron_models::{Kernels, NormKind};

use super::cases::{pattern, targets, Case, NORM_EPS, ROPE_THETA};
use super::kernels::Sample;

/// How a backend's memory is measured while the reference runs.
pub trait Meter {
    /// Starts a measurement, before the inputs are built.
    fn start(&mut self) -> Result<()>;
    /// A point where memory may peak: called after the forward (every
    /// tensor saved for the backward is alive) and after the backward.
    fn sample(&mut self) -> Result<()>;
    /// Peak bytes above the start.
    fn peak(&self) -> u64;
}

/// Runs forward + backward of `case` once on `B`. The clock covers the
/// forward, `backward()` (gradients seeded with ones) and a device sync;
/// inputs and constant tables (causal mask, RoPE cos/sin) are built before
/// it. Memory is what `meter` measures from before the inputs are built.
pub fn run<B: AutodiffBackend + KernelBackend>(
    case: &Case,
    dev: &B::Device,
    meter: &mut dyn Meter,
) -> Result<Sample> {
    meter.start()?;
    let rand = |shape: Vec<usize>, salt: u64| {
        let n = shape.iter().product();
        TensorData::new(pattern(n, salt), shape)
    };
    let elapsed = match *case {
        Case::Attention {
            batch,
            heads,
            seq,
            head_dim,
            ..
        } => {
            let shape = vec![batch, heads, seq, head_dim];
            let [q, k, v] = [1, 2, 3].map(|salt| {
                Tensor::<B, 4>::from_data(rand(shape.clone(), salt), dev).require_grad()
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
            let mask = Tensor::<B, 4>::from_data(TensorData::new(mask, [1, 1, seq, seq]), dev);
            timed_backward(dev, meter, || attention_reference(q, k, v, &mask))?
        }
        Case::Swiglu { rows, ffn } => {
            let [gate, up] = [1, 2].map(|salt| {
                Tensor::<B, 2>::from_data(rand(vec![rows, ffn], salt), dev).require_grad()
            });
            timed_backward(dev, meter, || swiglu(Kernels::Reference, gate, up))?
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
            let init = Init::new(0, dev);
            let eps = f64::from(NORM_EPS);
            let norm = Norm::<B>::new(&init, "norm", (kind, hidden, eps), Kernels::Reference)?;
            let x =
                Tensor::<B, 3>::from_data(rand(vec![batch, seq, hidden], 1), dev).require_grad();
            timed_backward(dev, meter, || norm.forward(x))?
        }
        Case::Rope {
            batch,
            heads,
            seq,
            head_dim,
        } => {
            let x = Tensor::<B, 4>::from_data(rand(vec![batch, heads, seq, head_dim], 1), dev)
                .require_grad();
            let (cos, sin) = rope_tables::<B>(seq, head_dim, dev);
            timed_backward(dev, meter, || rope_reference(x, &cos, &sin))?
        }
        Case::CrossEntropy { rows, vocab } => {
            let logits =
                Tensor::<B, 3>::from_data(rand(vec![1, rows, vocab], 1), dev).require_grad();
            let ids: Vec<i64> = targets(rows, vocab).into_iter().map(i64::from).collect();
            let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, rows]), dev);
            timed_backward(dev, meter, || {
                cross_entropy(Kernels::Reference, logits, ids)
            })?
        }
    };
    Ok(Sample {
        elapsed,
        forward: None,
        peak_bytes: meter.peak(),
    })
}

/// Times `forward`, `backward()` on its output and a sync of `dev`,
/// sampling `meter` after the forward and after the sync; the gradients
/// are dropped after the second sample.
fn timed_backward<B: AutodiffBackend, const D: usize>(
    dev: &B::Device,
    meter: &mut dyn Meter,
    forward: impl FnOnce() -> Tensor<B, D>,
) -> Result<Duration> {
    let start = Instant::now();
    let out = forward();
    meter.sample()?;
    let grads = out.backward();
    B::sync(dev).map_err(|e| anyhow!("device sync after the reference backward: {e:?}"))?;
    let elapsed = start.elapsed();
    meter.sample()?;
    drop(grads);
    Ok(elapsed)
}

/// RoPE `cos` and `sin` tables `[1, 1, seq, head_dim]` for positions
/// `0..seq`, angle `pos * inv_freq[i]` radians (unscaled, base
/// [`ROPE_THETA`]), repeated over both halves of the head (the `rotate_half`
/// convention of `rope_reference`).
fn rope_tables<B: AutodiffBackend>(
    seq: usize,
    head_dim: usize,
    dev: &B::Device,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let freqs = inv_freq(ROPE_THETA, None, head_dim);
    let angle = |s: usize, j: usize| s as f32 * freqs[j % freqs.len()];
    let table = |f: fn(f32) -> f32| {
        let v: Vec<f32> = (0..seq * head_dim)
            .map(|n| f(angle(n / head_dim, n % head_dim)))
            .collect();
        Tensor::<B, 4>::from_data(TensorData::new(v, [1, 1, seq, head_dim]), dev)
    };
    (table(f32::cos), table(f32::sin))
}
