//! ZeRO-3's micro-batch: forward and backward one FSDP unit at a time.

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};
use ferrotron_engine::data::Batch;
use ferrotron_engine::lm::StagedLm;

use super::Zero;
use crate::comm::CommError;
use crate::trainer::batch_tensors;

/// The root unit (embeddings, final norm, head) is unit 0; block `i` is unit `i + 1`.
const ROOT: usize = 0;

impl<B: AutodiffBackend> Zero<B> {
    /// Stage 3: gathers the root unit for a step (kept until [`Zero::end_step`]).
    pub fn begin_step<M: AutodiffModule<B>>(&self, model: M) -> Result<M, CommError> {
        self.gather(ROOT, model, true)
    }

    /// Stage 3: releases the root unit after a step's micro-batches.
    pub fn end_step<M: AutodiffModule<B>>(&self, model: M) -> M {
        self.release(ROOT, model)
    }

    /// Stage 3: forward and backward of one micro-batch, its gradients
    /// (scaled by `scale`, e.g. `1 / micro-batches`) reduce-scattered into
    /// this rank's accumulated pieces. Returns the model (root gathered,
    /// blocks released) and the micro-batch's mean loss, nats/token.
    ///
    /// Forward runs each block without autodiff between a gather and a
    /// release and keeps only its input; backward gathers each block again
    /// in reverse, recomputes its forward with autodiff and propagates the
    /// incoming gradient `g` through `sum(block(x) * g)`.
    pub fn micro_batch<M>(
        &mut self,
        mut model: M,
        batch: &Batch,
        scale: f64,
    ) -> Result<(M, f64), CommError>
    where
        M: AutodiffModule<B> + StagedLm<B>,
    {
        let (inputs, targets) = batch_tensors::<B>(batch, &self.device);
        let (embedded, context) = model.embed(inputs);
        let mut x = embedded.clone().detach();
        let mut block_inputs = Vec::with_capacity(model.num_blocks());
        for i in 0..model.num_blocks() {
            model = self.gather(i + 1, model, false)?;
            block_inputs.push(x.clone());
            x = model.block(i, x, &context);
            model = self.release(i + 1, model);
        }
        let last = x.detach().require_grad();
        let loss = model.head_loss(last.clone(), targets);
        let loss_value = loss.clone().into_scalar().elem::<f64>();
        let mut grads = loss.mul_scalar(scale).backward();
        let mut upstream = last
            .grad(&grads)
            .expect("the loss depends on the last hidden states");
        let root_head = GradientsParams::from_grads(grads, &model);
        for i in (0..model.num_blocks()).rev() {
            model = self.gather(i + 1, model, true)?;
            let input = block_inputs
                .pop()
                .expect("one saved input per block")
                .require_grad();
            let out = model.block(i, input.clone(), &context);
            grads = (out * Tensor::from_inner(upstream)).sum().backward();
            upstream = input
                .grad(&grads)
                .expect("a block's output depends on its input");
            let block = GradientsParams::from_grads(grads, &model);
            let values = self.grad_values(i + 1, &model, &block);
            self.accumulate_values(i + 1, &values)?;
            model = self.release(i + 1, model);
        }
        grads = (embedded * Tensor::from_inner(upstream)).sum().backward();
        let root_embed = GradientsParams::from_grads(grads, &model);
        // A tied embedding gets gradient from both ends: add them first.
        let mut root = self.grad_values(ROOT, &model, &root_head);
        for (id, g) in self.grad_values(ROOT, &model, &root_embed) {
            match root.get_mut(&id) {
                Some(acc) => acc.iter_mut().zip(&g).for_each(|(a, b)| *a += b),
                None => {
                    root.insert(id, g);
                }
            }
        }
        self.accumulate_values(ROOT, &root)?;
        Ok((model, loss_value))
    }
}
