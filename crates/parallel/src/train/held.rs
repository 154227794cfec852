//! The trainer's side of sharded checkpoints: what this rank stores
//! ([`Trainer::shard`], no communication) and loading a checkpoint of any
//! layout into this rank's share ([`Trainer::load`]).
//!
//! A parameter's share on a rank is a [`Region`]: the box of its TP block
//! in the whole tensor ([`ShardPlan::placement`]) and the range of that
//! box the rank keeps AdamW's moments of (its ZeRO piece, or all of it),
//! which under ZeRO-3 is also the range of the weights it keeps.
//!
//! [`ShardPlan::placement`]: crate::tensor::ShardPlan::placement

use std::collections::HashMap;
use std::ops::Range;

use burn::module::{AutodiffModule, ParamId};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use ferrotron_engine::checkpoint::CheckpointError;
use ferrotron_engine::lm::{CausalLm, LmUnits};
use ferrotron_engine::params::{named_tensors, param_names};

use super::checkpoint::index::Layout;
use super::checkpoint::read::Reader;
use super::checkpoint::region::Region;
use super::checkpoint::shard::{HeldBlock, Shard};
use super::checkpoint::CheckpointState;
use super::step::Trainer;
use crate::comm::tensor::{from_host, host_f32};
use crate::flat::tensors::Assign;
use crate::tensor::{ShardError, Split};

/// Where one parameter of this rank lies: its TP box, the whole tensor's
/// shape, and the range of the box whose state this rank keeps.
struct Share {
    name: String,
    offsets: Vec<usize>,
    local: Vec<usize>,
    global: Vec<usize>,
    /// `None`: this rank keeps no state of it (another DP rank's ZeRO piece).
    range: Option<Range<usize>>,
}

impl Share {
    fn region(&self, range: Range<usize>) -> Region {
        Region {
            offsets: self.offsets.clone(),
            shape: self.local.clone(),
            start: range.start,
            end: range.end,
        }
    }
}

impl<B, M> Trainer<B, M>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + LmUnits<B> + 'static,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    /// The layout of this run, as a checkpoint's index records it.
    pub fn layout(&self) -> Layout {
        let mesh = self.groups.mesh();
        Layout {
            world: self.groups.world().world_size(),
            tp: mesh.tp,
            pp: mesh.pp,
            pp_virtual: self.chunks,
            dp: mesh.dp,
            zero: u8::from(self.stage),
        }
    }

    /// The share of every parameter of this rank's stage, by id.
    fn shares(&self) -> Result<Vec<(ParamId, Share)>, ShardError> {
        let owned = self.sync.owned_ranges();
        let tp_rank = self.groups.tp().rank();
        let mut out = Vec::new();
        for (id, name) in param_names(self.held_model()) {
            if !self.pipeline.holds(id) {
                continue;
            }
            let local = self.shapes[&id].clone();
            let (offsets, global) = self.shards.placement(&name, &local, tp_rank)?;
            let range = match &owned {
                Some(pieces) => pieces.get(&id).cloned(),
                None => Some(0..local.iter().product()),
            };
            out.push((
                id,
                Share {
                    name,
                    offsets,
                    local,
                    global,
                    range,
                },
            ));
        }
        Ok(out)
    }

    /// What this rank stores of a checkpoint (no communication): for each
    /// parameter of its stage, the weights and AdamW's moments over its
    /// share, clipped to the whole tensor. Of the ranks holding the same
    /// values one stores them: DP x CP rank 0 without ZeRO, TP rank 0 for a
    /// parameter TP does not split, stage 0 for a tied embedding.
    pub fn shard(&self) -> Result<Shard, ShardError> {
        // Replicas: DP x CP (a CP ring's ranks hold the same parameters).
        let (dp_rank, tp_rank) = (self.groups.dp_cp().rank(), self.groups.tp().rank());
        let replicated_over_dp = self.sync.owned_ranges().is_none();
        let pieces = self.sync.param_pieces();
        let mut whole: HashMap<String, TensorData> = match pieces {
            Some(_) => HashMap::new(),
            None => named_tensors(&self.held_model().valid())
                .into_iter()
                .collect(),
        };
        let mut blocks = Vec::new();
        for (id, share) in self.shares()? {
            let Some(range) = share.range.clone() else {
                continue;
            };
            let tp_copy = tp_rank > 0 && self.shards.split(&share.name)? == Split::Replicated;
            if self.pipeline.is_tied_copy(id) || tp_copy || (replicated_over_dp && dp_rank > 0) {
                continue;
            }
            let weights = match pieces {
                Some(p) => host_f32(p[&id].clone()),
                None => {
                    let data = whole.remove(&share.name).expect("every parameter is named");
                    let values = data
                        .into_vec::<f32>()
                        .map_err(|_| ShardError::NotF32(share.name.clone()))?;
                    values[range.clone()].to_vec()
                }
            };
            let (m, v) = match self.optimizer.moments(id) {
                Some((m, v)) => (host_f32(m), host_f32(v)),
                None => (vec![0.0; range.len()], vec![0.0; range.len()]),
            };
            let region = share.region(range);
            for (name, values) in [
                (share.name.clone(), weights),
                (format!("m.{}", share.name), m),
                (format!("v.{}", share.name), v),
            ] {
                let (region, values) = region.clip(&share.global, &values);
                if !region.is_empty() {
                    blocks.push(HeldBlock {
                        name,
                        global: share.global.clone(),
                        region,
                        values,
                    });
                }
            }
        }
        Ok(Shard {
            blocks,
            layout: self.layout(),
            steps_done: self.steps_done,
            optimizer_steps: self.optimizer.steps_taken(),
            loss_scaler: self.scaler,
        })
    }

    /// Continues from the checkpoint `reader` (of any layout) with its
    /// `state`: this rank's share of every parameter of its stage and of
    /// AdamW's moments is read from the blocks that overlap it, and the
    /// step counters and loss scaler are restored. No communication.
    /// Errors name the tensor and the file (a tensor missing or of another
    /// shape: another architecture or vocabulary; a damaged block).
    pub fn load(
        &mut self,
        reader: &mut Reader,
        state: &CheckpointState,
    ) -> Result<(), CheckpointError> {
        let shares = self.shares().map_err(|e| CheckpointError::Format {
            path: "the model".into(),
            message: e.to_string(),
        })?;
        let sharded = self.sync.param_pieces().is_some();
        let mut assign = HashMap::new();
        let mut pieces = HashMap::new();
        for (id, share) in &shares {
            if sharded {
                if let Some(range) = share.range.clone() {
                    let values = reader.read(&share.name, &share.global, &share.region(range))?;
                    pieces.insert(*id, self.host_tensor(values));
                }
            } else {
                let whole = Region::whole(share.offsets.clone(), share.local.clone());
                let values = reader.read(&share.name, &share.global, &whole)?;
                assign.insert(*id, TensorData::new(values, share.local.clone()));
            }
            if let Some(range) = share.range.clone() {
                let region = share.region(range);
                let m = reader.read(&format!("m.{}", share.name), &share.global, &region)?;
                let v = reader.read(&format!("v.{}", share.name), &share.global, &region)?;
                let (m, v) = (self.host_tensor(m), self.host_tensor(v));
                self.optimizer.set_moments(*id, m, v);
            }
        }
        let model = self
            .model
            .take()
            .expect("the model is always present between steps");
        self.model = Some(model.map(&mut Assign::<B> {
            values: assign,
            device: self.device.clone(),
            require_grad: true,
        }));
        if let Some(held) = self.sync.param_pieces_mut() {
            held.extend(pieces);
        }
        self.optimizer.set_steps_taken(state.optimizer_steps);
        self.steps_done = state.step;
        if let (Some(_), Some(scaler)) = (self.scaler, state.loss_scaler) {
            self.scaler = Some(scaler);
        }
        Ok(())
    }

    fn host_tensor(&self, values: Vec<f32>) -> Tensor<B::InnerBackend, 1> {
        from_host(values, &self.device)
    }
}
