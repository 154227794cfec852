//! [`CubeBlockAttention`] on the device's own tensors: the ring's blocks
//! under device collectives (`ferrotron_parallel::context::RingAttention`
//! with a device kernel) never leave the GPU. Each piece of a block (the
//! `c x c` cut of the parent module) is sliced from the block's f32
//! tensors into a contiguous buffer for the launch, the pieces' outputs
//! are merged by the ring's online softmax as Burn operations
//! (`RingBuf::merge` of `Tensor<B, 4>`), their gradients added in place
//! (`RingBuf::add_rows`), and ALiBi's per-piece log-sum-exp shift is one
//! broadcast addition.

use std::ops::Range;

use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use burn_cubecl::cubecl::server::Handle;
use burn_cubecl::element::BoolElement;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use ferrotron_parallel::context::{Block, BlockAttention, RingBuf, WholeRows};

use super::cube::{pairs, shape, CubeBlockAttention, Pair, PieceUploads};
use crate::ops::cube::contiguous;

/// The f32 rows `[batch, heads, len, width]` of a CubeCL backend.
type Rows<R, BT> = Tensor<CubeBackend<R, f32, i32, BT>, 4>;

impl<R: CubeRuntime> CubeBlockAttention<R> {
    /// Positions `rows` of every (sequence, head) of `x`, in a contiguous
    /// buffer of exactly those values.
    fn piece<BT: BoolElement>(x: &Rows<R, BT>, rows: &Range<usize>) -> Handle {
        let [b, h, _, w] = x.dims();
        let part = x.clone().slice([0..b, 0..h, rows.clone(), 0..w]);
        contiguous(part.into_primitive().tensor()).handle
    }

    /// The pieces `rows` of each of `bufs`.
    fn pieces<BT: BoolElement>(bufs: &[&Rows<R, BT>], rows: &Range<usize>) -> Vec<Handle> {
        bufs.iter().map(|x| Self::piece(x, rows)).collect()
    }

    /// The f32 tensor `dims` that `handle` holds, on `like`'s device.
    fn rows_of<BT: BoolElement>(
        &self,
        handle: Handle,
        dims: [usize; 4],
        like: &Rows<R, BT>,
    ) -> Rows<R, BT> {
        let t = CubeTensor::new_contiguous(
            self.client.clone(),
            like.device(),
            dims.into(),
            handle,
            DType::F32,
        );
        Tensor::from_primitive(TensorPrimitive::Float(t))
    }

    /// `lse` `[batch, heads, len, 1]` shifted by `sign * slope_h * (k_start
    /// - q_start)` per head `h`: the piece's ALiBi offset (as the host
    /// path's `shift_lse`); unchanged without ALiBi or on the diagonal.
    fn shift<BT: BoolElement>(&self, lse: Rows<R, BT>, pair: &Pair, sign: f32) -> Rows<R, BT> {
        let distance = pair.k_start as f32 - pair.q_start as f32;
        if self.slopes.is_none() || distance == 0.0 {
            return lse;
        }
        let heads = lse.dims()[1];
        let shift: Vec<f32> = (0..heads)
            .map(|h| sign * self.slope(h) * distance)
            .collect();
        let shift = Tensor::from_data(TensorData::new(shift, [1, heads, 1, 1]), &lse.device());
        lse + shift
    }
}

impl<R: CubeRuntime, BT: BoolElement> BlockAttention<Rows<R, BT>> for CubeBlockAttention<R> {
    fn forward(&self, block: Block<'_, Rows<R, BT>>) -> (Rows<R, BT>, Rows<R, BT>) {
        let [b, h, len_q, d] = block.q.dims();
        let (len, pairs) = pairs(block.q_pos, block.k_pos);
        let shape = shape(block.q.dims(), block.k.dims()[1], len);
        let mut out = block.q.filled_like([b, h, len_q, d], 0.0);
        let mut lse = block.q.filled_like([b, h, len_q, 1], f32::NEG_INFINITY);
        let slopes = self.slopes_on_device();
        let mut queries = PieceUploads::new(len_q, len);
        let mut keys = PieceUploads::new(block.k.dims()[2], len);
        for pair in pairs {
            let q = queries.get(&pair.q_rows, || Self::pieces(&[block.q], &pair.q_rows))[0].clone();
            let kv = keys.get(&pair.k_rows, || {
                Self::pieces(&[block.k, block.v], &pair.k_rows)
            });
            let qkv = [q, kv[0].clone(), kv[1].clone()];
            let result = self.launch_forward(shape, &pair, &qkv, &slopes);
            let part = self.rows_of(result.out, [b, h, len, d], block.q);
            let part_lse = self.rows_of(result.lse, [b, h, len, 1], block.q);
            let part_lse = self.shift(part_lse, &pair, 1.0);
            RingBuf::merge(&mut out, &mut lse, pair.q_rows, &part, &part_lse);
        }
        (out, lse)
    }

    fn backward(
        &self,
        block: Block<'_, Rows<R, BT>>,
        whole: WholeRows<'_, Rows<R, BT>>,
    ) -> [Rows<R, BT>; 3] {
        let [b, h, _, d] = block.q.dims();
        let kv_heads = block.k.dims()[1];
        let (len, pairs) = pairs(block.q_pos, block.k_pos);
        let shape = shape(block.q.dims(), kv_heads, len);
        let mut dq = block.q.filled_like(block.q.dims(), 0.0);
        let mut dk = block.k.filled_like(block.k.dims(), 0.0);
        let mut dv = block.v.filled_like(block.v.dims(), 0.0);
        let slopes = self.slopes_on_device();
        let mut queries = PieceUploads::new(block.q.dims()[2], len);
        let mut keys = PieceUploads::new(block.k.dims()[2], len);
        for pair in pairs {
            let q = queries.get(&pair.q_rows, || {
                Self::pieces(&[block.q, whole.d_out, whole.delta], &pair.q_rows)
            });
            let (q, d_out, delta) = (q[0].clone(), q[1].clone(), q[2].clone());
            let kv = keys.get(&pair.k_rows, || {
                Self::pieces(&[block.k, block.v], &pair.k_rows)
            });
            let qkv = [q, kv[0].clone(), kv[1].clone()];
            let lse = self.shift(whole.lse.rows(pair.q_rows.clone()), &pair, -1.0);
            let lse = contiguous(lse.into_primitive().tensor()).handle;
            let grads = self.launch_backward(shape, &pair, &qkv, &slopes, [&lse, &delta, &d_out]);
            let kv_dims = [b, kv_heads, len, d];
            dq.add_rows(
                pair.q_rows,
                &self.rows_of(grads.dq, [b, h, len, d], block.q),
            );
            dk.add_rows(
                pair.k_rows.clone(),
                &self.rows_of(grads.dk, kv_dims, block.q),
            );
            dv.add_rows(pair.k_rows, &self.rows_of(grads.dv, kv_dims, block.q));
        }
        [dq, dk, dv]
    }
}
