//! The feed-forward block: GELU (tanh) MLP or SwiGLU.

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use ferrotron_parallel::tensor::{column_input, ShardError, TpGroup};

use super::Linear;
use crate::config::{DecoderConfig, MlpKind};
use crate::init::Init;
use crate::ops::{KernelBackend, OpsChoice};

/// `down(act(up(x)))`, or `down(silu(gate(x)) * up(x))` for SwiGLU.
///
/// Under tensor parallelism over `t` ranks each rank holds `ffn / t` of the
/// hidden units: up and gate are column-parallel, down is row-parallel.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    /// `[hidden, ffn]`.
    pub up: Linear<B>,
    /// `[hidden, ffn]`, SwiGLU only.
    pub gate: Option<Linear<B>>,
    /// `[ffn, hidden]`.
    pub down: Linear<B>,
    #[module(skip)]
    ops: OpsChoice,
    #[module(skip)]
    tp: TpGroup,
}

impl<B: Backend> Mlp<B> {
    /// The block named `name` (`layers.0.mlp`): this rank's part (see
    /// [`Init`]) of fresh weights, computed with `ops` (a model's
    /// [`OpsChoice`], or a `Kernels` value); `out_std` initialises the
    /// output projection.
    ///
    /// # Errors
    /// A parameter the shard plan cannot cut.
    pub fn new(
        init: &Init<B>,
        name: &str,
        c: &DecoderConfig,
        out_std: f64,
        ops: impl Into<OpsChoice>,
    ) -> Result<Self, ShardError> {
        let (h, f) = (c.hidden_size, c.ffn_size);
        let ops = ops.into();
        let linear = |proj: &str, shape, std| {
            Linear::new(init, &format!("{name}.{proj}"), shape, c.bias, std, ops)
        };
        Ok(Self {
            gate: (c.mlp == MlpKind::Swiglu)
                .then(|| linear("gate", [h, f], c.init_std))
                .transpose()?,
            up: linear("up", [h, f], c.init_std)?,
            down: linear("down", [f, h], out_std)?,
            ops,
            tp: TpGroup::single(),
        })
    }

    /// The block with its weights already cut to this rank's hidden units
    /// (see `crate::tensor_parallel`), computing over `tp`.
    pub(crate) fn split_units(self, tp: TpGroup) -> Self {
        Self { tp, ..self }
    }
}

impl<B: KernelBackend> Mlp<B> {
    /// `[batch, seq, hidden]` to `[batch, seq, hidden]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let x = column_input(x, &self.tp);
        let inner = match &self.gate {
            Some(gate) => self.ops.swiglu(gate.forward(x.clone()), self.up.forward(x)),
            None => self.ops.gelu_tanh(self.up.forward(x)),
        };
        self.down.forward_row_parallel(inner, &self.tp)
    }
}
