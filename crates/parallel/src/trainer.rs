//! The training step executor: micro-batches, gradient accumulation,
//! global-norm clipping and the AdamW update.

use burn::module::AutodiffModule;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use ferrotron_engine::data::Batch;
use ferrotron_engine::lm::CausalLm;
use ferrotron_engine::optim::{clip_global_norm, AdamW, AdamWConfig, LrSchedule};
use serde::{Deserialize, Serialize};

use crate::comm::CommError;
use crate::data::DataParallel;

/// How optimizer steps are taken.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepConfig {
    /// AdamW hyper-parameters.
    pub adamw: AdamWConfig,
    /// Learning-rate schedule over optimizer steps.
    pub schedule: LrSchedule,
    /// Clip the global gradient norm to this value (0 disables clipping).
    pub grad_clip: f64,
}

/// What one optimizer step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepOutput {
    /// Mean loss over the step's micro-batches (of every DP rank), nats/token.
    pub loss: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Tokens in the step (all micro-batches; of every DP rank in a data-parallel step).
    pub tokens: usize,
}

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

/// Owns the model and optimizer state of one training run.
pub struct Trainer<B: AutodiffBackend, M: AutodiffModule<B>> {
    model: Option<M>,
    optimizer: AdamW<B::InnerBackend>,
    config: StepConfig,
    steps_done: usize,
    device: B::Device,
}

impl<B, M> Trainer<B, M>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + CausalLm<B>,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    /// A trainer for `model` on `device`, with fresh optimizer state.
    pub fn new(model: M, config: StepConfig, device: B::Device) -> Self {
        Self {
            model: Some(model),
            optimizer: AdamW::new(config.adamw),
            config,
            steps_done: 0,
            device,
        }
    }

    /// The model being trained.
    pub fn model(&self) -> &M {
        self.model
            .as_ref()
            .expect("the model is always present between steps")
    }

    /// Optimizer steps taken.
    pub fn steps_done(&self) -> usize {
        self.steps_done
    }

    /// Bytes of optimizer state (AdamW moments) held.
    pub fn optimizer_state_bytes(&self) -> usize {
        self.optimizer.state_bytes()
    }

    /// One optimizer step over `micro_batches` (gradient accumulation over
    /// all of them; each contributes `1 / micro_batches.len()` of the loss).
    pub fn step(&mut self, micro_batches: &[Batch]) -> StepOutput {
        self.step_inner(micro_batches, None)
            .expect("a one-rank step does not communicate")
    }

    /// One data-parallel optimizer step: `micro_batches` are this rank's
    /// rows of the global batch. Gradients are accumulated locally, then
    /// averaged over the DP ranks once (in buckets), then clipped by their
    /// global norm, so every rank applies the identical update. The loss is
    /// the mean over all ranks and `tokens` counts the whole global batch.
    pub fn step_data_parallel(
        &mut self,
        micro_batches: &[Batch],
        dp: &DataParallel,
    ) -> Result<StepOutput, CommError> {
        self.step_inner(micro_batches, Some(dp))
    }

    fn step_inner(
        &mut self,
        micro_batches: &[Batch],
        dp: Option<&DataParallel>,
    ) -> Result<StepOutput, CommError> {
        let model = self
            .model
            .take()
            .expect("the model is always present between steps");
        let n = micro_batches.len().max(1) as f64;
        let mut accumulator = GradientsAccumulator::<M>::new();
        let mut loss_sum = 0.0;
        let mut tokens = 0;
        for batch in micro_batches {
            let (inputs, targets) = batch_tensors::<B>(batch, &self.device);
            let loss = model.loss(inputs, targets);
            loss_sum += loss.clone().into_scalar().elem::<f64>();
            let grads = GradientsParams::from_grads(loss.div_scalar(n).backward(), &model);
            accumulator.accumulate(&model, grads);
            tokens += batch.batch * batch.seq_len;
        }
        let mut grads = accumulator.grads();
        let mut loss = loss_sum / n;
        if let Some(dp) = dp.filter(|dp| dp.size() > 1) {
            grads = dp.average_gradients(&model, grads)?;
            let mut mean = [loss as f32];
            dp.mean(&mut mean)?;
            loss = mean[0] as f64;
            tokens *= dp.size();
        }
        let grad_norm = if self.config.grad_clip > 0.0 {
            clip_global_norm(&model, &mut grads, self.config.grad_clip)
        } else {
            ferrotron_engine::optim::global_grad_norm(&model, &grads)
        };
        let lr = self.config.schedule.lr(self.steps_done);
        self.model = Some(self.optimizer.step(lr, model, grads));
        self.steps_done += 1;
        Ok(StepOutput {
            loss,
            lr,
            grad_norm,
            tokens,
        })
    }

    /// Mean loss over `batches` without gradients, nats/token.
    pub fn evaluate(&self, batches: &[Batch]) -> f64 {
        let model = self.model().valid();
        let device = &self.device;
        let total: f64 = batches
            .iter()
            .map(|b| {
                let (inputs, targets) = batch_tensors::<B::InnerBackend>(b, device);
                model.loss(inputs, targets).into_scalar().elem::<f64>()
            })
            .sum();
        total / batches.len().max(1) as f64
    }
}
