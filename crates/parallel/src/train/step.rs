//! The training step executor: micro-batches, gradient accumulation,
//! data parallelism and ZeRO, global-norm clipping and the AdamW update.

use burn::module::AutodiffModule;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use ferrotron_engine::data::Batch;
use ferrotron_engine::lm::{CausalLm, StagedLm};
use ferrotron_engine::metrics::MemoryBytes;
use ferrotron_engine::optim::{
    clip_factor, clip_global_norm, global_grad_norm, AdamW, AdamWConfig, LrSchedule,
};
use serde::{Deserialize, Serialize};

use crate::comm::CommError;
use crate::data::DataParallel;
use crate::zero::tensors::{GradBytes, ParamBytes};
use crate::zero::{Zero, ZeroStage};

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

/// Owns the model and optimizer state of one training run (of this rank).
pub struct Trainer<B: AutodiffBackend, M: AutodiffModule<B>> {
    model: Option<M>,
    optimizer: AdamW<B::InnerBackend>,
    config: StepConfig,
    steps_done: usize,
    device: B::Device,
    dp: Option<DataParallel>,
    zero: Option<Zero<B>>,
    memory: MemoryBytes,
}

impl<B, M> Trainer<B, M>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + StagedLm<B>,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    /// A one-rank trainer for `model` on `device`, with fresh optimizer state.
    pub fn new(model: M, config: StepConfig, device: B::Device) -> Self {
        Self {
            model: Some(model),
            optimizer: AdamW::new(config.adamw),
            config,
            steps_done: 0,
            device,
            dp: None,
            zero: None,
            memory: MemoryBytes::default(),
        }
    }

    /// A data-parallel trainer: this rank's replica (or, under ZeRO-3,
    /// shard) of `model`, trained on the ranks of `dp` with `zero`'s
    /// sharding. Every rank must build `model` identically (same seed or
    /// same checkpoint).
    pub fn data_parallel(
        model: M,
        config: StepConfig,
        device: B::Device,
        dp: DataParallel,
        zero: ZeroStage,
    ) -> Self {
        let (zero, model) = match zero {
            ZeroStage::Off => (None, model),
            stage => {
                let (z, m) = Zero::new(
                    stage,
                    model,
                    dp.communicator(),
                    dp.bucket_elems(),
                    device.clone(),
                );
                (Some(z), m)
            }
        };
        let mut trainer = Self::new(model, config, device);
        trainer.dp = Some(dp);
        trainer.zero = zero;
        trainer
    }

    /// The ZeRO stage in use.
    pub fn zero_stage(&self) -> ZeroStage {
        self.zero.as_ref().map_or(ZeroStage::Off, Zero::stage)
    }

    /// Optimizer steps taken.
    pub fn steps_done(&self) -> usize {
        self.steps_done
    }

    /// Training state this rank held at the last optimizer step, measured
    /// on the tensors themselves (all zero before the first step).
    pub fn memory(&self) -> MemoryBytes {
        self.memory
    }

    /// Training state this rank will hold once training runs, from the
    /// parameter layout: what [`Trainer::memory`] reports after a step,
    /// up to the padding of the last chunk of each unit (f32 state).
    pub fn planned_memory(&self) -> MemoryBytes {
        let model = self.held_model();
        let Some(z) = &self.zero else {
            let mut p = ParamBytes(0);
            model.visit(&mut p);
            return MemoryBytes {
                param_bytes: p.0,
                grad_bytes: p.0,
                optimizer_bytes: 2 * p.0,
            };
        };
        let shard = 4 * z.layout().shard_elems();
        let total = 4 * z.layout().total_elems();
        MemoryBytes {
            param_bytes: if z.stage() == ZeroStage::Three {
                z.param_bytes(model)
            } else {
                total
            },
            grad_bytes: if z.stage() >= ZeroStage::Two {
                shard
            } else {
                total
            },
            optimizer_bytes: 2 * shard,
        }
    }

    fn held_model(&self) -> &M {
        self.model
            .as_ref()
            .expect("the model is always present between steps")
    }

    /// The whole model. Under ZeRO-3 its parameters are all-gathered from
    /// every rank, so every rank must call this at the same point.
    pub fn full_model(&self) -> Result<M, CommError> {
        let model = self.held_model().clone();
        match &self.zero {
            Some(z) if z.stage() == ZeroStage::Three => z.gather_all(model),
            _ => Ok(model),
        }
    }

    /// One optimizer step over `micro_batches`, this rank's rows of the
    /// global batch (gradient accumulation over all of them; each
    /// contributes `1 / micro_batches.len()` of the loss). With data
    /// parallelism gradients are averaged over the DP ranks once per step
    /// (stages 0 and 1: bucketed all-reduce; stages 2 and 3: reduce-scatter
    /// per micro-batch), then clipped by their global norm, so every rank
    /// applies the identical update. The loss is the mean over all ranks
    /// and `tokens` counts the whole global batch.
    pub fn step(&mut self, micro_batches: &[Batch]) -> Result<StepOutput, CommError> {
        let mut model = self
            .model
            .take()
            .expect("the model is always present between steps");
        let n = micro_batches.len().max(1) as f64;
        let stage = self.zero_stage();
        let mut loss_sum = 0.0;
        let mut accumulator = GradientsAccumulator::<M>::new();
        if stage == ZeroStage::Three {
            let zero = self.zero.as_mut().expect("stage 3 has shards");
            model = zero.begin_step(model)?;
            for batch in micro_batches {
                let (m, loss) = zero.micro_batch(model, batch, 1.0 / n)?;
                model = m;
                loss_sum += loss;
            }
        } else {
            for batch in micro_batches {
                let (inputs, targets) = batch_tensors::<B>(batch, &self.device);
                let loss = model.loss(inputs, targets);
                loss_sum += loss.clone().into_scalar().elem::<f64>();
                let grads = GradientsParams::from_grads(loss.div_scalar(n).backward(), &model);
                match self.zero.as_mut() {
                    Some(zero) if stage == ZeroStage::Two => zero.accumulate(&model, grads)?,
                    _ => accumulator.accumulate(&model, grads),
                }
            }
        }
        let mut tokens: usize = micro_batches.iter().map(|b| b.batch * b.seq_len).sum();
        let mut loss = loss_sum / n;
        if let Some(dp) = self.dp.as_ref().filter(|dp| dp.size() > 1) {
            let mut mean = [loss as f32];
            dp.mean(&mut mean)?;
            loss = mean[0] as f64;
            tokens *= dp.size();
        }
        let lr = self.config.schedule.lr(self.steps_done);
        let clip = self.config.grad_clip;
        let grad_norm;
        match self.zero.as_mut() {
            Some(zero) if stage >= ZeroStage::Two => {
                self.memory.grad_bytes = zero.grad_bytes();
                grad_norm = zero.grad_norm()?;
                if let Some(factor) = clip_factor(grad_norm, clip).filter(|_| clip > 0.0) {
                    zero.scale_grads(factor);
                }
                model = if stage == ZeroStage::Two {
                    zero.update_replicated(model, None, lr, &mut self.optimizer)?
                } else {
                    zero.update_sharded(lr, &mut self.optimizer);
                    zero.end_step(model)
                };
            }
            zero => {
                let mut grads = accumulator.grads();
                if let Some(dp) = self.dp.as_ref().filter(|dp| dp.size() > 1) {
                    grads = dp.average_gradients(&model, grads)?;
                }
                let mut bytes = GradBytes {
                    grads: &grads,
                    bytes: 0,
                };
                model.visit(&mut bytes);
                self.memory.grad_bytes = bytes.bytes;
                grad_norm = if clip > 0.0 {
                    clip_global_norm(&model, &mut grads, clip)
                } else {
                    global_grad_norm(&model, &grads)
                };
                model = match zero {
                    Some(zero) => {
                        zero.update_replicated(model, Some(&grads), lr, &mut self.optimizer)?
                    }
                    None => self.optimizer.step(lr, model, grads),
                };
            }
        }
        self.memory.param_bytes = match &self.zero {
            Some(zero) => zero.param_bytes(&model),
            None => {
                let mut p = ParamBytes(0);
                model.visit(&mut p);
                p.0
            }
        };
        self.memory.optimizer_bytes = self.optimizer.state_bytes();
        self.model = Some(model);
        self.steps_done += 1;
        Ok(StepOutput {
            loss,
            lr,
            grad_norm,
            tokens,
        })
    }

    /// Mean loss over `batches` without gradients, nats/token. Under ZeRO-3
    /// the model is gathered first (every rank must call this).
    pub fn evaluate(&self, batches: &[Batch]) -> Result<f64, CommError> {
        let model = self.full_model()?.valid();
        let device = &self.device;
        let total: f64 = batches
            .iter()
            .map(|b| {
                let (inputs, targets) = batch_tensors::<B::InnerBackend>(b, device);
                model.loss(inputs, targets).into_scalar().elem::<f64>()
            })
            .sum();
        Ok(total / batches.len().max(1) as f64)
    }
}
