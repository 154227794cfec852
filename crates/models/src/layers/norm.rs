//! LayerNorm and RMSNorm over the last dimension.

use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use crate::config::NormKind;

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
}

impl<B: Backend> Norm<B> {
    /// A fresh layer of width `hidden`: unit gain, zero bias.
    pub fn new(kind: NormKind, hidden: usize, eps: f64, device: &B::Device) -> Self {
        let constant = |v| Param::from_tensor(Tensor::full([hidden], v, device));
        Self {
            weight: constant(1.0),
            bias: (kind == NormKind::LayerNorm).then(|| constant(0.0)),
            kind,
            eps,
        }
    }

    /// Normalises `[batch, seq, hidden]` over `hidden`.
    ///
    /// LayerNorm: `(x - mean) / sqrt(var + eps) * w + b` with the biased
    /// variance; RMSNorm: `x / sqrt(mean(x^2) + eps) * w`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let x = match self.kind {
            NormKind::LayerNorm => {
                let centred = x.clone() - x.mean_dim(2);
                let var = (centred.clone() * centred.clone()).mean_dim(2);
                centred / var.add_scalar(self.eps).sqrt()
            }
            NormKind::RmsNorm => {
                let ms = (x.clone() * x.clone()).mean_dim(2);
                x / ms.add_scalar(self.eps).sqrt()
            }
        };
        let y = x * self.weight.val().unsqueeze::<3>();
        match &self.bias {
            Some(b) => y + b.val().unsqueeze::<3>(),
            None => y,
        }
    }
}
