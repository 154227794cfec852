//! Runs one stage's [`Action`] list for the micro-batches of a step.
//!
//! A forward keeps its autodiff graph until the micro-batch's backward
//! (the schedule bounds how many are in flight). Its input is the token
//! ids on virtual stage 0, else the received activation as a fresh leaf
//! that requires a gradient; its output is sent on, or is the loss on the
//! last virtual stage. A backward propagates the received gradient `g`
//! through `sum(output * g)` (or the loss times the step's weight: `1 /`
//! micro-batches, times `cp` under context parallelism), sends its input's
//! gradient back and hands the
//! parameters' gradients to the [`GradSync`], as a micro-batch does
//! without a pipeline. The gradients of a tied embedding are kept aside
//! and summed over the first and last stage once, after the schedule.
//!
//! Activations and their gradients travel in the compute dtype: on the
//! PP group's device collectives when the pipeline has them
//! (`Pipeline::on_device`: NCCL's grouped `ncclSend`/`ncclRecv` on the
//! tensors' own buffers, 16-bit values as themselves), else as host `f32`
//! ([`host_f32`]) holding the compute dtype's values (f32 holds 16-bit
//! values exactly). Either way the receiver casts them back to the
//! model's [`LmUnits::hidden_dtype`], so the next stage computes on the
//! very values the sender had.

use std::collections::HashMap;
use std::time::Instant;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, FloatDType, Tensor};
use ferrotron_engine::data::Batch;
use ferrotron_engine::lm::LmUnits;
use ferrotron_engine::precision::Precision;

use super::layout::StageLayout;
use super::placement::Placement;
use super::schedule::{Action, Payload, PipeShape, Transfer};
use crate::comm::nccl::device::wire::carried_in;
use crate::comm::nccl::device::{AnyCollectives, Route};
use crate::comm::tensor::{from_host, host_f32};
use crate::comm::{CommError, Communicator, Incoming, Outgoing};
use crate::grad_sync::GradSync;
use crate::micro_batch::batch_tensors;
use crate::tensor::PartialGrads;

/// What a forward left for its backward.
enum Output<B: AutodiffBackend> {
    /// Hidden states `[batch, seq, hidden]` sent to the next virtual stage.
    Hidden(Tensor<B, 3>),
    /// The micro-batch's mean loss, `[1]` (last virtual stage).
    Loss(Tensor<B, 1>),
}

/// A forward whose backward has not run yet.
struct InFlight<B: AutodiffBackend> {
    /// The received activation as a leaf (none on virtual stage 0).
    input: Option<Tensor<B, 3>>,
    output: Output<B>,
}

/// The key of a transfer's values: payload, micro-batch, chunk of this stage.
type Slot = (Payload, usize, usize);

/// Where one stage's time went in a step, seconds.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StageClock {
    /// In forward and backward actions (with the TP all-reduces inside
    /// the blocks and the hand-off of gradients to the DP strategy).
    pub(crate) compute_s: f64,
    /// In exchanges.
    pub(crate) wait_s: f64,
    /// The whole schedule, from the first action to the loss broadcast.
    pub(crate) total_s: f64,
}

/// One stage's step: the stage's place in the pipeline and its actions.
pub(crate) struct StageStep<'a> {
    /// Blocks of every virtual stage.
    pub(crate) layout: &'a StageLayout,
    /// Stages, micro-batches and chunks of the step.
    pub(crate) shape: PipeShape,
    /// What this stage holds.
    pub(crate) placement: &'a Placement,
    /// The PP group (this stage is its rank).
    pub(crate) pp: &'a dyn Communicator,
    /// Device collectives over the PP group, for the model's inner
    /// backend (none: the group's host path).
    pub(crate) device: &'a AnyCollectives,
    /// This stage's actions for the step.
    pub(crate) actions: &'a [Action],
}

impl StageStep<'_> {
    /// The message tag of a transfer: unique in the step, computed alike
    /// at both ends from the payload, the micro-batch and the receiving
    /// virtual stage.
    fn tag(&self, t: &Transfer) -> i32 {
        let own = self.shape.virtual_stage(self.pp.rank(), t.chunk);
        let receiver = match (t.send, t.payload) {
            (false, _) => own,
            (true, Payload::Activation) => own + 1,
            (true, Payload::Gradient) => own - 1,
        };
        let payload = usize::from(t.payload == Payload::Gradient);
        ((payload * self.shape.micro_batches + t.micro_batch) * self.shape.virtual_stages()
            + receiver) as i32
    }

    /// Runs the actions on `micro_batches` (this DP rank's, the same on
    /// every stage), back-propagating each micro-batch's loss times
    /// `weight`, handing gradients to `sync`. Returns the model, the
    /// sum of the micro-batches' mean losses (every stage gets it from the
    /// last), nats/token, and where this stage's time went.
    pub(crate) fn run<B, M>(
        &self,
        sync: &mut dyn GradSync<B, M>,
        partial: &PartialGrads,
        model: M,
        micro_batches: &[Batch],
        weight: f64,
        device: &B::Device,
    ) -> Result<(M, f64, StageClock), CommError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B> + LmUnits<B>,
    {
        let start = Instant::now();
        let mut clock = StageClock::default();
        let stage = self.pp.rank();
        let first = &micro_batches[0];
        let context = model.block_context(first.seq_len, device);
        let dims = model.hidden_dims(first.batch, first.seq_len);
        let dtype = model.hidden_dtype();
        let tied = self.placement.tied_here();
        let mut tied_sum: HashMap<ParamId, Tensor<B::InnerBackend, 1>> = HashMap::new();
        let mut in_flight: HashMap<(usize, usize), InFlight<B>> = HashMap::new();
        let mut inbox: HashMap<Slot, Tensor<B::InnerBackend, 3>> = HashMap::new();
        let mut outbox: HashMap<Slot, Tensor<B::InnerBackend, 1>> = HashMap::new();
        let mut loss_sum = 0.0;
        for action in self.actions {
            let t = Instant::now();
            match *action {
                Action::Forward { micro_batch, chunk } => {
                    let w = self.shape.virtual_stage(stage, chunk);
                    let batch = &micro_batches[micro_batch];
                    let (mut x, input) = if w == 0 {
                        let (inputs, _) = batch_tensors::<B>(batch, device);
                        (model.embed(inputs).0, None)
                    } else {
                        let received = inbox
                            .remove(&(Payload::Activation, micro_batch, chunk))
                            .expect("the schedule receives a forward's input before it");
                        let leaf = Tensor::<B, 3>::from_inner(received).require_grad();
                        (leaf.clone(), Some(leaf))
                    };
                    for i in self.layout.blocks(w) {
                        x = model.block(i, x, &context);
                    }
                    let output = if self.layout.is_last(w) {
                        let (_, targets) = batch_tensors::<B>(batch, device);
                        let loss = model.head_loss(x, targets);
                        loss_sum += loss.clone().into_scalar().elem::<f64>();
                        Output::Loss(loss)
                    } else {
                        let slot = (Payload::Activation, micro_batch, chunk);
                        outbox.insert(slot, flat(x.clone().inner()));
                        Output::Hidden(x)
                    };
                    in_flight.insert((micro_batch, chunk), InFlight { input, output });
                }
                Action::Backward { micro_batch, chunk } => {
                    let InFlight { input, output } = in_flight
                        .remove(&(micro_batch, chunk))
                        .expect("the schedule runs a backward after its forward");
                    let grads = match output {
                        Output::Loss(loss) => loss.mul_scalar(weight).backward(),
                        Output::Hidden(out) => {
                            let g = inbox
                                .remove(&(Payload::Gradient, micro_batch, chunk))
                                .expect("the schedule receives a backward's gradient before it");
                            (out * Tensor::from_inner(g)).sum().backward()
                        }
                    };
                    if let Some(leaf) = input {
                        let g = leaf
                            .grad(&grads)
                            .expect("a stage's output depends on its input");
                        outbox.insert((Payload::Gradient, micro_batch, chunk), flat(g));
                    }
                    let mut grads =
                        partial.sum(&model, GradientsParams::from_grads(grads, &model))?;
                    let mut take = TakeTied::<B> {
                        ids: &tied,
                        grads: &mut grads,
                        sum: &mut tied_sum,
                    };
                    model.visit(&mut take);
                    sync.accumulate(&model, grads)?;
                }
                Action::Exchange(ref transfers) => {
                    let received = (dims, dtype);
                    self.exchange(transfers, received, &mut outbox, &mut inbox, device)?;
                }
            }
            let spent = t.elapsed().as_secs_f64();
            match action {
                Action::Exchange(_) => clock.wait_s += spent,
                _ => clock.compute_s += spent,
            }
        }
        if !tied.is_empty() {
            let grads = self.summed_tied::<B, M>(&model, tied_sum, device)?;
            sync.accumulate(&model, grads)?;
        }
        let mut loss = [loss_sum as f32];
        self.pp.broadcast(&mut loss, self.pp.world_size() - 1)?;
        clock.total_s = start.elapsed().as_secs_f64();
        Ok((model, f64::from(loss[0]), clock))
    }

    /// Posts `transfers` together: sends from `outbox`, receives into
    /// `inbox` as tensors of shape and dtype `received`; on the device
    /// collectives when there are some, else on the PP group's host path.
    fn exchange<IB: Backend>(
        &self,
        transfers: &[Transfer],
        (dims, dtype): ([usize; 3], FloatDType),
        outbox: &mut HashMap<Slot, Tensor<IB, 1>>,
        inbox: &mut HashMap<Slot, Tensor<IB, 3>>,
        device: &IB::Device,
    ) -> Result<(), CommError> {
        let n: usize = dims.iter().product();
        let mut sends = Vec::new();
        let mut wanted = Vec::new();
        for t in transfers {
            let slot = (t.payload, t.micro_batch, t.chunk);
            let route = Route {
                peer: t.peer,
                tag: self.tag(t),
            };
            if t.send {
                let values = outbox
                    .remove(&slot)
                    .expect("the schedule sends what a compute action produced");
                sends.push((route, values));
            } else {
                wanted.push((slot, route));
            }
        }
        let recvs: Vec<(Route, usize)> = wanted.iter().map(|&(_, route)| (route, n)).collect();
        let received = match self.device.get::<IB>(&"the pipeline") {
            Some(c) => c.exchange(sends, &recvs, carried_in(dtype.into()), device)?,
            None => host_exchange(self.pp, sends, &recvs, device)?,
        };
        for ((slot, _), values) in wanted.into_iter().zip(received) {
            inbox.insert(slot, values.reshape(dims).cast(dtype));
        }
        Ok(())
    }

    /// The tied parameters' gradients summed over the first and last
    /// stage, as f32 gradients of `model`: on the placement's device
    /// collectives when it has them, else on its host path.
    fn summed_tied<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        model: &M,
        sums: HashMap<ParamId, Tensor<B::InnerBackend, 1>>,
        device: &B::Device,
    ) -> Result<GradientsParams, CommError> {
        // Both ends list the tied parameters in the model's visiting order.
        let tied = self.placement.tied_in_order();
        let flat: Vec<Tensor<B::InnerBackend, 1>> = tied
            .iter()
            .map(|(id, n)| match sums.get(id) {
                Some(sum) => sum.clone().cast(FloatDType::F32),
                None => Tensor::zeros([*n], device),
            })
            .collect();
        let flat = Tensor::cat(flat, 0);
        let summed = match self.placement.ends_device::<B::InnerBackend>() {
            Some(c) => c.all_reduce_sum(flat, Precision::Fp32)?,
            None => {
                let mut values = host_f32(flat);
                self.placement.sum_tied(&mut values)?;
                from_host(values, device)
            }
        };
        let mut at = 0;
        let mut values = HashMap::new();
        for (id, n) in tied {
            values.insert(id, summed.clone().slice(at..at + n));
            at += n;
        }
        let mut put = PutTied {
            values,
            grads: GradientsParams::new(),
        };
        model.visit(&mut put);
        Ok(put.grads)
    }
}

/// `x` as a flat tensor `[n]`.
fn flat<IB: Backend, const D: usize>(x: Tensor<IB, D>) -> Tensor<IB, 1> {
    let n = x.shape().num_elements();
    x.reshape([n])
}

/// [`TensorCollectives::exchange`] on `pp`'s host path: the values cross
/// as host `f32`, tags as MPI's; the received tensors `[n]` f32 in
/// `recvs`' order.
fn host_exchange<IB: Backend>(
    pp: &dyn Communicator,
    sends: Vec<(Route, Tensor<IB, 1>)>,
    recvs: &[(Route, usize)],
    device: &IB::Device,
) -> Result<Vec<Tensor<IB, 1>>, CommError> {
    let sent: Vec<(Route, Vec<f32>)> = sends
        .into_iter()
        .map(|(route, t)| (route, host_f32(t)))
        .collect();
    let mut received: Vec<Vec<f32>> = recvs.iter().map(|&(_, n)| vec![0.0; n]).collect();
    let outgoing: Vec<Outgoing<'_>> = sent
        .iter()
        .map(|(route, values)| Outgoing {
            to: route.peer,
            tag: route.tag,
            values,
        })
        .collect();
    let mut incoming: Vec<Incoming<'_>> = recvs
        .iter()
        .zip(received.iter_mut())
        .map(|(&(route, _), values)| Incoming {
            from: route.peer,
            tag: route.tag,
            values,
        })
        .collect();
    pp.exchange(&outgoing, &mut incoming)?;
    Ok(received
        .into_iter()
        .map(|values| from_host(values, device))
        .collect())
}

/// Moves the gradients of the tied parameters out of `grads`, adding them
/// (flat) to `sum`.
struct TakeTied<'a, B: AutodiffBackend> {
    ids: &'a std::collections::HashSet<ParamId>,
    grads: &'a mut GradientsParams,
    sum: &'a mut HashMap<ParamId, Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for TakeTied<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if !self.ids.contains(&param.id) {
            return;
        }
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            let n = g.shape().num_elements();
            let g = g.reshape([n]);
            let total = match self.sum.remove(&param.id) {
                Some(s) => s + g,
                None => g,
            };
            self.sum.insert(param.id, total);
        }
    }
}

/// Registers flat `values` as the gradients of their parameters, in each
/// parameter's shape.
struct PutTied<IB: Backend> {
    values: HashMap<ParamId, Tensor<IB, 1>>,
    grads: GradientsParams,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for PutTied<B::InnerBackend> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(values) = self.values.remove(&param.id) {
            let shape: [usize; D] = param.val().dims();
            self.grads.register(param.id, values.reshape(shape));
        }
    }
}
