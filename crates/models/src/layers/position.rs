//! Position information for one forward pass: RoPE and the attention bias
//! (causal mask and ALiBi) for query positions `start..start+len`, in the
//! form the chosen kernels want (host-built tables and bias matrix for the
//! reference path, the RoPE inverse frequencies and the ALiBi slopes for the
//! fused one). Both RoPE forms come from the same `rope_scaling::inv_freq`.

use std::ops::Range;

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use ferrotron_parallel::context::RingAttention;

use crate::config::Position;
use crate::ops::{AttentionBias, AttentionImpl, KernelBackend, OpImpl, OpsChoice, Rope};
use crate::rope_scaling::inv_freq;

/// The attention heads a rank computes: `range` of the model's `total`
/// (all of them without tensor parallelism). ALiBi's slopes depend on both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heads {
    /// Heads of the model.
    pub total: usize,
    /// The heads this rank computes.
    pub range: Range<usize>,
}

impl Heads {
    /// Every one of `n` heads.
    pub fn all(n: usize) -> Self {
        Self {
            total: n,
            range: 0..n,
        }
    }

    /// ALiBi slopes of these heads.
    pub(crate) fn alibi_slopes(&self) -> Vec<f32> {
        alibi_slopes(self.total)[self.range.clone()].to_vec()
    }
}

/// Everything attention needs to know about positions in this pass.
#[derive(Clone, Debug)]
pub struct PositionContext<B: KernelBackend> {
    /// RoPE for queries and keys (Llama).
    pub rope: Option<Rope<B>>,
    /// The implementation of this pass's attention (the model's, with
    /// FlashAttention's replaced by the reference when decoding).
    pub attention: AttentionImpl,
    /// Causal mask and ALiBi, in the form `attention` takes.
    pub attn_bias: AttentionBias<B>,
}

impl<B: KernelBackend> PositionContext<B> {
    /// Builds the context of `heads` for `len` new queries after `start`
    /// cached positions, RoPE and the attention bias each in the form of
    /// its operation's implementation in `ops`
    /// ([`OpsChoice::rope_impl`], [`OpsChoice::attention_impl`]; when
    /// `start` is not 0, [`OpsChoice::decoding`]'s): the fused kernels'
    /// form, which holds no `[len, keys]` matrix; the host-buffer form; or
    /// the reference's tables and matrix.
    pub fn new(
        position: &Position,
        heads: &Heads,
        head_dim: usize,
        start: usize,
        len: usize,
        ops: &OpsChoice,
        device: &B::Device,
    ) -> Self {
        // The fused kernels attend from position 0 and take no cache.
        let ops = if start > 0 { ops.decoding() } else { *ops };
        let rope = match position {
            Position::Rope { theta, scaling } => {
                let freqs = inv_freq(*theta, scaling.as_ref(), head_dim);
                let at: Vec<usize> = (start..start + len).collect();
                Some(match ops.rope_impl() {
                    OpImpl::Fused => {
                        let n = freqs.len();
                        Rope::Fused {
                            inv_freq: Tensor::from_data(TensorData::new(freqs, [n]), device),
                        }
                    }
                    OpImpl::Cpu => {
                        let (cos, sin) = rope_tables(&freqs, &at, device);
                        Rope::Host(cos, sin)
                    }
                    OpImpl::Reference => {
                        let (cos, sin) = rope_tables(&freqs, &at, device);
                        Rope::Tables(cos, sin)
                    }
                })
            }
            _ => None,
        };
        let attention = ops.attention_impl();
        let attn_bias = if attention.takes_matrix() {
            AttentionBias::Matrix(bias_matrix(position, heads, start, len, device))
        } else {
            let alibi_slopes = (*position == Position::Alibi).then(|| {
                let slopes = heads.alibi_slopes();
                let n = slopes.len();
                Tensor::from_data(TensorData::new(slopes, [n]), device)
            });
            AttentionBias::Causal { alibi_slopes }
        };
        Self {
            rope,
            attention,
            attn_bias,
        }
    }

    /// The context of this rank's tokens under context parallelism: its
    /// chunks of the sequences, at the global `positions` (RoPE's tables
    /// at those positions), attending around `ring`, whose block kernel
    /// applies the causal mask and ALiBi of the same global positions;
    /// RoPE's tables run as `ops` says ([`OpImpl::Cpu`]: the host form,
    /// otherwise the reference), and `ring`'s block kernel is the one
    /// `ops`'s attention chose.
    pub fn ring(
        position: &Position,
        head_dim: usize,
        positions: &[usize],
        ring: RingAttention,
        ops: &OpsChoice,
        device: &B::Device,
    ) -> Self {
        let rope = match position {
            Position::Rope { theta, scaling } => {
                let freqs = inv_freq(*theta, scaling.as_ref(), head_dim);
                let (cos, sin) = rope_tables(&freqs, positions, device);
                Some(match ops.rope_impl() {
                    OpImpl::Cpu => Rope::Host(cos, sin),
                    OpImpl::Fused | OpImpl::Reference => Rope::Tables(cos, sin),
                })
            }
            _ => None,
        };
        Self {
            rope,
            attention: ops.attention_impl(),
            attn_bias: AttentionBias::Ring(ring),
        }
    }
}

/// The additive attention bias `[1, heads, len, start + len]` (1 head
/// without ALiBi): `-inf` where a query may not see a key (causal mask),
/// otherwise ALiBi's `slope_h * key_position`, or 0.
fn bias_matrix<B: Backend>(
    position: &Position,
    heads: &Heads,
    start: usize,
    len: usize,
    device: &B::Device,
) -> Tensor<B, 4> {
    let keys = start + len;
    let slopes = match position {
        Position::Alibi => heads.alibi_slopes(),
        _ => vec![0.0],
    };
    let bias: Vec<f32> = slopes
        .iter()
        .flat_map(|&s| {
            (0..len).flat_map(move |i| {
                (0..keys).map(move |j| {
                    if j > start + i {
                        f32::NEG_INFINITY
                    } else {
                        s * j as f32
                    }
                })
            })
        })
        .collect();
    Tensor::from_data(TensorData::new(bias, [1, slopes.len(), len, keys]), device)
}

/// RoPE cosines and sines `[1, 1, len, head_dim]` for the `len` token
/// positions `at`, computed in f32 the way Hugging Face `transformers`
/// does (angle = position x inv_freq, duplicated across both halves), from
/// the `head_dim / 2` inverse frequencies.
fn rope_tables<B: Backend>(
    inv_freq: &[f32],
    at: &[usize],
    device: &B::Device,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let (head_dim, len) = (2 * inv_freq.len(), at.len());
    let mut cos = Vec::with_capacity(len * head_dim);
    let mut sin = Vec::with_capacity(len * head_dim);
    for &p in at {
        for _ in 0..2 {
            for f in inv_freq {
                let angle = p as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
    }
    let shape = [1, 1, len, head_dim];
    (
        Tensor::from_data(TensorData::new(cos, shape), device),
        Tensor::from_data(TensorData::new(sin, shape), device),
    )
}

/// ALiBi slopes of BLOOM / Press et al. for `n_heads` heads, including the
/// interleaved extra slopes when `n_heads` is not a power of two.
pub fn alibi_slopes(n_heads: usize) -> Vec<f32> {
    let closest = 1usize << (usize::BITS - 1 - n_heads.leading_zeros());
    let base = 2f64.powf(-(2f64.powf(-((closest as f64).log2() - 3.0))));
    let mut slopes: Vec<f32> = (1..=closest).map(|i| base.powi(i as i32) as f32).collect();
    if closest != n_heads {
        let extra_base = 2f64.powf(-(2f64.powf(-((2.0 * closest as f64).log2() - 3.0))));
        let extra = n_heads - closest;
        slopes.extend((0..extra).map(|k| extra_base.powi((1 + 2 * k) as i32) as f32));
    }
    slopes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alibi_slopes_match_the_paper() {
        // 8 heads: 1/2, 1/4, ..., 1/256.
        let s = alibi_slopes(8);
        for (i, v) in s.iter().enumerate() {
            assert!((v - 0.5f32.powi(i as i32 + 1)).abs() < 1e-7);
        }
        // 6 heads: the 4 slopes of 4 heads (1/4, 1/16, 1/64, 1/256), then
        // odd powers of the 8-head base (1/2, 1/8).
        let s = alibi_slopes(6);
        let want = [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125];
        for (a, b) in s.iter().zip(want) {
            assert!((a - b).abs() < 1e-7, "{s:?}");
        }
    }
}
