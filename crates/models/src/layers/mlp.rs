//! The feed-forward block: GELU (tanh) MLP or SwiGLU.

use burn::module::Module;
use burn::tensor::activation::{gelu_approximate, silu};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::Linear;
use crate::config::{DecoderConfig, MlpKind};
use crate::init::Init;

/// `down(act(up(x)))`, or `down(silu(gate(x)) * up(x))` for SwiGLU.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    /// `[hidden, ffn]`.
    pub up: Linear<B>,
    /// `[hidden, ffn]`, SwiGLU only.
    pub gate: Option<Linear<B>>,
    /// `[ffn, hidden]`.
    pub down: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    /// A fresh block; `out_std` initialises the output projection.
    pub fn new(init: &mut Init<B>, c: &DecoderConfig, out_std: f64) -> Self {
        let (h, f) = (c.hidden_size, c.ffn_size);
        Self {
            gate: (c.mlp == MlpKind::Swiglu).then(|| Linear::new(init, h, f, c.bias, c.init_std)),
            up: Linear::new(init, h, f, c.bias, c.init_std),
            down: Linear::new(init, f, h, c.bias, out_std),
        }
    }

    /// `[batch, seq, hidden]` to `[batch, seq, hidden]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let inner = match &self.gate {
            Some(gate) => silu(gate.forward(x.clone())) * self.up.forward(x),
            None => gelu_approximate(self.up.forward(x)),
        };
        self.down.forward(inner)
    }
}
