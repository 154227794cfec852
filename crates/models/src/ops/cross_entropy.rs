//! Mean softmax cross-entropy over the vocabulary, leaving out ignored
//! targets.

use burn::tensor::activation::log_softmax;
use burn::tensor::{FloatDType, Int, Tensor, TensorPrimitive};

use super::fused::KernelBackend;
use super::OpImpl;

/// Mean cross-entropy of `logits` `[batch, seq, vocab]` against `targets`
/// `[batch, seq]`, in nats per kept token; shape `[1]`. Computed in f32
/// whatever the logits' dtype (mixed precision casts them up first). A
/// negative target (`ferrotron_engine::data::IGNORED_TARGET`, the goldfish
/// loss's dropped tokens) is ignored: it adds nothing to the sum, is not
/// counted in the mean and its row of the logits gets no gradient; when
/// every target is ignored the loss is 0. The fused kernel never forms the
/// probabilities; it writes the logits' gradient over them (it reads the ids
/// as u32, where a negative id is `>= vocab`, which it ignores the same way).
/// `op` is an [`OpImpl`] or a `Kernels` value; cross-entropy has no CPU
/// operation of its own ([`OpImpl::Cpu`] runs the reference: the CPU
/// backends' fast path is the chunked head, `HeadLoss::Chunked`).
pub fn cross_entropy<B: KernelBackend>(
    op: impl Into<OpImpl>,
    logits: Tensor<B, 3>,
    targets: Tensor<B, 2, Int>,
) -> Tensor<B, 1> {
    let [b, t, v] = logits.dims();
    let logits = logits.cast(FloatDType::F32).reshape([b * t, v]);
    let targets = targets.reshape([b * t]);
    match op.into() {
        OpImpl::Fused => Tensor::from_primitive(TensorPrimitive::Float(B::fused_cross_entropy(
            logits.into_primitive().tensor(),
            targets.into_primitive(),
        ))),
        OpImpl::Reference | OpImpl::Cpu => {
            let kept = targets.clone().greater_equal_elem(0).float();
            let picked = targets.clamp_min(0).reshape([b * t, 1]);
            let nll = log_softmax(logits, 1)
                .gather(1, picked)
                .reshape([b * t])
                .neg();
            let count = kept.clone().sum().clamp_min(1.0);
            (nll * kept).sum() / count
        }
    }
}
