//! A dense layer `y = x W + b`.

use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use crate::init::Init;

/// Weight `[d_in, d_out]` and optional bias `[d_out]`.
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    /// `[d_in, d_out]`.
    pub weight: Param<Tensor<B, 2>>,
    /// `[d_out]`, when the family uses biases.
    pub bias: Option<Param<Tensor<B, 1>>>,
}

impl<B: Backend> Linear<B> {
    /// A layer with `N(0, std^2)` weights and zero bias.
    pub fn new(init: &mut Init<B>, d_in: usize, d_out: usize, bias: bool, std: f64) -> Self {
        Self {
            weight: init.normal([d_in, d_out], std),
            bias: bias.then(|| init.constant([d_out], 0.0)),
        }
    }

    /// `[batch, seq, d_in]` to `[batch, seq, d_out]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [b, t, d_in] = x.dims();
        let w = self.weight.val();
        let d_out = w.dims()[1];
        let mut y = x.reshape([b * t, d_in]).matmul(w);
        if let Some(bias) = &self.bias {
            y = y + bias.val().unsqueeze_dim(0);
        }
        y.reshape([b, t, d_out])
    }
}
