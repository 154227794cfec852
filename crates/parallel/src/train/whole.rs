//! The whole model one parameter at a time, for writers that stream it
//! (the Hugging Face export of `train --hf-out`, the run directory's
//! `model.safetensors`): no rank ever holds more than one whole parameter.
//!
//! For one parameter, in this order: under ZeRO-3 the DP ranks' pieces are
//! joined ([`GradSync::whole_param`](crate::grad_sync::GradSync::whole_param)),
//! else the model's own tensor is read; the pipeline stage owning it
//! broadcasts it over the PP group; the TP blocks are joined over the TP
//! group ([`ShardPlan::gather`](crate::tensor::ShardPlan::gather)). Each
//! step is a collective, so every rank asks for the same parameters in the
//! same order, and every rank gets the whole parameter.

use std::collections::HashMap;
use std::path::Path;

use burn::module::{AutodiffModule, Module, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use ferrotron_engine::lm::{CausalLm, LmUnits};
use ferrotron_engine::params::param_names;

use super::checkpoint::stream::{file_order, StreamWriter};
use super::run::LoopError;
use super::step::Trainer;
use crate::comm::tensor::host_f32;
use crate::tensor::ShardError;

/// The host values (flat, row-major) of parameter `id` of `model`, if it
/// has one of that id.
pub(crate) fn one_parameter<B: Backend, M: Module<B>>(model: &M, id: ParamId) -> Option<Vec<f32>> {
    let mut v = OneParam { id, out: None };
    model.visit(&mut v);
    v.out
}

struct OneParam {
    id: ParamId,
    out: Option<Vec<f32>>,
}

impl<B: Backend> ModuleVisitor<B> for OneParam {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if param.id == self.id {
            self.out = Some(host_f32(param.val()));
        }
    }
}

/// The parameters of a trainer's model made whole one at a time (see the
/// module doc).
pub struct WholeParameters<'a, B: AutodiffBackend, M: AutodiffModule<B> + LmUnits<B>> {
    trainer: &'a Trainer<B, M>,
    /// Every parameter's id and name, in the model's order (the same on
    /// every rank).
    names: Vec<(ParamId, String)>,
    ids: HashMap<String, ParamId>,
}

impl<B, M> Trainer<B, M>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + LmUnits<B> + 'static,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    /// The whole parameters, one at a time ([`WholeParameters::get`]).
    pub fn whole_parameters_one_by_one(&self) -> WholeParameters<'_, B, M> {
        let names = param_names(self.held_model());
        let ids = names.iter().map(|(id, n)| (n.clone(), *id)).collect();
        WholeParameters {
            trainer: self,
            names,
            ids,
        }
    }
}

impl<B, M> WholeParameters<'_, B, M>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + LmUnits<B> + 'static,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    /// Every parameter's name and whole shape (vocabulary padding
    /// removed), in the model's order. No communication.
    pub fn shapes(&self) -> Result<Vec<(String, Vec<usize>)>, ShardError> {
        let t = self.trainer;
        let tp_rank = t.groups.tp().rank();
        self.names
            .iter()
            .map(|(id, name)| {
                let local = t.pipeline.shape(*id);
                let (_, global) = t.shards.placement(name, local, tp_rank)?;
                Ok((name.clone(), global))
            })
            .collect()
    }

    /// Parameter `name` whole (vocabulary padding removed), on every rank:
    /// a collective over the whole job, so every rank asks for the same
    /// names in the same order.
    ///
    /// # Panics
    /// If the model has no parameter `name` (a caller bug).
    pub fn get(&self, name: &str) -> Result<TensorData, ShardError> {
        let t = self.trainer;
        let id = *self
            .ids
            .get(name)
            .unwrap_or_else(|| panic!("the model has no parameter '{name}'"));
        let mine = if t.pipeline.holds(id) {
            Some(match t.sync.whole_param(id)? {
                Some(values) => values,
                None => one_parameter(t.held_model(), id).expect("a parameter the stage holds"),
            })
        } else {
            None
        };
        let values = t.pipeline.broadcast_param(id, mine)?;
        let data = TensorData::new(values, t.pipeline.shape(id).to_vec());
        t.shards.gather(name, data, &**t.groups.tp())
    }

    /// Writes the whole model as the f32 safetensors file `path` (our
    /// parameter names), one parameter at a time: every rank gathers each
    /// parameter in turn, and only `lead` writes. Collective over the job.
    pub fn write_safetensors(&self, path: &Path, lead: bool) -> Result<(), LoopError> {
        let order = file_order(self.shapes()?);
        let mut writer = lead.then(|| StreamWriter::create(path, order.clone(), None));
        for (name, _) in &order {
            let data = self.get(name)?;
            if let Some(w) = writer.as_mut() {
                let values = data
                    .into_vec::<f32>()
                    .map_err(|_| ShardError::NotF32(name.clone()))?;
                w.append(&values);
            }
        }
        if let Some(w) = writer {
            w.finish()?;
        }
        Ok(())
    }
}
