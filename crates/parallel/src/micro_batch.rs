//! One micro-batch's forward and backward, in one of two ways:
//!
//! - [`whole_graph`]: the model's loss and one backward pass (every
//!   activation kept until backward);
//! - [`unit_by_unit`]: full recomputation, in FSDP's order. Forward runs the
//!   blocks one at a time without recording anything for backward (on a
//!   copy of the model whose parameters do not require gradients,
//!   [`no_grad`](burn::module::Module::no_grad), from a detached input), each between an
//!   [`acquire`](GradSync::acquire) and a [`release`](GradSync::release),
//!   keeping only each block's input; then the head's loss is
//!   back-propagated, and each block in reverse is acquired again,
//!   recomputed with autodiff and back-propagated from the incoming
//!   gradient `g` through `sum(block(x) * g)`, its gradients handed to
//!   [`accumulate`](GradSync::accumulate) and the block released. The
//!   embedding and head units stay acquired for the whole step. After
//!   each acquire, before the block runs, the blocks acquired after it
//!   are handed to [`prefetch`](GradSync::prefetch) in the order they
//!   will be acquired (forward `0..L`, then backward `L-1` down to 0):
//!   ZeRO-3 with overlap starts the gathers of the next
//!   `--zero3-prefetch` of them then, across the turn from forward to
//!   backward too.
//!
//! The [`GradSync`] hooks decide what acquiring, releasing and
//! accumulating mean (ZeRO-3: all-gather, free, reduce-scatter; the other
//! strategies: nothing, nothing, keep); these functions never look at the
//! stage. The trainer picks [`unit_by_unit`] for full recomputation, which
//! ZeRO-3 always is. The pipeline's executor ([`crate::pipeline`]) is one
//! more such schedule, over stages, calling the same hooks.

use burn::module::AutodiffModule;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use ferrotron_engine::data::Batch;
use ferrotron_engine::lm::{LmUnit, LmUnits};

use crate::comm::CommError;
use crate::grad_sync::GradSync;
use crate::tensor::PartialGrads;

/// Token ids of a batch as `(inputs, targets)`, each `[batch, seq_len]`.
pub fn batch_tensors<B: Backend>(
    batch: &Batch,
    device: &B::Device,
) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
    let shape = [batch.batch, batch.seq_len];
    (
        Tensor::from_data(TensorData::new(batch.inputs.clone(), shape), device),
        Tensor::from_data(TensorData::new(batch.targets.clone(), shape), device),
    )
}

/// Forward and backward of `batch` on the whole graph; the gradients of
/// the loss times `weight` (the micro-batch's share of the step, times the
/// loss scale) go to `sync` (the `partial` ones
/// summed over the TP group first). Returns the model and the batch's
/// mean loss, nats/token.
pub fn whole_graph<B, M>(
    sync: &mut dyn GradSync<B, M>,
    partial: &PartialGrads,
    model: M,
    batch: &Batch,
    weight: f64,
    device: &B::Device,
) -> Result<(M, f64), CommError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + LmUnits<B>,
{
    let (inputs, targets) = batch_tensors::<B>(batch, device);
    let loss = model.loss(inputs, targets);
    let value = loss.clone().into_scalar().elem::<f64>();
    let grads = loss.mul_scalar(weight).backward();
    let grads = partial.sum(&model, GradientsParams::from_grads(grads, &model))?;
    sync.accumulate(&model, grads)?;
    Ok((model, value))
}

/// Forward and backward of `batch` one unit at a time (see the module
/// doc), with the embedding and head units already acquired; the gradients
/// of the loss times `weight` go to `sync` unit by unit (the
/// `partial` ones summed over the TP group first). Returns the model and
/// the batch's mean loss, nats/token.
pub fn unit_by_unit<B, M>(
    sync: &mut dyn GradSync<B, M>,
    partial: &PartialGrads,
    mut model: M,
    batch: &Batch,
    weight: f64,
    device: &B::Device,
) -> Result<(M, f64), CommError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + LmUnits<B>,
{
    let (inputs, targets) = batch_tensors::<B>(batch, device);
    let (embedded, context) = model.embed(inputs);
    let mut x = embedded.clone().detach();
    let mut block_inputs = Vec::with_capacity(model.num_blocks());
    let blocks = model.num_blocks();
    // Every acquire of the micro-batch, in order: forward, then backward
    // from the last block.
    let order: Vec<LmUnit> = (0..blocks)
        .chain((0..blocks).rev())
        .map(LmUnit::Block)
        .collect();
    for i in 0..blocks {
        model = sync.acquire(LmUnit::Block(i), model, false)?;
        sync.prefetch(&order[i + 1..])?;
        block_inputs.push(x.clone());
        // Nothing requires a gradient here, so autodiff keeps nothing.
        x = model.clone().no_grad().block(i, x, &context);
        model = sync.release(LmUnit::Block(i), model);
    }
    let last = x.detach().require_grad();
    let loss = model.head_loss(last.clone(), targets);
    let value = loss.clone().into_scalar().elem::<f64>();
    let mut grads = loss.mul_scalar(weight).backward();
    let mut upstream = last
        .grad(&grads)
        .expect("the loss depends on the last hidden states");
    let head = GradientsParams::from_grads(grads, &model);
    for i in (0..blocks).rev() {
        model = sync.acquire(LmUnit::Block(i), model, true)?;
        // Backward's acquire of block i is the (2 blocks - i)th of `order`.
        sync.prefetch(&order[2 * blocks - i..])?;
        let input = block_inputs
            .pop()
            .expect("one saved input per block")
            .require_grad();
        let out = model.block(i, input.clone(), &context);
        grads = (out * Tensor::from_inner(upstream)).sum().backward();
        upstream = input
            .grad(&grads)
            .expect("a block's output depends on its input");
        let grads = partial.sum(&model, GradientsParams::from_grads(grads, &model))?;
        sync.accumulate(&model, grads)?;
        model = sync.release(LmUnit::Block(i), model);
    }
    grads = (embedded * Tensor::from_inner(upstream)).sum().backward();
    // A tied embedding gets gradient from both ends: add them first.
    let mut ends = GradientsAccumulator::<M>::new();
    ends.accumulate(&model, head);
    ends.accumulate(&model, GradientsParams::from_grads(grads, &model));
    sync.accumulate(&model, partial.sum(&model, ends.grads())?)?;
    Ok((model, value))
}
