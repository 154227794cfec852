//! ZeRO: sharding the optimizer state (stage 1), the gradients (stage 2)
//! and the parameters (stage 3, FSDP) over the data-parallel group, as a
//! [`GradSync`] strategy.
//!
//! The parameters are grouped into the units of the one flat layout
//! ([`crate::flat`]): buckets of at most `--bucket-mb` for stages 1 and 2,
//! and for stage 3 the FSDP units of an [`LmUnits`] model (embedding, each
//! block, head). Rank `r` owns chunk `r` of every unit and keeps AdamW's
//! moments for that chunk only.
//!
//! - Stage 1: gradients are averaged by bucketed all-reduce (as plain DP),
//!   each rank updates its chunk, and the updated chunks are all-gathered
//!   unit by unit into every rank's full copy of the model.
//! - Stage 2: after each micro-batch's backward the gradients are
//!   reduce-scattered unit by unit; a rank accumulates only its chunk.
//!   Clipping uses the global norm (an all-reduce of the chunks' squared
//!   sums). The update is stage 1's.
//! - Stage 3: between steps a rank holds only its chunk of the parameters
//!   (the model's tensors are one-element placeholders). A step runs unit
//!   by unit ([`crate::micro_batch::unit_by_unit`]: the trainer
//!   always runs ZeRO-3 with full recomputation): a block is
//!   all-gathered just before it runs and freed after, and gathered again
//!   for its recomputation in backward, after which its gradients are
//!   reduce-scattered; the embedding and head units stay gathered for the
//!   whole step. The chunks come from a built model, which is then
//!   released ([`Zero::new`]), or, for a model built of placeholders,
//!   straight from a [`ParamSource`] that draws any flat range of a
//!   parameter alone ([`Zero::from_source`]), so the rank never holds more.
//!
//! With `--overlap-grad-reduce` (where the DP group is the only group of
//! more than one rank) the reduce-scatters are started on the
//! communication thread ([`CommThread`]) and waited for in the order they
//! started: a unit's when the same unit of the next micro-batch starts its
//! reduce-scatter (so at most one micro-batch of results is held), the
//! rest when the step settles; the next unit's backward (or the next
//! micro-batch) runs meanwhile; stage 3 gathers through the same
//! thread, in order with them, and prefetches: the gathers of the next
//! `--zero3-prefetch N` blocks (default 1; 0 turns prefetch off) are
//! started before the current block computes, forward and backward and
//! across the turn between them, so they are not queued behind the
//! current block's reduce-scatter ([`ahead`]). Gathered parameters are
//! freed after use, so at most `N + 1` blocks are gathered at once, the
//! one computing and `N` in flight, besides the embedding and head: that
//! is prefetch's memory cost. Stage 1 overlaps its all-reduce as DDP
//! does. Stages 1 and 2 all-gather a unit's updated chunks on the thread
//! while the next unit is updated. The values of every collective, and
//! the order in which the results are added, are those of the run
//! without overlap: the results are bit-identical.
//!
//! With the optimizer offloaded (`--offload optimizer`, ZeroOffload's
//! scheme on each rank's shard) AdamW's moments live in host memory and
//! the update runs on the CPU ([`AdamW::update_host`]): stages 1 and 2
//! copy the rank's pieces of the parameters and of their gradients to the
//! host, update them there and all-gather the result as before (the
//! model's whole f32 parameters stay on the device, since every rank
//! computes with them); stage 3 keeps its parameter pieces, the f32 master
//! weights, in host memory too ([`pieces`]), so its device holds no
//! training state between steps beyond the accumulated gradient pieces of
//! a step. The gathers start from host vectors either way. The values are
//! those of the device update (the same f32 operations per element). The
//! update overlaps stages 1 and 2's all-gathers, never the gradient
//! reduction: every piece's update needs the step's global gradient norm
//! (the clipping factor, and whether a non-finite norm skips the step),
//! known only once every unit is reduced.
//!
//! The collectives move host `f32` vectors (the [`Communicator`]
//! contract), or, on device collectives ([`GradSync::sync_on_device`]:
//! NCCL on device buffers), the flat tensors themselves: a unit's joined
//! gradients to the reduce-scatter, a rank's chunk joined from its pieces
//! to the all-gather, and the whole parameters cut out of its result,
//! never leaving the device. With `--reduce-dtype bf16` the gradients of a
//! reduce-scatter (and stage 1's all-reduce) are rounded to bf16 before
//! and after it, as FSDP's `reduce_dtype`; parameters are always gathered
//! in f32 (the compute casts them per forward), and the accumulated pieces
//! stay f32. Burn's backward pass returns all gradients of a graph at
//! once, so under stage 2 a micro-batch's full gradients exist until they
//! are reduce-scattered; under stage 3 only one block's do.
//!
//! [`GradSync`]: crate::grad_sync::GradSync

mod ahead;
mod exchange;
mod gathered;
mod one_param;
mod pieces;
mod source;

pub use self::source::{ParamSource, ToBeLoaded, UnknownParam};

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::marker::PhantomData;
use std::ops::Range;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use burn::module::{AutodiffModule, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor, TensorData};
use ferrotron_engine::lm::{LmUnit, LmUnits};
use ferrotron_engine::metrics::{GradCommTimes, MemoryBytes};
use ferrotron_engine::optim::AdamW;
use ferrotron_engine::params::param_names;
use ferrotron_engine::precision::Precision;
use serde::{Deserialize, Serialize};

use self::ahead::Ahead;
use self::exchange::{flat_unit, flat_unit_tensor, unit_tensors, unit_values};
use self::gathered::{start_gather, wait_unused, Gather, Values};
use self::pieces::Pieces;
use crate::comm::nccl::device::SharedCollectives;
use crate::comm::tensor::host_f32;
use crate::comm::{CommError, CommThread, Communicator, Started};
use crate::ddp::ReplicatedGrads;
use crate::flat::tensors::{Assign, AssignFlat, GradTensors, ParamBytes, PieceTensors, Release};
use crate::flat::{param_infos, unit_params, FlatLayout, ParamInfo, Piece};
use crate::grad_sync::norm::{group_sum, NormShares};
use crate::grad_sync::{GradSync, Synced};

/// Blocks whose gathers ZeRO-3 starts ahead by default
/// (`--zero3-prefetch`): one, as FSDP's `forward_prefetch` and
/// `BackwardPrefetch.BACKWARD_PRE` do.
pub const DEFAULT_ZERO3_PREFETCH: usize = 1;

/// How much of the training state is sharded over the DP ranks (`--zero`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u8", into = "u8")]
pub enum ZeroStage {
    /// Nothing: every rank holds everything (plain data parallelism).
    #[default]
    Off,
    /// Optimizer state.
    One,
    /// Optimizer state and gradients.
    Two,
    /// Optimizer state, gradients and parameters (FSDP).
    Three,
}

impl TryFrom<u8> for ZeroStage {
    type Error = String;

    fn try_from(n: u8) -> Result<Self, String> {
        match n {
            0 => Ok(Self::Off),
            1 => Ok(Self::One),
            2 => Ok(Self::Two),
            3 => Ok(Self::Three),
            _ => Err(format!("ZeRO stage {n} does not exist; use 0, 1, 2 or 3")),
        }
    }
}

impl From<ZeroStage> for u8 {
    fn from(s: ZeroStage) -> u8 {
        s as u8
    }
}

impl FromStr for ZeroStage {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let n: u8 = s
            .parse()
            .map_err(|_| format!("'{s}' is not a ZeRO stage; use 0, 1, 2 or 3"))?;
        Self::try_from(n)
    }
}

impl fmt::Display for ZeroStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", u8::from(*self))
    }
}

/// A ZeRO-3 state that cannot be drawn from its [`ParamSource`].
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The source does not know a parameter of the model.
    #[error(transparent)]
    Unknown(#[from] UnknownParam),
    /// The communication thread could not start.
    #[error(transparent)]
    Comm(#[from] CommError),
}

/// This rank's shards and the ZeRO collectives of one training run of a
/// model of type `M`.
pub struct Zero<B: AutodiffBackend, M> {
    stage: ZeroStage,
    layout: FlatLayout,
    /// Blocks of the model (stage 3's units are [`LmUnit::all`]).
    blocks: usize,
    /// This rank's pieces of each unit.
    pieces: Vec<Vec<Piece>>,
    /// The parameters of each unit.
    unit_ids: Vec<HashSet<ParamId>>,
    comm: Arc<dyn Communicator>,
    /// Runs `comm`'s collectives of the step, in order.
    thread: CommThread,
    /// Whether the step's collectives overlap its compute.
    overlap: bool,
    /// Stages 2 and 3: reduce-scatters started and not yet added, by unit,
    /// in the order they started.
    in_flight: VecDeque<(usize, Started<Tensor<B::InnerBackend, 1>>)>,
    /// The collectives stages 2 and 3's reduce-scatters and every stage's
    /// parameter all-gathers run on when not on `comm`'s host path
    /// ([`GradSync::sync_on_device`]).
    on_device: Option<SharedCollectives<B::InnerBackend>>,
    /// Stage 3, with overlap: the gathers started for the units acquired
    /// next, in order ([`DEFAULT_ZERO3_PREFETCH`] of them unless
    /// [`Zero::set_prefetch`] says otherwise).
    prefetched: Mutex<Ahead<Gather<B::InnerBackend>>>,
    device: B::Device,
    /// Stage 1: the step's whole gradients.
    replicated: ReplicatedGrads<B>,
    /// Stages 2 and 3: bytes of gradient pieces held when the step was reduced.
    reduced_bytes: usize,
    /// Stage 3: this rank's pieces of the parameters (between steps, the
    /// only copy of the weights on this rank), on the device or offloaded.
    params: Pieces<B::InnerBackend>,
    /// AdamW's state (and stage 3's parameter pieces) in host memory,
    /// updated on the CPU (`--offload optimizer`).
    offload: bool,
    /// Stages 2 and 3: this rank's pieces of the gradients being accumulated.
    grads: HashMap<ParamId, Tensor<B::InnerBackend, 1>>,
    /// The precision gradients are reduced in (the accumulation is f32).
    reduce: Precision,
    model: PhantomData<M>,
}

impl<B: AutodiffBackend, M: AutodiffModule<B> + LmUnits<B>> Zero<B, M> {
    /// Shards `model` for `stage` (not [`ZeroStage::Off`]) over the ranks of
    /// `comm`. Stages 1 and 2 use buckets of at most `bucket_elems` values;
    /// stage 3 uses the model's units, keeps this rank's chunk of every
    /// parameter and returns the model with placeholders in their place.
    /// Gradients are reduced in precision `reduce`; the step's collectives
    /// overlap its compute if `overlap`.
    ///
    /// # Errors
    /// The communication thread could not start.
    pub fn new(
        stage: ZeroStage,
        model: M,
        comm: Arc<dyn Communicator>,
        bucket_elems: usize,
        device: B::Device,
        reduce: Precision,
        overlap: bool,
    ) -> Result<(Self, M), CommError> {
        assert!(stage != ZeroStage::Off, "ZeRO stage 0 shards nothing");
        let groups = match stage {
            ZeroStage::Three => unit_params(&model),
            _ => FlatLayout::buckets(param_infos(&model), bucket_elems),
        };
        let mut zero = Self::on_layout(stage, groups, &model, comm, device, reduce, overlap)?;
        let model = if stage == ZeroStage::Three {
            zero.shard_parameters(model)
        } else {
            model
        };
        Ok((zero, model))
    }

    /// Stage 3 over the ranks of `comm` for `model`, whose tensors are
    /// placeholders: the units' layout comes from `source`'s shapes, and
    /// this rank's chunk of every parameter is drawn from `source` piece
    /// by piece, so the rank never holds more than its chunks (the same
    /// values [`Zero::new`] keeps of the model `source` describes).
    /// Returns `model` unchanged. `reduce` and `overlap` as for
    /// [`Zero::new`].
    ///
    /// # Errors
    /// A parameter of `model` that `source` does not know; the
    /// communication thread could not start.
    pub fn from_source(
        model: M,
        source: &dyn ParamSource,
        comm: Arc<dyn Communicator>,
        device: B::Device,
        reduce: Precision,
        overlap: bool,
    ) -> Result<(Self, M), SourceError> {
        let names: HashMap<ParamId, String> = param_names(&model).into_iter().collect();
        let groups = unit_params(&model)
            .into_iter()
            .map(|unit| {
                unit.into_iter()
                    .map(|(id, _, decay)| {
                        let name = &names[&id];
                        let shape = source
                            .shape(name)
                            .ok_or_else(|| UnknownParam(name.clone()))?;
                        Ok((id, shape, decay))
                    })
                    .collect::<Result<Vec<_>, UnknownParam>>()
            })
            .collect::<Result<Vec<_>, UnknownParam>>()?;
        let mut zero = Self::on_layout(
            ZeroStage::Three,
            groups,
            &model,
            comm,
            device,
            reduce,
            overlap,
        )?;
        for pieces in &zero.pieces {
            for p in pieces {
                let values = source.values(&names[&p.id], p.start..p.end);
                zero.params.insert(p.id, values, &zero.device);
            }
        }
        Ok((zero, model))
    }

    /// `stage` on the units `groups` of `model`, holding nothing yet.
    fn on_layout(
        stage: ZeroStage,
        groups: Vec<Vec<ParamInfo>>,
        model: &M,
        comm: Arc<dyn Communicator>,
        device: B::Device,
        reduce: Precision,
        overlap: bool,
    ) -> Result<Self, CommError> {
        let layout = FlatLayout::new(groups, comm.rank(), comm.world_size());
        let pieces = (0..layout.units().len())
            .map(|u| layout.pieces(u))
            .collect();
        let unit_ids = layout
            .units()
            .iter()
            .map(|u| u.slots.iter().map(|s| s.id).collect())
            .collect();
        Ok(Self {
            stage,
            replicated: ReplicatedGrads::new(layout.clone(), reduce, overlap),
            layout,
            blocks: model.num_blocks(),
            pieces,
            unit_ids,
            thread: CommThread::new(comm.clone())?,
            comm,
            overlap,
            in_flight: VecDeque::new(),
            on_device: None,
            prefetched: Mutex::new(Ahead::new(DEFAULT_ZERO3_PREFETCH)),
            device,
            reduced_bytes: 0,
            params: Pieces::Device(HashMap::new()),
            offload: false,
            grads: HashMap::new(),
            reduce,
            model: PhantomData,
        })
    }

    /// The stage.
    pub fn stage(&self) -> ZeroStage {
        self.stage
    }

    /// The units and this rank's chunks.
    pub fn layout(&self) -> &FlatLayout {
        &self.layout
    }

    /// Stage 3 with overlap: the gathers of the next `units` blocks start
    /// while the current one computes (0: each block is gathered when it
    /// is acquired). At most `units + 1` blocks are gathered at once. Has
    /// no effect on the other stages, or without overlap.
    pub fn set_prefetch(&mut self, units: usize) {
        self.prefetched
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .set_depth(units);
    }

    /// Offloads the optimizer (`on`): AdamW's moments live in host memory
    /// and the update runs on the CPU, and stage 3's parameter pieces move
    /// to host memory now. Call before the first step; it cannot be
    /// undone (`false` changes nothing).
    pub fn set_offload(&mut self, on: bool) {
        if on {
            self.offload = true;
            self.params.offload();
        }
    }

    /// Whether the optimizer is offloaded ([`Zero::set_offload`]).
    pub fn offloaded(&self) -> bool {
        self.offload
    }

    /// Keeps this rank's pieces of every parameter and releases the rest.
    fn shard_parameters(&mut self, mut model: M) -> M {
        for u in 0..self.pieces.len() {
            for (id, t) in self.piece_tensors(u, &model, None) {
                self.params.insert_tensor(id, t);
            }
            model = self.release_unit(u, model);
        }
        model
    }

    /// This rank's pieces of unit `u`'s parameters, or with `grads` of
    /// their gradients, sliced on the device.
    fn piece_tensors(
        &self,
        u: usize,
        model: &M,
        grads: Option<&GradientsParams>,
    ) -> HashMap<ParamId, Tensor<B::InnerBackend, 1>> {
        let mut v = PieceTensors::<B> {
            pieces: self.pieces[u].iter().map(|p| (p.id, p)).collect(),
            grads,
            out: HashMap::new(),
        };
        model.visit(&mut v);
        v.out
    }

    fn tensor(&self, values: Vec<f32>) -> Tensor<B::InnerBackend, 1> {
        let n = values.len();
        Tensor::from_data(TensorData::new(values, [n]), &self.device)
    }

    /// Starts all-gathering unit `u` from this rank's pieces `values`, on
    /// the device collectives if the sync runs there, else on the host path.
    fn start_unit_gather(
        &self,
        u: usize,
        values: HashMap<ParamId, Values<B::InnerBackend>>,
    ) -> Gather<B::InnerBackend> {
        start_gather(
            &self.thread,
            self.on_device.as_ref(),
            &self.layout.units()[u],
            &self.pieces[u],
            values,
            &self.device,
        )
    }

    /// Waits for unit `u`'s `gather` and puts the unit's whole parameters
    /// into `model` (from host values, or from the gathered device tensor
    /// without leaving the device).
    fn assign_unit(
        &self,
        u: usize,
        gather: Gather<B::InnerBackend>,
        model: M,
        require_grad: bool,
    ) -> Result<M, CommError> {
        let unit = &self.layout.units()[u];
        Ok(match gather {
            Started::Host(pending) => {
                self.assign(unit_values(unit, &pending.wait()?), model, require_grad)
            }
            Started::Own(pending) => {
                let values = unit_tensors(unit, pending.wait()?)
                    .into_iter()
                    .map(|(id, (t, shape))| (id, (Tensor::<B, 1>::from_inner(t), shape)))
                    .collect();
                model.map(&mut AssignFlat {
                    values,
                    require_grad,
                })
            }
        })
    }

    /// Replaces the parameters of unit `u` in `model` by placeholders.
    fn release_unit(&self, u: usize, model: M) -> M {
        model.map(&mut Release::<B> {
            ids: &self.unit_ids[u],
            device: self.device.clone(),
        })
    }

    fn assign(&self, values: HashMap<ParamId, TensorData>, model: M, require_grad: bool) -> M {
        model.map(&mut Assign::<B> {
            values,
            device: self.device.clone(),
            require_grad,
        })
    }

    /// Stage 3: starts all-gathering the parameters of unit `u` from this
    /// rank's pieces, on the communication thread.
    fn start_gather(&self, u: usize) -> Gather<B::InnerBackend> {
        let values = self.pieces[u]
            .iter()
            .map(|p| (p.id, self.params.get(p.id)))
            .collect();
        self.start_unit_gather(u, values)
    }

    /// Stage 3: all-gathers the parameters of unit `u` into `model` (the
    /// gather prefetched for `u`, if any).
    fn gather(&self, u: usize, model: M, require_grad: bool) -> Result<M, CommError> {
        let prefetched = self
            .prefetched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(u);
        let gather = prefetched.unwrap_or_else(|| self.start_gather(u));
        self.assign_unit(u, gather, model, require_grad)
    }

    /// Stage 3: `model` with every parameter gathered (a collective: every
    /// rank must call it). Used for evaluation and checkpoints.
    fn gather_all(&self, mut model: M) -> Result<M, CommError> {
        for u in 0..self.pieces.len() {
            model = self.gather(u, model, true)?;
        }
        Ok(model)
    }

    /// Starts reduce-scattering unit `u`'s flat gradient tensors `grads`
    /// (already rounded to the reduction precision) on the DP group's host
    /// path or on the device collectives ([`GradSync::sync_on_device`]),
    /// after waiting for the previous micro-batch's of the same unit;
    /// without overlap, waits for it and adds it at once.
    fn start_reduce_scatter(
        &mut self,
        u: usize,
        grads: HashMap<ParamId, Tensor<B::InnerBackend, 1>>,
    ) -> Result<(), CommError> {
        // The previous micro-batch's collective of this unit, and those
        // started before it, are waited for and added first: at most one
        // micro-batch of results is held (each overlapped the next
        // micro-batch's forward and backward until this unit's turn).
        if let Some(at) = self.in_flight.iter().position(|(v, _)| *v == u) {
            self.finish_reduce_scatters(at + 1)?;
        }
        let (dp, reduce) = (self.layout.dp(), self.reduce);
        let unit = &self.layout.units()[u];
        let pending = match self.on_device.clone() {
            Some(device) => {
                let flat = flat_unit_tensor(unit, dp, &grads, &self.device);
                Started::Own(
                    self.thread
                        .start_own(move || device.reduce_scatter_sum(flat, reduce)),
                )
            }
            None => {
                let values = grads.into_iter().map(|(id, g)| (id, host_f32(g))).collect();
                Started::Host(
                    self.thread
                        .start_reduce_scatter_sum(flat_unit(unit, dp, &values)),
                )
            }
        };
        self.in_flight.push_back((u, pending));
        if !self.overlap {
            self.finish_reduce_scatters(usize::MAX)?;
        }
        Ok(())
    }

    /// Waits for the first `count` reduce-scatters in flight (all of them
    /// with `usize::MAX`), in the order they started, and adds each chunk
    /// (averaged over the ranks and, over more than one, rounded to the
    /// reduction precision) to the accumulated gradient pieces.
    fn finish_reduce_scatters(&mut self, count: usize) -> Result<(), CommError> {
        let dp = self.layout.dp();
        for _ in 0..count {
            let Some((u, pending)) = self.in_flight.pop_front() else {
                break;
            };
            let sum = match pending {
                Started::Host(pending) => self.tensor(pending.wait()?),
                Started::Own(pending) => pending.wait()?,
            };
            let chunk = if dp > 1 {
                self.reduce.round_tensor(sum.div_scalar(dp as f64))
            } else {
                sum
            };
            for p in &self.pieces[u] {
                let g = chunk
                    .clone()
                    .slice(p.chunk_offset..p.chunk_offset + p.len());
                let sum = match self.grads.remove(&p.id) {
                    Some(acc) => acc + g,
                    None => g,
                };
                self.grads.insert(p.id, sum);
            }
        }
        Ok(())
    }

    /// Stages 2 and 3: reduce-scatters one micro-batch's gradients, unit
    /// by unit (the units `grads` has gradients of; the same on every rank),
    /// each rounded to the reduction precision on the device first (over
    /// more than one rank), as DDP's buckets are.
    fn reduce_scatter(&mut self, model: &M, grads: &GradientsParams) -> Result<(), CommError> {
        let dp = self.layout.dp();
        for u in 0..self.pieces.len() {
            let mut tensors = GradTensors::<B> {
                grads,
                want: &self.unit_ids[u],
                out: HashMap::new(),
            };
            model.visit(&mut tensors);
            if tensors.out.is_empty() {
                continue;
            }
            let rounded = tensors
                .out
                .into_iter()
                .map(|(id, g)| {
                    (
                        id,
                        if dp > 1 {
                            self.reduce.round_tensor(g)
                        } else {
                            g
                        },
                    )
                })
                .collect();
            self.start_reduce_scatter(u, rounded)?;
        }
        Ok(())
    }

    /// Stages 2 and 3: the sum of squares of the accumulated gradients
    /// (every rank's pieces together), each parameter weighted by `shares`.
    fn piece_squares(&self, shares: &NormShares) -> Result<f64, CommError> {
        let local: f64 = self
            .grads
            .iter()
            .map(|(id, g)| {
                let squares = g.clone().powf_scalar(2.0).sum().into_scalar().elem::<f64>();
                squares * shares.get(id).copied().unwrap_or(1.0)
            })
            .sum();
        group_sum(local, &*self.comm)
    }

    /// Bytes of the accumulated gradient pieces held (stages 2 and 3).
    fn piece_grad_bytes(&self) -> usize {
        self.grads
            .values()
            .map(|g| g.shape().num_elements() * 4)
            .sum()
    }

    /// Stages 1 and 2: one AdamW step of this rank's pieces, then the
    /// updated pieces all-gathered into `model`, unit by unit. Stage 1
    /// takes the pieces' gradients from `grads` (averaged, clipped);
    /// stage 2 uses the accumulated pieces (and `grads` is `None`). With
    /// overlap a unit's all-gather runs on the communication thread while
    /// the next unit is updated (the same values, gathered in the same
    /// order); without, each is waited for at once.
    fn update_replicated(
        &mut self,
        mut model: M,
        grads: Option<&GradientsParams>,
        lr: f64,
        optimizer: &mut AdamW<B::InnerBackend>,
    ) -> Result<M, CommError> {
        optimizer.begin_step();
        let mut gathering: Option<(usize, Gather<B::InnerBackend>)> = None;
        for u in 0..self.pieces.len() {
            let updated = self.updated_pieces(u, &model, grads, lr, optimizer);
            let started = self.start_unit_gather(u, updated);
            if !self.overlap {
                model = self.assign_unit(u, started, model, true)?;
                continue;
            }
            if let Some((done, gather)) = gathering.replace((u, started)) {
                model = self.assign_unit(done, gather, model, true)?;
            }
        }
        if let Some((done, gather)) = gathering {
            model = self.assign_unit(done, gather, model, true)?;
        }
        Ok(model)
    }

    /// Stages 1 and 2: this rank's pieces of unit `u` after one AdamW step
    /// (on the host when offloaded), with their gradients from `grads`
    /// (stage 1) or the accumulated pieces (stage 2).
    fn updated_pieces(
        &mut self,
        u: usize,
        model: &M,
        grads: Option<&GradientsParams>,
        lr: f64,
        optimizer: &mut AdamW<B::InnerBackend>,
    ) -> HashMap<ParamId, Values<B::InnerBackend>> {
        let mut params = self.piece_tensors(u, model, None);
        let mut piece_grads = grads.map(|grads| self.piece_tensors(u, model, Some(grads)));
        let mut updated = HashMap::new();
        for p in &self.pieces[u] {
            let param = params.remove(&p.id).expect("every piece has its parameter");
            let grad = match piece_grads.as_mut() {
                Some(g) => g.remove(&p.id),
                None => self.grads.remove(&p.id),
            };
            let new = match grad {
                Some(g) if self.offload => {
                    let mut values = host_f32(param);
                    optimizer.update_host(p.id, lr, &mut values, &host_f32(g), p.decay);
                    Values::Host(values)
                }
                Some(g) => Values::Device(optimizer.update_flat(p.id, lr, param, g, p.decay)),
                None => Values::Device(param),
            };
            updated.insert(p.id, new);
        }
        updated
    }

    /// Stage 3: one AdamW step of this rank's parameter pieces with the
    /// accumulated gradient pieces, where the pieces live (nothing is
    /// communicated).
    fn update_sharded(&mut self, lr: f64, optimizer: &mut AdamW<B::InnerBackend>) {
        optimizer.begin_step();
        for pieces in &self.pieces {
            for p in pieces {
                let Some(g) = self.grads.remove(&p.id) else {
                    continue;
                };
                self.params.update(p.id, lr, g, p.decay, optimizer);
            }
        }
    }
}

impl<B: AutodiffBackend, M: AutodiffModule<B> + LmUnits<B>> GradSync<B, M> for Zero<B, M> {
    fn acquire(&self, unit: LmUnit, model: M, require_grad: bool) -> Result<M, CommError> {
        match self.stage {
            ZeroStage::Three => self.gather(unit.index(self.blocks), model, require_grad),
            _ => Ok(model),
        }
    }

    fn release(&self, unit: LmUnit, model: M) -> M {
        match self.stage {
            ZeroStage::Three => self.release_unit(unit.index(self.blocks), model),
            _ => model,
        }
    }

    fn prefetch(&self, next: &[LmUnit]) -> Result<(), CommError> {
        if self.stage != ZeroStage::Three || !self.overlap {
            return Ok(());
        }
        let next: Vec<usize> = next.iter().map(|u| u.index(self.blocks)).collect();
        self.prefetched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .fill(&next, |u| self.start_gather(u));
        Ok(())
    }

    fn last_micro_batch(&mut self) {
        self.replicated.last_micro_batch();
    }

    fn accumulate(&mut self, model: &M, grads: GradientsParams) -> Result<(), CommError> {
        match self.stage {
            ZeroStage::One => {
                self.replicated.add(model, grads, &self.thread);
                Ok(())
            }
            _ => self.reduce_scatter(model, &grads),
        }
    }

    fn settle(&mut self) -> Result<(), CommError> {
        // Gathers started and never acquired are waited for (every rank
        // started them) and dropped.
        let unused: Vec<_> = self
            .prefetched
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        for gather in unused {
            wait_unused(gather)?;
        }
        match self.stage {
            ZeroStage::One => self.replicated.settle(&self.thread),
            _ => self.finish_reduce_scatters(usize::MAX),
        }
    }

    fn comm_times(&mut self) -> GradCommTimes {
        self.thread.take_times()
    }

    fn reduce(&mut self, model: &M, shares: &NormShares) -> Result<f64, CommError> {
        match self.stage {
            ZeroStage::One => self.replicated.reduce(model, &self.thread, shares),
            _ => {
                self.finish_reduce_scatters(usize::MAX)?;
                self.reduced_bytes = self.piece_grad_bytes();
                self.piece_squares(shares)
            }
        }
    }

    fn apply(
        &mut self,
        model: M,
        lr: f64,
        scale: Option<f64>,
        optimizer: &mut AdamW<B::InnerBackend>,
    ) -> Result<Synced<M>, CommError> {
        if self.stage == ZeroStage::One {
            let (grads, grad_bytes) = self.replicated.take(&model, scale);
            let model = self.update_replicated(model, Some(&grads), lr, optimizer)?;
            return Ok(Synced { model, grad_bytes });
        }
        if let Some(factor) = scale {
            for g in self.grads.values_mut() {
                *g = g.clone().mul_scalar(factor);
            }
        }
        let model = if self.stage == ZeroStage::Two {
            self.update_replicated(model, None, lr, optimizer)?
        } else {
            self.update_sharded(lr, optimizer);
            model
        };
        Ok(Synced {
            model,
            grad_bytes: self.reduced_bytes,
        })
    }

    fn discard(&mut self) {
        self.replicated.discard();
        self.grads.clear();
    }

    fn owned_ranges(&self) -> Option<HashMap<ParamId, Range<usize>>> {
        Some(
            self.pieces
                .iter()
                .flatten()
                .map(|p| (p.id, p.start..p.end))
                .collect(),
        )
    }

    fn holds_param_pieces(&self) -> bool {
        self.stage == ZeroStage::Three
    }

    fn param_piece(&self, id: ParamId) -> Option<Vec<f32>> {
        (self.stage == ZeroStage::Three).then(|| self.params.values(id))
    }

    fn set_param_piece(&mut self, id: ParamId, values: Vec<f32>) {
        assert!(self.stage == ZeroStage::Three, "only ZeRO-3 holds pieces");
        self.params.insert(id, values, &self.device);
    }

    fn whole_param(&self, id: ParamId) -> Result<Option<Vec<f32>>, CommError> {
        match self.stage {
            ZeroStage::Three => self.gather_param(id).map(Some),
            _ => Ok(None),
        }
    }

    fn whole_model(&self, model: M) -> Result<M, CommError> {
        match self.stage {
            ZeroStage::Three => self.gather_all(model),
            _ => Ok(model),
        }
    }

    /// The model's tensors (stage 3: placeholders) plus the parameter
    /// pieces on the device (stage 3, unless offloaded).
    fn param_bytes(&self, model: &M) -> usize {
        let mut v = ParamBytes(0);
        model.visit(&mut v);
        v.0 + self.params.device_bytes()
    }

    fn sync_on_device(&mut self, device: SharedCollectives<B::InnerBackend>) -> bool {
        assert_eq!(
            device.world_size(),
            self.layout.dp(),
            "device collectives over another group than the DP group"
        );
        if self.stage == ZeroStage::One {
            self.replicated.reduce_on(device.clone());
        }
        self.on_device = Some(device);
        true
    }

    fn planned_memory(&self, model: &M) -> MemoryBytes {
        let shard = 4 * self.layout.shard_elems();
        let total = 4 * self.layout.total_elems();
        MemoryBytes {
            param_bytes: if self.stage == ZeroStage::Three {
                GradSync::<B, M>::param_bytes(self, model)
            } else {
                total
            },
            grad_bytes: if self.stage >= ZeroStage::Two {
                shard
            } else {
                total
            },
            optimizer_bytes: if self.offload { 0 } else { 2 * shard },
        }
    }
}
