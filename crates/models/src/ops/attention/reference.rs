//! The reference attention: Burn tensor operations forming the
//! `[batch, n_heads, len, keys]` scores (every backend, every dtype), its
//! gradients in closed form (for the nodes that recompute in backward),
//! and both on primitives for the backend traits.

use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{FloatDType, Tensor, TensorPrimitive};

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

/// The reference attention core ([`attention_reference`]) on primitives
/// (shapes of `KernelBackend::attention_core`).
pub(in crate::ops) fn attention_reference_on<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    bias: FloatTensor<B>,
) -> FloatTensor<B> {
    attention_reference(t::<B, 4>(q), t(k), t(v), &t(bias))
        .into_primitive()
        .tensor()
}

/// The reference core's gradients ([`attention_reference_backward`]) on
/// primitives.
pub(in crate::ops) fn attention_reference_backward_on<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    bias: FloatTensor<B>,
    d_out: FloatTensor<B>,
) -> [FloatTensor<B>; 3] {
    attention_reference_backward(t::<B, 4>(q), t(k), t(v), &t(bias), t(d_out))
        .map(|g| g.into_primitive().tensor())
}

/// A float primitive as a tensor of rank `D`.
fn t<B: Backend, const D: usize>(p: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}
