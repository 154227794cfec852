//! Mean softmax cross-entropy over the vocabulary.

use burn::tensor::activation::log_softmax;
use burn::tensor::{FloatDType, Int, Tensor, TensorPrimitive};

use super::fused::KernelBackend;
use crate::config::Kernels;

/// Mean cross-entropy of `logits` `[batch, seq, vocab]` against `targets`
/// `[batch, seq]`, in nats per token; shape `[1]`. Computed in f32 whatever
/// the logits' dtype (mixed precision casts them up first). The fused
/// kernel never forms the probabilities; it writes the logits' gradient
/// over them.
pub fn cross_entropy<B: KernelBackend>(
    kernels: Kernels,
    logits: Tensor<B, 3>,
    targets: Tensor<B, 2, Int>,
) -> Tensor<B, 1> {
    let [b, t, v] = logits.dims();
    let logits = logits.cast(FloatDType::F32).reshape([b * t, v]);
    let targets = targets.reshape([b * t]);
    match kernels {
        Kernels::Fused => Tensor::from_primitive(TensorPrimitive::Float(B::fused_cross_entropy(
            logits.into_primitive().tensor(),
            targets.into_primitive(),
        ))),
        Kernels::Reference => {
            let logp = log_softmax(logits, 1);
            logp.gather(1, targets.reshape([b * t, 1])).mean().neg()
        }
    }
}
