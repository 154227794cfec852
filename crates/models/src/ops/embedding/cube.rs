//! The embedding lookup on the CubeCL backends: the gradient by the
//! `ferrotron_kernels::embedding` launcher on the backend's buffers
//! ([`grad`], what `FusedKernels::embedding_grad` runs), and on the
//! autodiff backend over them one graph node whose forward is Burn's
//! `select` and whose backward is that gradient ([`node`]).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use ferrotron_kernels::embedding::embedding_grad;

use crate::ops::cross_entropy::cube::i32_targets;
use crate::ops::cube::{cast_to, contiguous, in_f32, launched, rows_hidden};
use crate::ops::fused::FusedKernels;

/// The gradient of the table `[vocab, dim]` for the rows' gradient
/// `d_rows` `[tokens, dim]` and `ids` `[tokens]`: each row of `d_rows`
/// added to its id's row, in f32 in token order, then cast to `dtype` (the
/// table's).
pub(in crate::ops) fn grad<R: CubeRuntime>(
    d_rows: CubeTensor<R>,
    ids: CubeTensor<R>,
    vocab: usize,
    dtype: DType,
) -> CubeTensor<R> {
    let (d_rows, ids) = (contiguous(in_f32(d_rows)), contiguous(i32_targets(ids)));
    let (tokens, dim) = rows_hidden(&d_rows);
    let d_table = burn_cubecl::ops::numeric::zeros_client(
        d_rows.client.clone(),
        d_rows.device.clone(),
        Shape::new([vocab, dim]),
        DType::F32,
    );
    launched(
        "embedding grad",
        embedding_grad(
            &d_rows.client,
            &ids.handle,
            &d_rows.handle,
            &d_table.handle,
            tokens,
            dim,
            vocab,
        ),
    );
    cast_to(d_table, dtype)
}

#[derive(Debug)]
struct EmbeddingBackward;

impl<B: FusedKernels> Backward<B, 1> for EmbeddingBackward {
    /// The ids, the table's rows and its dtype.
    type State = (IntTensor<B>, usize, DType);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_rows = grads.consume::<B>(&ops.node);
        let (ids, vocab, dtype) = ops.state;
        register!(
            B,
            grads,
            ops.parents,
            [B::embedding_grad(d_rows, ids, vocab, dtype)]
        );
    }
}

/// The rows `ids` of `table` as one node of the autodiff graph over a
/// backend with the fused kernels.
pub(in crate::ops) fn node<B: FusedKernels, C: CheckpointStrategy>(
    table: FloatTensor<Autodiff<B, C>>,
    ids: IntTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let ids: IntTensor<B> = ids;
    let vocab = table.primitive.shape()[0];
    let dtype = table.primitive.dtype();
    match EmbeddingBackward
        .prepare::<C>([table.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let rows = B::float_select(table.primitive, 0, ids.clone());
            prep.finish((ids, vocab, dtype), rows)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::float_select(table.primitive, 0, ids)),
    }
}
