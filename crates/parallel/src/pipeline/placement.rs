//! Which parameters a pipeline stage holds, and joining them back into the
//! whole model.
//!
//! A stage keeps the parameters of its units and replaces the others by
//! one-element placeholders (ZeRO-3's, so they hold no memory): a model
//! built whole (loaded weights) is cut here, a freshly initialised one is
//! built with the placeholders already in place. A token
//! embedding tied to the head (GPT-2, BLOOM) is held twice, Megatron's way:
//! stage 0 owns it and the last stage keeps an identical copy; their
//! gradients are summed over the two every step ([`Placement::sum_tied`]),
//! so both copies take the same update and stay equal. The global norm
//! counts the copy once (its share is 0 on the last stage).
//!
//! Joining ([`Placement::join`]) broadcasts every parameter from the stage
//! that owns it over the PP group, so every rank gets the whole model (for
//! validation and exports).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use ferrotron_engine::lm::{LmUnit, LmUnits};

use super::layout::StageLayout;
use crate::comm::nccl::device::{AnyCollectives, OpenCollectives, SharedCollectives};
use crate::comm::tensor::host_f32;
use crate::comm::{CommError, Communicator};
use crate::flat::tensors::{Assign, Release};
use crate::flat::Infos;

/// The parameters of one stage of a pipeline, and its PP group.
pub(crate) struct Placement {
    stage: usize,
    stages: usize,
    /// The stage owning each parameter (a tied embedding: stage 0).
    owner: HashMap<ParamId, usize>,
    /// What this stage holds: its units' parameters, plus the tied copy on
    /// the last stage.
    held: HashSet<ParamId>,
    /// Parameters held by both the first and the last stage.
    tied: HashSet<ParamId>,
    /// Every parameter with its whole shape (this rank's TP block), in the
    /// model's visiting order (the same on every rank).
    order: Vec<(ParamId, Vec<usize>)>,
    pp: Arc<dyn Communicator>,
    /// The first and the last stage (for the tied gradients; every stage
    /// has one, the middle ones a group they never use).
    ends: Arc<dyn Communicator>,
    /// Device collectives over `ends` ([`Placement::ends_on_device`]).
    ends_device: AnyCollectives,
}

/// The ids of the parameters a visit reaches.
fn ids(visit: impl FnOnce(&mut Infos)) -> HashSet<ParamId> {
    let mut infos = Infos(Vec::new());
    visit(&mut infos);
    infos.0.into_iter().map(|(id, _, _)| id).collect()
}

impl Placement {
    /// The placement of `model` (whole, or already this stage's part) on
    /// this rank's stage, the PP group's rank. Collective over `pp` (it
    /// gathers the parameters' shapes and splits off the group of the
    /// first and last stage).
    pub(crate) fn new<B: Backend, M: LmUnits<B>>(
        model: &M,
        layout: &StageLayout,
        pp: Arc<dyn Communicator>,
    ) -> Result<Self, CommError> {
        let (stage, stages) = (pp.rank(), pp.world_size());
        let mut owner = HashMap::new();
        for unit in LmUnit::all(model.num_blocks()) {
            let s = layout.owner(unit);
            for id in ids(|v| model.visit_unit(unit, v)) {
                owner.insert(id, s);
            }
        }
        let tied = ids(|v| model.visit_tied(v));
        let mut held: HashSet<ParamId> = owner
            .iter()
            .filter(|&(_, &s)| s == stage)
            .map(|(&id, _)| id)
            .collect();
        if stage + 1 == stages {
            held.extend(tied.iter().copied());
        }
        let mut infos = Infos(Vec::new());
        model.visit(&mut infos);
        let own = infos
            .0
            .into_iter()
            .map(|(id, shape, _)| (id, shape))
            .collect();
        let order = whole_shapes(own, &*pp)?;
        let end = stage == 0 || stage + 1 == stages;
        let ends = pp.split(usize::from(!end), stage)?;
        Ok(Self {
            stage,
            stages,
            owner,
            held,
            tied,
            order,
            pp,
            ends,
            ends_device: AnyCollectives::none(),
        })
    }

    /// Sums the tied gradients on the device collectives that `open`
    /// creates over the first and last stage (collective over them) from
    /// now on, where this stage is one of them and the model ties
    /// parameters; returns whether it does.
    pub(crate) fn ends_on_device<IB: Backend>(
        &mut self,
        open: &OpenCollectives<'_, IB>,
    ) -> Result<bool, CommError> {
        let end = self.stage == 0 || self.stage + 1 == self.stages;
        if self.tied.is_empty() || !end || self.stages == 1 {
            return Ok(false);
        }
        self.ends_device = AnyCollectives::new::<IB>(open(&*self.ends)?);
        Ok(true)
    }

    /// The device collectives over the first and last stage, if
    /// [`Placement::ends_on_device`] opened them (for tensors of `IB`).
    pub(crate) fn ends_device<IB: Backend>(&self) -> Option<&SharedCollectives<IB>> {
        self.ends_device
            .get::<IB>(&"the first and last pipeline stage")
    }

    /// `model` with the parameters this stage does not hold replaced by
    /// placeholders.
    pub(crate) fn place<B: Backend, M: Module<B>>(&self, model: M, device: &B::Device) -> M {
        let others: HashSet<ParamId> = self
            .order
            .iter()
            .map(|(id, _)| *id)
            .filter(|id| !self.held.contains(id))
            .collect();
        model.map(&mut Release {
            ids: &others,
            device: device.clone(),
        })
    }

    /// Whether this stage holds parameter `id`.
    pub(crate) fn holds(&self, id: ParamId) -> bool {
        self.held.contains(&id)
    }

    /// Whether `id` is the last stage's copy of a tied parameter (its
    /// gradient is the first stage's: it must not count twice in the norm).
    pub(crate) fn is_tied_copy(&self, id: ParamId) -> bool {
        self.stages > 1 && self.stage + 1 == self.stages && self.tied.contains(&id)
    }

    /// The tied parameters this stage holds (first and last stage; none
    /// on one stage, where nothing is copied).
    pub(crate) fn tied_here(&self) -> HashSet<ParamId> {
        let end = self.stage == 0 || self.stage + 1 == self.stages;
        if self.stages > 1 && end {
            self.tied.clone()
        } else {
            HashSet::new()
        }
    }

    /// [`Placement::tied_here`] with their element counts, in the model's
    /// visiting order (the same on every rank).
    pub(crate) fn tied_in_order(&self) -> Vec<(ParamId, usize)> {
        let here = self.tied_here();
        self.order
            .iter()
            .filter(|(id, _)| here.contains(id))
            .map(|(id, shape)| (*id, shape.iter().product()))
            .collect()
    }

    /// Sums the gradients of the tied parameters, `values` flat in
    /// visiting order, over the first and last stage (the host path).
    pub(crate) fn sum_tied(&self, values: &mut [f32]) -> Result<(), CommError> {
        self.ends.all_reduce_sum(values)
    }

    /// The shape of parameter `id` on the stages that hold it (this
    /// rank's TP block).
    ///
    /// # Panics
    /// If `id` is not a parameter of the model (a caller bug).
    pub(crate) fn shape(&self, id: ParamId) -> &[usize] {
        self.order
            .iter()
            .find(|(p, _)| *p == id)
            .map(|(_, shape)| shape.as_slice())
            .expect("a parameter of the model")
    }

    /// Replaces the recorded shape of each parameter of `shapes` (on one
    /// stage: a model of placeholders whose values a ZeRO-3 source draws,
    /// where a placeholder's shape is not its parameter's).
    pub(crate) fn set_shapes(&mut self, shapes: &HashMap<ParamId, Vec<usize>>) {
        for (id, shape) in &mut self.order {
            if let Some(s) = shapes.get(id) {
                shape.clone_from(s);
            }
        }
    }

    /// Parameter `id` (flat, this rank's TP block) on every stage:
    /// broadcast from the stage that owns it, whose `mine` it is (the
    /// others pass `None`). Collective over the PP group.
    pub(crate) fn broadcast_param(
        &self,
        id: ParamId,
        mine: Option<Vec<f32>>,
    ) -> Result<Vec<f32>, CommError> {
        let owner = self.owner[&id];
        let mut buf = match mine.filter(|_| owner == self.stage) {
            Some(v) => v,
            None => vec![0.0; self.shape(id).iter().product()],
        };
        self.pp.broadcast(&mut buf, owner)?;
        Ok(buf)
    }

    /// The whole model on every stage: each parameter broadcast over the
    /// PP group from the stage that owns it. Collective over the PP group.
    pub(crate) fn join<B: Backend, M: Module<B>>(
        &self,
        model: M,
        device: &B::Device,
    ) -> Result<M, CommError> {
        let mut own = OwnValues {
            want: self
                .owner
                .iter()
                .filter(|&(_, &s)| s == self.stage)
                .map(|(&id, _)| id)
                .collect(),
            out: HashMap::new(),
        };
        model.visit(&mut own);
        let mut values = HashMap::new();
        for (id, shape) in &self.order {
            let owner = self.owner[id];
            let mut buf = match own.out.remove(id) {
                Some(v) => v,
                None => vec![0.0; shape.iter().product()],
            };
            self.pp.broadcast(&mut buf, owner)?;
            if !self.held.contains(id) {
                values.insert(*id, TensorData::new(buf, shape.clone()));
            }
        }
        Ok(model.map(&mut Assign {
            values,
            device: device.clone(),
            require_grad: false,
        }))
    }
}

/// `order` (every parameter with its shape on this rank, in visiting
/// order) with the shape each parameter has on the stages that hold it: a
/// stage built only with its own units (`ferrotron_models::ModelPart`)
/// has one-element placeholders for the others, whose shapes it learns
/// here. Each dimension is the largest over the PP group (a placeholder's
/// are 1), gathered as two f32 values of 20 bits (exact up to 2^44).
/// Collective over `pp`.
fn whole_shapes(
    order: Vec<(ParamId, Vec<usize>)>,
    pp: &dyn Communicator,
) -> Result<Vec<(ParamId, Vec<usize>)>, CommError> {
    const LOW: usize = 1 << 20;
    if pp.world_size() == 1 || order.is_empty() {
        return Ok(order);
    }
    let own: Vec<f32> = order
        .iter()
        .flat_map(|(_, shape)| shape.iter())
        .flat_map(|&d| [(d / LOW) as f32, (d % LOW) as f32])
        .collect();
    let mut all = vec![0.0; own.len() * pp.world_size()];
    pp.all_gather(&own, &mut all)?;
    let mut dims = (0..own.len() / 2).map(|i| {
        all.chunks(own.len())
            .map(|rank| rank[2 * i] as usize * LOW + rank[2 * i + 1] as usize)
            .max()
            .unwrap_or(0)
    });
    Ok(order
        .into_iter()
        .map(|(id, shape)| (id, shape.iter().map_while(|_| dims.next()).collect()))
        .collect())
}

/// Host values of the parameters in `want`.
struct OwnValues {
    want: HashSet<ParamId>,
    out: HashMap<ParamId, Vec<f32>>,
}

impl<B: Backend> ModuleVisitor<B> for OwnValues {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.want.contains(&param.id) {
            self.out.insert(param.id, host_f32(param.val()));
        }
    }
}
