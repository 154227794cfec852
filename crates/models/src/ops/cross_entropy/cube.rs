//! Cross-entropy of whole logits on the CubeCL backends: the
//! `ferrotron_kernels::cross_entropy` launcher on the backend's buffers
//! (f32 logits, whose buffer it overwrites with their gradient; what
//! `FusedKernels::cross_entropy` runs), and on the autodiff backend over
//! them one graph node keeping that gradient ([`node`]).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use ferrotron_kernels::cross_entropy::cross_entropy_forward_backward;

use crate::ops::cube::{contiguous, empty, launched, owned, rows_hidden};
use crate::ops::fused::FusedKernels;

/// `targets` as the kernels read the class ids: 32-bit integers (other
/// int dtypes cast to i32, as Burn's `int_cast` does).
pub(in crate::ops) fn i32_targets<R: CubeRuntime>(targets: CubeTensor<R>) -> CubeTensor<R> {
    match targets.dtype {
        DType::I32 | DType::U32 => targets,
        _ => burn_cubecl::kernel::cast(targets, DType::I32),
    }
}

/// The forward-and-backward kernel on `logits` `[rows, vocab]` (f32) and
/// `targets` `[rows]`: the mean loss (nats, `[1]`) and the logits'
/// gradient for an upstream gradient of 1, written over the logits'
/// buffer when nothing else holds it.
pub(in crate::ops) fn forward_backward<R: CubeRuntime>(
    logits: CubeTensor<R>,
    targets: CubeTensor<R>,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let targets = i32_targets(targets);
    let (logits, targets) = (owned(logits), contiguous(targets));
    let (rows, vocab) = rows_hidden(&logits);
    let row_loss = empty(&logits, Shape::new([rows]));
    let loss = empty(&logits, Shape::new([1]));
    launched(
        "cross_entropy",
        cross_entropy_forward_backward(
            &logits.client,
            &logits.handle,
            &targets.handle,
            &row_loss.handle,
            &loss.handle,
            rows,
            vocab,
            1.0,
        ),
    );
    (loss, logits)
}

#[derive(Debug)]
struct CrossEntropyBackward;

impl<B: FusedKernels> Backward<B, 1> for CrossEntropyBackward {
    /// The gradient of the loss with respect to the logits, for an upstream
    /// gradient of 1 (computed by the forward kernel).
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        // Upstream gradient of the scalar loss: `[1]`, broadcast over the logits.
        let upstream = B::float_reshape(grads.consume::<B>(&ops.node), Shape::new([1, 1]));
        register!(B, grads, ops.parents, [B::float_mul(ops.state, upstream)]);
    }
}

/// The mean cross-entropy as one autodiff node over a backend with the
/// fused kernels, keeping the logits' gradient the forward formed.
pub(in crate::ops) fn node<B: FusedKernels, C: CheckpointStrategy>(
    logits: FloatTensor<Autodiff<B, C>>,
    targets: IntTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let targets: IntTensor<B> = targets;
    match CrossEntropyBackward
        .prepare::<C>([logits.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (loss, d_logits) = B::cross_entropy(logits.primitive, targets);
            prep.finish(d_logits, loss)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::cross_entropy(logits.primitive, targets).0),
    }
}
