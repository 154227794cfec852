//! Mean softmax cross-entropy over the vocabulary, leaving out ignored
//! targets, every implementation in this folder: [`cross_entropy`] runs
//! the one its [`OpImpl`] names.
//!
//! - `reference`: the plain Burn body (every backend).
//! - `cube`: the CubeCL kernel of `ferrotron_kernels::cross_entropy`
//!   launched on the backend's buffers, and the autodiff node whose
//!   backward is the gradient the kernel formed
//!   ([`KernelBackend::fused_cross_entropy`]).
//!
//! Cross-entropy has no CPU operation of its own: the CPU backends' fast
//! path is the chunked head (`ops::linear_cross_entropy`,
//! `HeadLoss::Chunked`). The backend traits' cross-entropy methods
//! delegate here in one line.

pub(super) mod cube;
mod reference;

use burn::tensor::{FloatDType, Int, Tensor, TensorPrimitive};

use super::fused::KernelBackend;
use super::OpImpl;
use reference::cross_entropy_reference;

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
        OpImpl::Reference | OpImpl::Cpu => cross_entropy_reference(logits, targets),
    }
}
