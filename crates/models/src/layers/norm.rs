//! LayerNorm and RMSNorm over the last dimension.

use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Tensor};

use ferrotron_parallel::tensor::ShardError;

use crate::config::NormKind;
use crate::init::Init;
use crate::ops::{KernelBackend, OpsChoice};

/// A normalisation layer: gain `[hidden]` and, for LayerNorm, bias `[hidden]`.
#[derive(Module, Debug)]
pub struct Norm<B: Backend> {
    /// Gain, initialised to one.
    pub weight: Param<Tensor<B, 1>>,
    /// Bias (LayerNorm only), initialised to zero.
    pub bias: Option<Param<Tensor<B, 1>>>,
    #[module(skip)]
    kind: NormKind,
    #[module(skip)]
    eps: f64,
    #[module(skip)]
    ops: OpsChoice,
}

impl<B: Backend> Norm<B> {
    /// The layer named `name` (`layers.0.attn_norm`) of width `hidden`:
    /// unit gain, zero bias (or placeholders, see [`Init`]), computed with
    /// `ops` (a model's [`OpsChoice`], or a `Kernels` value).
    ///
    /// # Errors
    /// A parameter the shard plan does not name.
    pub fn new(
        init: &Init<B>,
        name: &str,
        (kind, hidden, eps): (NormKind, usize, f64),
        ops: impl Into<OpsChoice>,
    ) -> Result<Self, ShardError> {
        Ok(Self {
            weight: init.constant(&format!("{name}.weight"), [hidden], 1.0)?,
            bias: (kind == NormKind::LayerNorm)
                .then(|| init.constant(&format!("{name}.bias"), [hidden], 0.0))
                .transpose()?,
            kind,
            eps,
            ops: ops.into(),
        })
    }
}

impl<B: KernelBackend> Norm<B> {
    /// Normalises `[batch, seq, hidden]` over `hidden`.
    ///
    /// LayerNorm: `(x - mean) / sqrt(var + eps) * w + b` with the biased
    /// variance; RMSNorm: `x / sqrt(mean(x^2) + eps) * w`. Computed in f32
    /// whatever `x`'s dtype (mixed precision), the result cast back to it.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let dtype = x.dtype();
        let x = x.cast(FloatDType::F32);
        let weight = self.weight.val();
        let y = match self.kind {
            NormKind::LayerNorm => {
                let bias = match &self.bias {
                    Some(b) => b.val(),
                    None => weight.zeros_like(),
                };
                self.ops.layer_norm(x, weight, bias, self.eps)
            }
            NormKind::RmsNorm => self.ops.rms_norm(x, weight, self.eps),
        };
        y.cast(dtype)
    }
}
