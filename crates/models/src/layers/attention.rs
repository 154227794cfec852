//! Causal self-attention with grouped-query heads, RoPE or ALiBi, and a KV cache.
//!
//! This is the plain reference path: it forms the `[batch, heads, seq, keys]`
//! score matrix.

use burn::module::Module;
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::position::{apply_rope, PositionContext};
use super::Linear;
use crate::config::DecoderConfig;
use crate::init::Init;

/// Cached keys and values of one layer, each `[batch, n_kv_heads, keys, head_dim]`.
pub type LayerKv<B> = (Tensor<B, 4>, Tensor<B, 4>);

/// Query, key, value and output projections.
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    /// `[hidden, n_heads * head_dim]`.
    pub q: Linear<B>,
    /// `[hidden, n_kv_heads * head_dim]`.
    pub k: Linear<B>,
    /// `[hidden, n_kv_heads * head_dim]`.
    pub v: Linear<B>,
    /// `[n_heads * head_dim, hidden]`.
    pub o: Linear<B>,
    #[module(skip)]
    n_heads: usize,
    #[module(skip)]
    n_kv_heads: usize,
}

impl<B: Backend> Attention<B> {
    /// A fresh layer; `out_std` initialises the output projection.
    pub fn new(init: &mut Init<B>, c: &DecoderConfig, out_std: f64) -> Self {
        let h = c.hidden_size;
        let kv = c.n_kv_heads * c.head_dim();
        Self {
            q: Linear::new(init, h, h, c.bias, c.init_std),
            k: Linear::new(init, h, kv, c.bias, c.init_std),
            v: Linear::new(init, h, kv, c.bias, c.init_std),
            o: Linear::new(init, h, h, c.bias, out_std),
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
        }
    }

    /// `[batch, len, hidden]` to `[batch, len, hidden]`.
    ///
    /// With a `cache`, the new keys and values are appended to it and the
    /// queries attend to all cached positions as well.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        pos: &PositionContext<B>,
        cache: Option<&mut Option<LayerKv<B>>>,
    ) -> Tensor<B, 3> {
        let [b, t, hidden] = x.dims();
        let hd = hidden / self.n_heads;
        let heads = |y: Tensor<B, 3>, n: usize| y.reshape([b, t, n, hd]).swap_dims(1, 2);
        let mut q = heads(self.q.forward(x.clone()), self.n_heads);
        let mut k = heads(self.k.forward(x.clone()), self.n_kv_heads);
        let mut v = heads(self.v.forward(x), self.n_kv_heads);
        if let Some((cos, sin)) = &pos.rope {
            q = apply_rope(q, cos, sin);
            k = apply_rope(k, cos, sin);
        }
        if let Some(cache) = cache {
            if let Some((k_past, v_past)) = cache.take() {
                k = Tensor::cat(vec![k_past, k], 2);
                v = Tensor::cat(vec![v_past, v], 2);
            }
            *cache = Some((k.clone(), v.clone()));
        }
        let rep = self.n_heads / self.n_kv_heads;
        let (k, v) = (repeat_kv(k, rep), repeat_kv(v, rep));
        let scores = q
            .matmul(k.swap_dims(2, 3))
            .mul_scalar(1.0 / (hd as f64).sqrt());
        let scores = add_bias(scores, &pos.attn_bias);
        let out = softmax(scores, 3).matmul(v);
        self.o.forward(out.swap_dims(1, 2).reshape([b, t, hidden]))
    }
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
