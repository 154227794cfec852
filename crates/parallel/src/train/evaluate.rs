//! Validation on the model as it trains, without gathering it: the loss
//! of each batch is computed by the same parallel model the step uses.
//!
//! - One stage: the units run in order on every rank, each between an
//!   acquire and a release of the gradient sync (ZeRO-3 gathers one unit
//!   at a time, as its forward does; the other strategies hold every unit),
//!   every batch through a unit before the next unit is acquired. The TP
//!   layers reduce over the TP group inside the forward. The result is the
//!   model's `loss` bit for bit: that loss is the same composition of
//!   embedding, blocks and head.
//! - A pipeline: each batch runs through the stages in turn
//!   ([`Pipeline::eval_loss`](crate::pipeline::Pipeline)); the last stage
//!   broadcasts the loss.
//!
//! Every DP rank evaluates every batch (the DP replicas hold the same
//! model, so they agree without a reduction).

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ElementConversion;
use ferrotron_engine::data::Batch;
use ferrotron_engine::lm::{CausalLm, LmUnit, LmUnits};

use super::step::Trainer;
use crate::comm::CommError;
use crate::micro_batch::batch_tensors;

impl<B, M> Trainer<B, M>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + LmUnits<B> + 'static,
    M::InnerModule: CausalLm<B::InnerBackend> + LmUnits<B::InnerBackend>,
{
    /// Mean loss over `batches` without gradients, nats/token (the mean of
    /// each batch's mean loss), on every rank: a collective over the whole
    /// job (see the module doc).
    pub fn evaluate(&self, batches: &[Batch]) -> Result<f64, CommError> {
        let total = if self.pipeline.stages() > 1 {
            let model = self.held_model().valid();
            let mut sum = 0.0;
            for b in batches {
                sum += self.pipeline.eval_loss(&model, b, &self.device)?;
            }
            sum
        } else {
            self.unit_losses(batches)?.iter().sum()
        };
        Ok(total / batches.len().max(1) as f64)
    }

    /// Each batch's mean loss, nats/token, one unit at a time (one stage).
    fn unit_losses(&self, batches: &[Batch]) -> Result<Vec<f64>, CommError> {
        let mut model = self.held_model().clone();
        let ends = [LmUnit::Embedding, LmUnit::Head];
        for unit in ends {
            model = self.sync.acquire(unit, model, false)?;
        }
        let inner = model.valid();
        let mut states = Vec::with_capacity(batches.len());
        for b in batches {
            let (inputs, targets) = batch_tensors::<B::InnerBackend>(b, &self.device);
            let (x, context) = inner.embed(inputs);
            states.push((x, context, targets));
        }
        for i in 0..inner.num_blocks() {
            model = self.sync.acquire(LmUnit::Block(i), model, false)?;
            let inner = model.valid();
            for (x, context, _) in &mut states {
                *x = inner.block(i, x.clone(), context);
            }
            model = self.sync.release(LmUnit::Block(i), model);
        }
        // The ends stay in this copy of the model, dropped here.
        let inner = model.valid();
        Ok(states
            .into_iter()
            .map(|(x, _, targets)| inner.head_loss(x, targets).into_scalar().elem::<f64>())
            .collect())
    }
}
