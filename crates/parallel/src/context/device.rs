//! The ring on a backend's device tensors: f32 `Tensor<B, 4>` as a
//! [`RingBuf`] (slices, sums and the online-softmax merge as Burn
//! operations, so nothing leaves the device), [`DeviceRing`] passing
//! them over [`TensorCollectives::exchange`], and [`OnHost`], a host
//! block kernel used on device tensors.
//!
//! [`DeviceRing`] does not overlap the transfer with the step: the grouped
//! send/receive runs, then the step (NCCL's calls wait for the device's
//! queued work and for their own stream, see
//! [`crate::comm::nccl::device`]).

use std::ops::Range;

use burn::tensor::backend::Backend;
use burn::tensor::{DType, FloatDType, Tensor, TensorData};
use ferrotron_engine::precision::Precision;

use super::block::{Block, BlockAttention, HeadBuf, WholeRows};
use super::buf::RingBuf;
use super::transport::RingTransport;
use crate::comm::nccl::device::{Route, TensorCollectives};
use crate::comm::CommError;

/// The `[batch, heads, rows, width]` slice of `x` at positions `rows`.
fn at(dims: [usize; 4], rows: Range<usize>) -> [Range<usize>; 4] {
    [0..dims[0], 0..dims[1], rows, 0..dims[3]]
}

/// Device tensors hold f32 (the caller casts them; see the module doc).
impl<B: Backend> RingBuf for Tensor<B, 4> {
    fn dims(&self) -> [usize; 4] {
        Tensor::dims(self)
    }

    fn filled_like(&self, dims: [usize; 4], value: f32) -> Self {
        Tensor::full(dims, value, (&self.device(), DType::F32))
    }

    fn rows(&self, rows: Range<usize>) -> Self {
        if rows == (0..self.dims()[2]) {
            return self.clone();
        }
        self.clone().slice(at(self.dims(), rows))
    }

    fn add_rows(&mut self, rows: Range<usize>, part: &Self) {
        let dims = self.dims();
        let [b, h, _, w] = dims;
        assert_eq!(
            part.dims(),
            [b, h, rows.len(), w],
            "rows {rows:?} of {dims:?}"
        );
        let at = at(dims, rows);
        let sum = self.clone().slice(at.clone()) + part.clone();
        *self = self.clone().slice_assign(at, sum);
    }

    fn merge(out: &mut Self, lse: &mut Self, rows: Range<usize>, part: &Self, part_lse: &Self) {
        let [b, h, len, d] = out.dims();
        let n = rows.len();
        assert_eq!(lse.dims(), [b, h, len, 1], "merge: lse {:?}", lse.dims());
        assert_eq!(part.dims(), [b, h, n, d], "merge: part {:?}", part.dims());
        assert_eq!(
            part_lse.dims(),
            [b, h, n, 1],
            "merge: part lse {:?}",
            part_lse.dims()
        );
        let (lse_at, out_at) = (at(lse.dims(), rows.clone()), at(out.dims(), rows));
        let old = lse.clone().slice(lse_at.clone());
        let new = part_lse.clone();
        let top = old.clone().max_pair(new.clone());
        let merged =
            top.clone() + ((old.clone() - top.clone()).exp() + (new.clone() - top).exp()).log();
        let keep = (old - merged.clone()).exp().expand([b, h, n, d]);
        let take = (new - merged.clone()).exp().expand([b, h, n, d]);
        let rows_out = keep * out.clone().slice(out_at.clone()) + take * part.clone();
        *out = out.clone().slice_assign(out_at, rows_out);
        *lse = lse.clone().slice_assign(lse_at, merged);
    }

    fn row_dots(&self, other: &Self) -> Self {
        assert_eq!(self.dims(), other.dims(), "row dots of {:?}", other.dims());
        (self.clone() * other.clone()).sum_dim(3)
    }
}

/// The ring on device tensors: this rank `rank` of the ring whose device
/// collectives are `collectives` (opened over the context-parallel group).
/// Blocks travel in f32.
pub struct DeviceRing<'a, B: Backend> {
    collectives: &'a dyn TensorCollectives<B>,
    rank: usize,
}

impl<'a, B: Backend> DeviceRing<'a, B> {
    /// Rank `rank` of the ring of `collectives.world_size()` ranks.
    pub fn new(collectives: &'a dyn TensorCollectives<B>, rank: usize) -> Self {
        assert!(
            rank < collectives.world_size(),
            "rank {rank} of a ring of {}",
            collectives.world_size()
        );
        Self { collectives, rank }
    }
}

impl<B: Backend> RingTransport<Tensor<B, 4>> for DeviceRing<'_, B> {
    fn place(&self) -> (usize, usize) {
        (self.rank, self.collectives.world_size())
    }

    fn pass_on<R>(
        &self,
        send: &[(i32, &Tensor<B, 4>)],
        compute: impl FnOnce() -> R,
    ) -> Result<(Vec<Tensor<B, 4>>, R), CommError> {
        let Some((_, first)) = send.first() else {
            return Ok((Vec::new(), compute()));
        };
        let (rank, cp) = self.place();
        let (next, prev) = ((rank + 1) % cp, (rank + cp - 1) % cp);
        let device = first.device();
        let sends = send
            .iter()
            .map(|&(tag, t)| {
                let n = t.shape().num_elements();
                (Route { peer: next, tag }, t.clone().reshape([n]))
            })
            .collect();
        let recvs: Vec<(Route, usize)> = send
            .iter()
            .map(|&(tag, t)| (Route { peer: prev, tag }, t.shape().num_elements()))
            .collect();
        let received = self
            .collectives
            .exchange(sends, &recvs, Precision::Fp32, &device)?;
        let result = compute();
        let received = received
            .into_iter()
            .zip(send)
            .map(|(r, (_, like))| r.reshape(like.dims()))
            .collect();
        Ok((received, result))
    }
}

/// A host block kernel (`A` on [`HeadBuf`]s) run on device tensors: each
/// block is copied to the host and its results back (what a backend
/// without a device block kernel does).
pub struct OnHost<'a, A: ?Sized>(pub &'a A);

impl<B: Backend, A: BlockAttention + ?Sized> BlockAttention<Tensor<B, 4>> for OnHost<'_, A> {
    fn forward(&self, block: Block<'_, Tensor<B, 4>>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let device = block.q.device();
        let [q, k, v] = [block.q, block.k, block.v].map(|t| host(t.clone()));
        let (out, lse) = self.0.forward(Block {
            q: &q,
            k: &k,
            v: &v,
            q_pos: block.q_pos,
            k_pos: block.k_pos,
        });
        (
            tensor(out, &device, DType::F32),
            tensor(lse, &device, DType::F32),
        )
    }

    fn backward(
        &self,
        block: Block<'_, Tensor<B, 4>>,
        whole: WholeRows<'_, Tensor<B, 4>>,
    ) -> [Tensor<B, 4>; 3] {
        let device = block.q.device();
        let [q, k, v, d_out, lse, delta] = [
            block.q,
            block.k,
            block.v,
            whole.d_out,
            whole.lse,
            whole.delta,
        ]
        .map(|t| host(t.clone()));
        let grads = self.0.backward(
            Block {
                q: &q,
                k: &k,
                v: &v,
                q_pos: block.q_pos,
                k_pos: block.k_pos,
            },
            WholeRows {
                d_out: &d_out,
                lse: &lse,
                delta: &delta,
            },
        );
        grads.map(|g| tensor(g, &device, DType::F32))
    }
}

/// A tensor's values in logical order, as f32.
pub(super) fn host<B: Backend>(x: Tensor<B, 4>) -> HeadBuf {
    let dims = x.dims();
    let data = x
        .cast(FloatDType::F32)
        .into_data()
        .into_vec::<f32>()
        .expect("a tensor cast to f32 holds f32");
    HeadBuf::new(dims, data)
}

/// Host values as a tensor of `dtype` on `device`.
pub(super) fn tensor<B: Backend>(x: HeadBuf, device: &B::Device, dtype: DType) -> Tensor<B, 4> {
    Tensor::<B, 4>::from_data(TensorData::new(x.data, x.dims), device).cast(dtype)
}
