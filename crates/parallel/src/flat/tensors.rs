//! Moving parameters and gradients between a model and flat vectors:
//! a rank's pieces of the parameters or gradients ([`PieceTensors`],
//! [`GradTensors`]), the bytes a module holds ([`ParamBytes`],
//! [`GradBytes`]), and replacing parameters by given values ([`Assign`],
//! [`AssignFlat`]) or by placeholders ([`Release`], ZeRO-3 and the
//! pipeline's stages).

use std::collections::{HashMap, HashSet};

use burn::module::{ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Shape, Tensor, TensorData};

use super::Piece;

/// This rank's pieces of the parameters, or with `grads` of their
/// gradients, as rank-1 tensors on the device: elements `start..end` of
/// each parameter's flat view (parameters without a gradient are left out).
pub(crate) struct PieceTensors<'a, B: AutodiffBackend> {
    pub(crate) pieces: HashMap<ParamId, &'a Piece>,
    pub(crate) grads: Option<&'a GradientsParams>,
    pub(crate) out: HashMap<ParamId, Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for PieceTensors<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(piece) = self.pieces.get(&param.id) else {
            return;
        };
        let whole = match self.grads {
            Some(grads) => match grads.get::<B::InnerBackend, D>(param.id) {
                Some(g) => g,
                None => return,
            },
            None => param.val().inner(),
        };
        let n = whole.shape().num_elements();
        let flat = whole.reshape([n]).slice(piece.start..piece.end);
        self.out.insert(param.id, flat);
    }
}

/// The gradients in `grads` of the parameters whose ids are in `want`,
/// flat (rank-1) on the device (parameters without a gradient are left
/// out).
pub(crate) struct GradTensors<'a, B: AutodiffBackend> {
    pub(crate) grads: &'a GradientsParams,
    pub(crate) want: &'a HashSet<ParamId>,
    pub(crate) out: HashMap<ParamId, Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GradTensors<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if !self.want.contains(&param.id) {
            return;
        }
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            let n = g.shape().num_elements();
            self.out.insert(param.id, g.reshape([n]));
        }
    }
}

/// Bytes held by the parameter tensors of a module (what it holds now:
/// placeholders of released ZeRO-3 parameters count as their one element).
pub(crate) struct ParamBytes(pub(crate) usize);

impl<B: Backend> ModuleVisitor<B> for ParamBytes {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let t = param.val();
        self.0 += t.shape().num_elements() * t.dtype().size();
    }
}

/// Bytes held by the gradients in `grads` of a module's parameters.
pub(crate) struct GradBytes<'a> {
    pub(crate) grads: &'a GradientsParams,
    pub(crate) bytes: usize,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GradBytes<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            self.bytes += g.shape().num_elements() * g.dtype().size();
        }
    }
}

/// Replaces the parameters named in `values` by tensors holding those
/// values (`require_grad` says whether backward computes their gradients).
pub(crate) struct Assign<B: Backend> {
    pub(crate) values: HashMap<ParamId, TensorData>,
    pub(crate) device: B::Device,
    pub(crate) require_grad: bool,
}

impl<B: Backend> ModuleMapper<B> for Assign<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(data) = self.values.remove(&id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let mut t = Tensor::<B, D>::from_data(data, &self.device);
        if self.require_grad {
            t = t.require_grad();
        }
        Param::from_mapped_value(id, t, mapper)
    }
}

/// Replaces parameters by given rank-1 tensors reshaped to their shapes
/// (ZeRO's gathers on device collectives, whose results stay on the
/// device); the others are left as they are.
pub(crate) struct AssignFlat<B: Backend> {
    pub(crate) values: HashMap<ParamId, (Tensor<B, 1>, Vec<usize>)>,
    pub(crate) require_grad: bool,
}

impl<B: Backend> ModuleMapper<B> for AssignFlat<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let Some((flat, shape)) = self.values.remove(&id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let mut t: Tensor<B, D> = flat.reshape(Shape::from(shape));
        if self.require_grad {
            t = t.require_grad();
        }
        Param::from_mapped_value(id, t, mapper)
    }
}

/// Replaces the parameters in `ids` by one-element placeholders, freeing
/// their memory (ZeRO-3 between uses).
pub(crate) struct Release<'a, B: Backend> {
    pub(crate) ids: &'a HashSet<ParamId>,
    pub(crate) device: B::Device,
}

impl<B: Backend> ModuleMapper<B> for Release<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        if !self.ids.contains(&id) {
            return Param::from_mapped_value(id, tensor, mapper);
        }
        Param::from_mapped_value(id, Tensor::zeros([1; D], &self.device), mapper)
    }
}
