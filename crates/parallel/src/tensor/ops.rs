//! The communication operators of Megatron-LM's tensor parallelism, as
//! autodiff operations (Shoeybi et al. 2019, figure 3):
//!
//! - [`copy_to_tp`] (Megatron's `f`): the identity forward, an all-reduce
//!   of the gradient backward. It stands before a column-parallel layer,
//!   whose input every rank holds whole but whose gradient each rank only
//!   computes a part of.
//! - [`reduce_from_tp`] (Megatron's `g`): an all-reduce forward, the
//!   identity backward. It stands after a row-parallel layer, whose output
//!   each rank holds a partial sum of.
//! - [`gather_from_tp`]: the concatenation of every rank's last dimension
//!   forward, this rank's block of the gradient backward (logits of a
//!   vocabulary-parallel head, when the whole vocabulary is wanted).
//! - Sequence parallelism (Korthikanti et al. 2022), on `[batch, seq,
//!   hidden]` activations split along `seq`: [`gather_from_sp`] (all-gather
//!   forward, reduce-scatter backward) replaces `f` before a
//!   column-parallel layer, and [`scatter_to_sp`] (reduce-scatter forward,
//!   all-gather backward) replaces `g` after a row-parallel one.
//!
//! Each is a method of [`TpOps`], implemented by every backend: the
//! autodiff backend records a graph node whose backward does the
//! conjugate operation over the group; the inner backends (no autodiff:
//! evaluation, generation) run the forward alone. On a group of one rank
//! every operator is the identity and records nothing.
//!
//! The values travel through the group's collectives ([`super::collective`]):
//! its communicator's host `f32` path, or collectives on the tensors'
//! own buffers ([`TpGroup::with_device`]: NCCL on the GPU, sent in the
//! compute dtype). Each operator returns its input's dtype: under bf16 or
//! fp16 compute the activations and their gradients cross the group in
//! the compute dtype's values, as a 16-bit collective (Megatron's, in the
//! compute dtype) carries them. A gather moves 16-bit values exactly; a
//! sum (all-reduce, reduce-scatter) adds the ranks' 16-bit values in f32
//! and rounds the sum once to the compute dtype: over two ranks what a
//! 16-bit collective gives (NCCL adds two bf16 values in f32 and rounds
//! the sum); over more ranks a ring collective rounds each partial sum,
//! the host path rounds once. A failed collective inside a forward or
//! backward pass cannot be returned through Burn's operations, so it
//! panics with the communicator's error (which names the ranks that never
//! arrived); the other ranks then fail on their own timeout.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use super::{collective, TpGroup};

/// Backends that can run the tensor-parallel operators (see the module
/// doc). The defaults are the forward computations, right for a backend
/// without autodiff; the autodiff backend overrides them with graph nodes.
pub trait TpOps: Backend {
    /// Megatron's `f`: `x` itself; on the autodiff backend its gradient is
    /// all-reduced over `group`.
    fn tp_copy<const D: usize>(x: Tensor<Self, D>, _group: &TpGroup) -> Tensor<Self, D> {
        x
    }

    /// Megatron's `g`: `x` summed over `group`; on the autodiff backend its
    /// gradient passes unchanged.
    fn tp_reduce<const D: usize>(x: Tensor<Self, D>, group: &TpGroup) -> Tensor<Self, D> {
        all_reduce(x, group)
    }

    /// Every rank's `x` `[.., n]` concatenated in rank order along the last
    /// dimension: `[.., n * group.size()]`; on the autodiff backend the
    /// gradient of `x` is this rank's block of the output's gradient.
    fn tp_gather<const D: usize>(x: Tensor<Self, D>, group: &TpGroup) -> Tensor<Self, D> {
        all_gather_last(x, group)
    }

    /// Every rank's sequence block `x` `[batch, seq / tp, hidden]` joined in
    /// rank order: `[batch, seq, hidden]`; on the autodiff backend the
    /// gradient is reduce-scattered back along the sequence.
    fn sp_gather(x: Tensor<Self, 3>, group: &TpGroup) -> Tensor<Self, 3> {
        all_gather_seq(x, group)
    }

    /// `x` `[batch, seq, hidden]` summed over `group`, this rank keeping
    /// its block of the sequence, `[batch, seq / tp, hidden]`; on the
    /// autodiff backend the gradient is all-gathered along the sequence.
    fn sp_scatter(x: Tensor<Self, 3>, group: &TpGroup) -> Tensor<Self, 3> {
        reduce_scatter_seq(x, group)
    }
}

/// Megatron's `f` (see the module doc); the identity on one rank.
pub fn copy_to_tp<B: TpOps, const D: usize>(x: Tensor<B, D>, group: &TpGroup) -> Tensor<B, D> {
    if group.size() == 1 {
        return x;
    }
    B::tp_copy(x, group)
}

/// Megatron's `g` (see the module doc); the identity on one rank.
pub fn reduce_from_tp<B: TpOps, const D: usize>(x: Tensor<B, D>, group: &TpGroup) -> Tensor<B, D> {
    if group.size() == 1 {
        return x;
    }
    B::tp_reduce(x, group)
}

/// Every rank's `x` concatenated along the last dimension (see the module
/// doc); the identity on one rank.
pub fn gather_from_tp<B: TpOps, const D: usize>(x: Tensor<B, D>, group: &TpGroup) -> Tensor<B, D> {
    if group.size() == 1 {
        return x;
    }
    B::tp_gather(x, group)
}

/// Sequence parallelism's all-gather (see [`TpOps::sp_gather`]); the
/// identity on one rank.
pub fn gather_from_sp<B: TpOps>(x: Tensor<B, 3>, group: &TpGroup) -> Tensor<B, 3> {
    if group.size() == 1 {
        return x;
    }
    B::sp_gather(x, group)
}

/// Sequence parallelism's reduce-scatter (see [`TpOps::sp_scatter`]);
/// the identity on one rank.
pub fn scatter_to_sp<B: TpOps>(x: Tensor<B, 3>, group: &TpGroup) -> Tensor<B, 3> {
    if group.size() == 1 {
        return x;
    }
    B::sp_scatter(x, group)
}

/// The input of a column-parallel layer, `[batch, seq, hidden]`, from the
/// activations `x` around it: `f` ([`copy_to_tp`]), or under sequence
/// parallelism the all-gather of every rank's `[batch, seq / tp, hidden]`
/// block ([`gather_from_sp`]).
pub fn column_input<B: TpOps>(x: Tensor<B, 3>, group: &TpGroup) -> Tensor<B, 3> {
    if group.sequence_parallel() {
        gather_from_sp(x, group)
    } else {
        copy_to_tp(x, group)
    }
}

/// The output of a row-parallel layer from this rank's partial sums `x`
/// `[batch, seq, hidden]`: `g` ([`reduce_from_tp`]), or under sequence
/// parallelism the reduce-scatter into this rank's `[batch, seq / tp,
/// hidden]` block ([`scatter_to_sp`]).
pub fn row_output<B: TpOps>(x: Tensor<B, 3>, group: &TpGroup) -> Tensor<B, 3> {
    if group.sequence_parallel() {
        scatter_to_sp(x, group)
    } else {
        reduce_from_tp(x, group)
    }
}

/// Every rank's `x` `[batch, s, hidden]` joined along the sequence.
fn all_gather_seq<B: Backend>(x: Tensor<B, 3>, group: &TpGroup) -> Tensor<B, 3> {
    let [b, s, h] = x.dims();
    let (tp, dtype) = (group.size(), x.dtype());
    let all = collective::gather(x.reshape([b * s * h]), group)
        .unwrap_or_else(|e| panic!("sequence-parallel all-gather over {group:?} failed: {e}"));
    all.reshape([tp, b, s, h])
        .swap_dims(0, 1)
        .reshape([b, tp * s, h])
        .cast(dtype)
}

/// `x` `[batch, seq, hidden]` summed over `group`; this rank's block of
/// the sequence, `[batch, seq / tp, hidden]`.
fn reduce_scatter_seq<B: Backend>(x: Tensor<B, 3>, group: &TpGroup) -> Tensor<B, 3> {
    let [b, seq, h] = x.dims();
    let (tp, dtype) = (group.size(), x.dtype());
    let s = seq / tp;
    let blocks = x
        .reshape([b, tp, s, h])
        .swap_dims(0, 1)
        .reshape([tp * b * s * h]);
    collective::sum_scatter(blocks, group)
        .unwrap_or_else(|e| panic!("sequence-parallel reduce-scatter over {group:?} failed: {e}"))
        .reshape([b, s, h])
        .cast(dtype)
}

/// `x` summed element-wise over `group`.
fn all_reduce<B: Backend, const D: usize>(x: Tensor<B, D>, group: &TpGroup) -> Tensor<B, D> {
    let (shape, dtype) = (x.shape(), x.dtype());
    let n = shape.num_elements();
    collective::sum(x.reshape([n]), group)
        .unwrap_or_else(|e| panic!("tensor-parallel all-reduce over {group:?} failed: {e}"))
        .reshape(shape)
        .cast(dtype)
}

/// Every rank's `x` `[.., n]` side by side along the last dimension.
fn all_gather_last<B: Backend, const D: usize>(x: Tensor<B, D>, group: &TpGroup) -> Tensor<B, D> {
    let dims = x.dims();
    let n = dims[D - 1];
    let rows = x.shape().num_elements() / n.max(1);
    let (tp, dtype) = (group.size(), x.dtype());
    let flat = x.reshape([rows * n]);
    let all = collective::gather(flat, group)
        .unwrap_or_else(|e| panic!("tensor-parallel all-gather over {group:?} failed: {e}"));
    let mut out = dims;
    out[D - 1] = n * tp;
    all.reshape([tp, rows, n])
        .swap_dims(0, 1)
        .reshape(out)
        .cast(dtype)
}

/// This rank's block of `x` `[.., n * size]` along the last dimension.
fn own_block<B: Backend, const D: usize>(x: Tensor<B, D>, group: &TpGroup) -> Tensor<B, D> {
    let n = x.dims()[D - 1] / group.size();
    x.narrow(D - 1, group.rank() * n, n)
}

fn float<B: Backend, const D: usize>(p: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

fn primitive<B: Backend, const D: usize>(t: Tensor<B, D>) -> FloatTensor<B> {
    t.into_primitive().tensor()
}

/// Backward of `f`: all-reduces the gradient.
#[derive(Debug)]
struct CopyBackward<const D: usize>;

impl<B: Backend, const D: usize> Backward<B, 1> for CopyBackward<D> {
    type State = TpGroup;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        if let [Some(parent)] = ops.parents {
            let summed = all_reduce::<B, D>(float(grad), &ops.state);
            grads.register::<B>(parent.id, primitive(summed));
        }
    }
}

/// Backward of `g`: passes the gradient unchanged.
#[derive(Debug)]
struct ReduceBackward;

impl<B: Backend> Backward<B, 1> for ReduceBackward {
    type State = ();

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        if let [Some(parent)] = ops.parents {
            grads.register::<B>(parent.id, grad);
        }
    }
}

/// Backward of the gather: keeps this rank's block of the gradient.
#[derive(Debug)]
struct GatherBackward<const D: usize>;

impl<B: Backend, const D: usize> Backward<B, 1> for GatherBackward<D> {
    type State = TpGroup;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        if let [Some(parent)] = ops.parents {
            let block = own_block::<B, D>(float(grad), &ops.state);
            grads.register::<B>(parent.id, primitive(block));
        }
    }
}

/// Backward of the sequence all-gather: reduce-scatters the gradient.
#[derive(Debug)]
struct SeqGatherBackward;

impl<B: Backend> Backward<B, 1> for SeqGatherBackward {
    type State = TpGroup;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        if let [Some(parent)] = ops.parents {
            let block = reduce_scatter_seq::<B>(float(grad), &ops.state);
            grads.register::<B>(parent.id, primitive(block));
        }
    }
}

/// Backward of the sequence reduce-scatter: all-gathers the gradient.
#[derive(Debug)]
struct SeqScatterBackward;

impl<B: Backend> Backward<B, 1> for SeqScatterBackward {
    type State = TpGroup;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        if let [Some(parent)] = ops.parents {
            let whole = all_gather_seq::<B>(float(grad), &ops.state);
            grads.register::<B>(parent.id, primitive(whole));
        }
    }
}

/// A graph node of `x` whose output is `forward(x)` and whose backward is
/// `backward` with the group as state.
fn group_node<B, C, O>(
    x: Tensor<Autodiff<B, C>, 3>,
    group: &TpGroup,
    op: O,
    forward: fn(Tensor<B, 3>, &TpGroup) -> Tensor<B, 3>,
) -> Tensor<Autodiff<B, C>, 3>
where
    B: Backend,
    C: CheckpointStrategy,
    O: Backward<B, 1, State = TpGroup>,
{
    let x = primitive(x);
    let out = primitive(forward(float(x.primitive), group));
    let out = match op.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(group.clone(), out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    float(out)
}

impl<B: Backend, C: CheckpointStrategy> TpOps for Autodiff<B, C> {
    fn sp_gather(x: Tensor<Self, 3>, group: &TpGroup) -> Tensor<Self, 3> {
        group_node(x, group, SeqGatherBackward, all_gather_seq::<B>)
    }

    fn sp_scatter(x: Tensor<Self, 3>, group: &TpGroup) -> Tensor<Self, 3> {
        group_node(x, group, SeqScatterBackward, reduce_scatter_seq::<B>)
    }

    fn tp_copy<const D: usize>(x: Tensor<Self, D>, group: &TpGroup) -> Tensor<Self, D> {
        let x = primitive(x);
        let out = match CopyBackward::<D>
            .prepare::<C>([x.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(group.clone(), x.primitive),
            OpsKind::UnTracked(prep) => prep.finish(x.primitive),
        };
        float(out)
    }

    fn tp_reduce<const D: usize>(x: Tensor<Self, D>, group: &TpGroup) -> Tensor<Self, D> {
        let x = primitive(x);
        let summed = primitive(all_reduce::<B, D>(float(x.primitive), group));
        let out = ReduceBackward
            .prepare::<C>([x.node.clone()])
            .compute_bound()
            .stateless(summed);
        float(out)
    }

    fn tp_gather<const D: usize>(x: Tensor<Self, D>, group: &TpGroup) -> Tensor<Self, D> {
        let x = primitive(x);
        let gathered = primitive(all_gather_last::<B, D>(float(x.primitive), group));
        let out = match GatherBackward::<D>
            .prepare::<C>([x.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(group.clone(), gathered),
            OpsKind::UnTracked(prep) => prep.finish(gathered),
        };
        float(out)
    }
}

#[cfg(feature = "flex")]
impl TpOps for burn::backend::Flex {}

#[cfg(feature = "ndarray")]
impl TpOps for burn::backend::NdArray {}

impl<R, F, I, BT> TpOps for burn_cubecl::CubeBackend<R, F, I, BT>
where
    R: burn_cubecl::CubeRuntime,
    F: burn_cubecl::FloatElement,
    I: burn_cubecl::IntElement,
    BT: burn_cubecl::element::BoolElement,
{
}
