//! Causal self-attention with grouped-query heads, RoPE or ALiBi, and a KV
//! cache. The attention itself is `ops::attention`, by the implementation
//! the position context names, on its bias.

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use ferrotron_parallel::tensor::{column_input, ShardError, TpGroup};

use super::position::PositionContext;
use super::Linear;
use crate::config::DecoderConfig;
use crate::init::Init;
use crate::ops::{attention, rope, KernelBackend, OpsChoice};

/// Cached keys and values of one layer, each `[batch, n_kv_heads, keys, head_dim]`.
pub type LayerKv<B> = (Tensor<B, 4>, Tensor<B, 4>);

/// Query, key, value and output projections.
///
/// Under tensor parallelism over `t` ranks each rank holds `n_heads / t`
/// query heads and `n_kv_heads / t` key/value heads (the shapes below with
/// those counts): q, k and v are column-parallel, o is row-parallel.
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
    /// Query heads this rank computes.
    #[module(skip)]
    n_heads: usize,
    /// Key/value heads this rank holds.
    #[module(skip)]
    n_kv_heads: usize,
    #[module(skip)]
    head_dim: usize,
    #[module(skip)]
    tp: TpGroup,
}

impl<B: Backend> Attention<B> {
    /// The layer named `name` (`layers.0.attn`): this rank's part (see
    /// [`Init`]) of fresh weights; `out_std` initialises the output
    /// projection. Its head counts are the whole model's until
    /// [`Attention::split_heads`].
    ///
    /// # Errors
    /// A parameter the shard plan cannot cut.
    pub fn new(
        init: &Init<B>,
        name: &str,
        c: &DecoderConfig,
        out_std: f64,
        ops: OpsChoice,
    ) -> Result<Self, ShardError> {
        let h = c.hidden_size;
        let kv = c.n_kv_heads * c.head_dim();
        let linear = |proj: &str, shape, std| {
            Linear::new(init, &format!("{name}.{proj}"), shape, c.bias, std, ops)
        };
        Ok(Self {
            q: linear("q", [h, h], c.init_std)?,
            k: linear("k", [h, kv], c.init_std)?,
            v: linear("v", [h, kv], c.init_std)?,
            o: linear("o", [h, h], out_std)?,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim(),
            tp: TpGroup::single(),
        })
    }

    /// The layer with its weights already cut to this rank's heads (see
    /// `crate::tensor_parallel`), computing over `tp`.
    pub(crate) fn split_heads(self, tp: TpGroup) -> Self {
        Self {
            n_heads: self.n_heads / tp.size(),
            n_kv_heads: self.n_kv_heads / tp.size(),
            tp,
            ..self
        }
    }
}

impl<B: KernelBackend> Attention<B> {
    /// `[batch, len, hidden]` to `[batch, len, hidden]` (under sequence
    /// parallelism this rank's `len / tp` positions of both).
    ///
    /// With a `cache`, the new keys and values are appended to it and the
    /// queries attend to all cached positions as well.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        pos: &PositionContext<B>,
        cache: Option<&mut Option<LayerKv<B>>>,
    ) -> Tensor<B, 3> {
        let hd = self.head_dim;
        let x = column_input(x, &self.tp);
        let [b, t, _] = x.dims();
        let heads = |y: Tensor<B, 3>, n: usize| y.reshape([b, t, n, hd]).swap_dims(1, 2);
        let mut q = heads(self.q.forward(x.clone()), self.n_heads);
        let mut k = heads(self.k.forward(x.clone()), self.n_kv_heads);
        let mut v = heads(self.v.forward(x), self.n_kv_heads);
        if let Some(r) = &pos.rope {
            q = rope(q, r);
            k = rope(k, r);
        }
        if let Some(cache) = cache {
            if let Some((k_past, v_past)) = cache.take() {
                k = Tensor::cat(vec![k_past, k], 2);
                v = Tensor::cat(vec![v_past, v], 2);
            }
            *cache = Some((k.clone(), v.clone()));
        }
        let out = attention(pos.attention, q, k, v, &pos.attn_bias);
        let out = out.swap_dims(1, 2).reshape([b, t, self.n_heads * hd]);
        self.o.forward_row_parallel(out, &self.tp)
    }
}
