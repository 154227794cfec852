//! Gradients that sequence parallelism leaves partial: a replicated
//! parameter applied to this rank's block of the sequence only (a norm's
//! gain, a row-parallel layer's bias, a position embedding) gets the
//! gradient of that block; the TP group sums them (as Megatron-LM
//! all-reduces the layer-norm gradients of its sequence-parallel regions),
//! after which every rank holds the whole, identical gradient.

use std::collections::HashSet;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;

use super::TpGroup;
use crate::comm::CommError;

/// The parameters whose gradients the TP group must sum, and the group.
pub struct PartialGrads {
    ids: HashSet<ParamId>,
    group: TpGroup,
}

impl PartialGrads {
    /// No partial gradients (no sequence parallelism).
    pub fn none() -> Self {
        Self {
            ids: HashSet::new(),
            group: TpGroup::single(),
        }
    }

    /// The gradients of `ids`, summed over `group`.
    pub fn new(ids: HashSet<ParamId>, group: TpGroup) -> Self {
        Self { ids, group }
    }

    /// Sums over `group` from now on (the same ranks, with their device
    /// collectives: `Trainer::partial_grads_on`).
    pub(crate) fn set_group(&mut self, group: TpGroup) {
        self.group = group;
    }

    /// `grads` (of `model`'s parameters) with each partial gradient summed
    /// over the group. Collective: every rank of the group calls it for
    /// the same parameters in the same order.
    pub fn sum<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        model: &M,
        grads: GradientsParams,
    ) -> Result<GradientsParams, CommError> {
        if self.ids.is_empty() {
            return Ok(grads);
        }
        let mut v = Sum::<B> {
            partial: self,
            grads,
            error: None,
            _b: std::marker::PhantomData,
        };
        model.visit(&mut v);
        match v.error {
            Some(e) => Err(e),
            None => Ok(v.grads),
        }
    }
}

struct Sum<'a, B: AutodiffBackend> {
    partial: &'a PartialGrads,
    grads: GradientsParams,
    error: Option<CommError>,
    _b: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Sum<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.error.is_some() || !self.partial.ids.contains(&param.id) {
            return;
        }
        let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
            return;
        };
        let shape = g.shape();
        let n = shape.num_elements();
        match super::collective::sum(g.reshape([n]), &self.partial.group) {
            Ok(sum) => self.grads.register(param.id, sum.reshape::<D, _>(shape)),
            Err(e) => self.error = Some(e),
        }
    }
}
