//! Scaled dot-product attention `softmax(q k^T / sqrt(head_dim) + bias) v`
//! with grouped-query heads: the reference forms the score matrix, the
//! fused path is FlashAttention (see `ferrotron_kernels::attention`).

use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, FloatDType, Tensor, TensorPrimitive};
use ferrotron_kernels::attention::AttentionOptions;
use ferrotron_parallel::context::RingAttention;

use super::fused::KernelBackend;

/// The positional part of attention for one forward pass, in the form of
/// the attention's implementation (`OpsChoice::attention_impl`, turned into
/// this form by `layers::position::PositionContext::new`).
#[derive(Clone, Debug)]
pub enum AttentionBias<B: KernelBackend> {
    /// Reference path: additive bias `[1, 1 or n_heads, len, keys]` holding
    /// the causal mask (`-inf`) and ALiBi's `slope_h * key_position`.
    Matrix(Tensor<B, 4>),
    /// Reference path with selective recomputation: the same bias, and the
    /// attention core is one autodiff node that keeps only `q`, `k`, `v`
    /// and recomputes the scores and softmax in backward
    /// ([`attention_reference_backward`]).
    Recomputed(Tensor<B, 4>),
    /// The backend's host-buffer attention core (flex, f32:
    /// `ops::cpu::attention_forward`) with the same bias, as one autodiff
    /// node that keeps only `q`, `k`, `v` and recomputes the probabilities
    /// in its own backward ([`KernelBackend::host_attention`]); f32 only,
    /// other dtypes run the reference as [`AttentionBias::Matrix`].
    Host(Tensor<B, 4>),
    /// Fused path (queries and keys are the same `len` positions): the
    /// kernel applies the causal mask itself, and ALiBi from its slopes
    /// `[n_heads]` (bias `slope_h * (key - query)`, which differs from the
    /// matrix's by a constant per row and so gives the same softmax).
    Fused {
        /// ALiBi slopes, when the family uses ALiBi.
        slopes: Option<Tensor<B, 1>>,
        /// Ask for the kernels on the matrix units
        /// ([`AttentionOptions::matrix_units`]).
        matrix_units: bool,
    },
    /// Context parallelism: this rank's queries, keys and values are its
    /// chunks of the sequences, and the attention runs around the ring
    /// ([`CpOps::ring_attention`](ferrotron_parallel::context::CpOps::ring_attention)),
    /// each block by the ring's kernel with
    /// the causal mask and ALiBi of the global positions.
    Ring(RingAttention),
}

impl<B: KernelBackend> AttentionBias<B> {
    /// The same bias with the reference attention core recomputed in
    /// backward (selective recomputation) when `on`; the fused form is
    /// unchanged (FlashAttention keeps only its output and log-sum-exp and
    /// recomputes the rest already).
    pub fn recomputed(self, on: bool) -> Self {
        match self {
            AttentionBias::Matrix(m) if on => AttentionBias::Recomputed(m),
            AttentionBias::Recomputed(m) if !on => AttentionBias::Matrix(m),
            other => other,
        }
    }
}

/// Attention of `q` `[batch, n_heads, len, head_dim]` over `k`, `v`
/// `[batch, n_kv_heads, keys, head_dim]` (query head `h` uses key/value head
/// `h / (n_heads / n_kv_heads)`); returns `[batch, n_heads, len, head_dim]`.
pub fn attention<B: KernelBackend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    bias: &AttentionBias<B>,
) -> Tensor<B, 4> {
    match bias {
        AttentionBias::Matrix(matrix) => attention_reference(q, k, v, matrix),
        AttentionBias::Recomputed(matrix) => {
            Tensor::from_primitive(TensorPrimitive::Float(B::recomputed_attention(
                q.into_primitive().tensor(),
                k.into_primitive().tensor(),
                v.into_primitive().tensor(),
                matrix.clone().into_primitive().tensor(),
            )))
        }
        // Host buffers in f32 only; bf16 and f16 keep the reference.
        AttentionBias::Host(matrix) if q.dtype() != DType::F32 => {
            attention_reference(q, k, v, matrix)
        }
        AttentionBias::Host(matrix) => {
            Tensor::from_primitive(TensorPrimitive::Float(B::host_attention(
                q.into_primitive().tensor(),
                k.into_primitive().tensor(),
                v.into_primitive().tensor(),
                matrix.clone().into_primitive().tensor(),
            )))
        }
        AttentionBias::Ring(ring) => B::ring_attention(q, k, v, ring),
        AttentionBias::Fused {
            slopes,
            matrix_units,
        } => {
            let options = AttentionOptions {
                causal: true,
                scale: None,
                matrix_units: *matrix_units,
            };
            // In the inputs' dtype: the kernels keep f32 scores and sums
            // and round the output (and in backward the gradients) once.
            Tensor::from_primitive(TensorPrimitive::Float(B::fused_attention(
                q.into_primitive().tensor(),
                k.into_primitive().tensor(),
                v.into_primitive().tensor(),
                slopes.clone().map(|s| s.into_primitive().tensor()),
                options,
            )))
        }
    }
}

/// The reference: repeats K/V over the query heads of each group, forms
/// the `[batch, n_heads, len, keys]` scores, adds `bias` and applies softmax.
///
/// In mixed precision (`q`, `k`, `v` in bf16 or f16) it follows
/// FlashAttention on tensor cores: the scores are `q k^T` of the
/// low-precision inputs accumulated in f32 (the products of two bf16 or
/// f16 values are exact in f32) and stay f32 through the bias and the
/// softmax; the probabilities are rounded to `v`'s dtype for the product
/// with `v`, whose result has that dtype.
pub fn attention_reference<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    bias: &Tensor<B, 4>,
) -> Tensor<B, 4> {
    let [_, n_heads, _, head_dim] = q.dims();
    let rep = n_heads / k.dims()[1];
    let (k, v) = (repeat_kv(k, rep), repeat_kv(v, rep));
    let dtype = v.dtype();
    let scores = q
        .cast(FloatDType::F32)
        .matmul(k.cast(FloatDType::F32).swap_dims(2, 3))
        .mul_scalar(1.0 / (head_dim as f64).sqrt());
    softmax(add_bias(scores, bias), 3).cast(dtype).matmul(v)
}

/// The gradients `[dq, dk, dv]` of [`attention_reference`] for the output
/// gradient `d_out` `[batch, n_heads, len, head_dim]`, recomputing the
/// probabilities `p = softmax(q k^T / sqrt(d) + bias)` from the inputs:
/// `dv = p^T d_out`, `ds = p * (d_out v^T - rowsum(d_out v^T * p))`,
/// `dq = ds k / sqrt(d)`, `dk = ds^T q / sqrt(d)`, and `dk`, `dv` summed over
/// the query heads of each key/value head. What autodiff of the reference
/// computes, with the softmax's gradient in closed form (so its sums run in
/// another order).
pub fn attention_reference_backward<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    bias: &Tensor<B, 4>,
    d_out: Tensor<B, 4>,
) -> [Tensor<B, 4>; 3] {
    let [_, n_heads, _, head_dim] = q.dims();
    let rep = n_heads / k.dims()[1];
    let scale = 1.0 / (head_dim as f64).sqrt();
    // Under mixed precision the inputs are bf16/f16: the gradients are
    // computed in f32 (the softmax's precision) and rounded once at the end.
    let dtypes = [q.dtype(), k.dtype(), v.dtype()];
    let [q, k, v, d_out] = [q, k, v, d_out].map(|t| t.cast(FloatDType::F32));
    let (k, v) = (repeat_kv(k, rep), repeat_kv(v, rep));
    let scores = q
        .clone()
        .matmul(k.clone().swap_dims(2, 3))
        .mul_scalar(scale);
    let p = softmax(add_bias(scores, bias), 3);
    let dv = p.clone().swap_dims(2, 3).matmul(d_out.clone());
    let dp = d_out.matmul(v.swap_dims(2, 3));
    let row = (dp.clone() * p.clone()).sum_dim(3);
    let ds = (p * (dp - row)).mul_scalar(scale);
    let dq = ds.clone().matmul(k);
    let dk = ds.swap_dims(2, 3).matmul(q);
    let [dq_t, dk_t, dv_t] = dtypes;
    [
        dq.cast(dq_t),
        sum_kv(dk, rep).cast(dk_t),
        sum_kv(dv, rep).cast(dv_t),
    ]
}

/// `[batch, kv_heads * rep, keys, hd]` to `[batch, kv_heads, keys, hd]`,
/// summing the `rep` query heads of each key/value head (the gradient of
/// [`repeat_kv`]).
fn sum_kv<B: Backend>(x: Tensor<B, 4>, rep: usize) -> Tensor<B, 4> {
    if rep == 1 {
        return x;
    }
    let [b, heads, s, hd] = x.dims();
    x.reshape([b, heads / rep, rep, s, hd])
        .sum_dim(2)
        .reshape([b, heads / rep, s, hd])
}

/// `[batch, kv_heads, keys, hd]` to `[batch, kv_heads * rep, keys, hd]`, query
/// head `h` using key/value head `h / rep`.
fn repeat_kv<B: Backend>(x: Tensor<B, 4>, rep: usize) -> Tensor<B, 4> {
    if rep == 1 {
        return x;
    }
    let [b, kv, s, hd] = x.dims();
    x.unsqueeze_dim::<5>(2)
        .repeat_dim(2, rep)
        .reshape([b, kv * rep, s, hd])
}

/// `scores` `[batch, heads, len, keys]` plus `bias` `[1, 1 or heads, len, keys]`.
///
/// Both are flattened so the bias broadcasts along one leading dimension
/// only: burn-flex's general broadcasting add was measured 20x slower.
fn add_bias<B: Backend>(scores: Tensor<B, 4>, bias: &Tensor<B, 4>) -> Tensor<B, 4> {
    let shape = scores.shape();
    let n = bias.shape().num_elements();
    let rows = shape.num_elements() / n;
    (scores.reshape([rows, n]) + bias.clone().reshape([1, n])).reshape(shape)
}
