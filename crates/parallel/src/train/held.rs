//! The trainer's side of sharded checkpoints: writing what this rank
//! stores ([`Trainer::write_checkpoint`], one tensor's host copy at a
//! time) and loading a checkpoint of any layout into this rank's share
//! ([`Trainer::load`]).
//!
//! A parameter's share on a rank is a [`Region`]: the box of its TP block
//! in the whole tensor ([`ShardPlan::placement`]) and the range of that
//! box the rank keeps AdamW's moments of (its ZeRO piece, or all of it),
//! which under ZeRO-3 is also the range of the weights it keeps.
//!
//! [`ShardPlan::placement`]: crate::tensor::ShardPlan::placement

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use burn::module::{AutodiffModule, ParamId};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use ferrotron_engine::checkpoint::CheckpointError;
use ferrotron_engine::data::SamplerState;
use ferrotron_engine::lm::{CausalLm, LmUnits};
use ferrotron_engine::params::param_names;

use super::checkpoint::background::Background;
use super::checkpoint::index::Layout;
use super::checkpoint::read::Reader;
use super::checkpoint::region::Region;
use super::checkpoint::shard::{HeldBlock, Shard};
use super::checkpoint::{self, CheckpointState};
use super::loss_scale::LossScaler;
use super::step::Trainer;
use super::whole::one_parameter;
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

/// Which of a parameter's tensors a checkpoint block holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Weights,
    M,
    V,
}

/// Where the values of a checkpoint block come from: `part` of parameter
/// `id` over `range` of its TP block (`unclipped`), cut to the tensor.
struct Origin {
    id: ParamId,
    name: String,
    part: Part,
    range: Range<usize>,
    unclipped: Region,
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
            cp: mesh.cp,
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

    /// The blocks this rank stores of a checkpoint (no communication), with
    /// where their values come from: for each parameter of its stage, the
    /// weights and AdamW's moments over its share, clipped to the whole
    /// tensor. Of the ranks holding the same values one stores them: DP x
    /// CP rank 0 without ZeRO (a CP ring's ranks hold the same
    /// parameters), TP rank 0 for a parameter TP does not split, stage 0
    /// for a tied embedding.
    fn held_blocks(&self) -> Result<Vec<(HeldBlock, Origin)>, ShardError> {
        let (dp_rank, tp_rank) = (self.groups.dp_cp().rank(), self.groups.tp().rank());
        let replicated_over_dp = self.sync.owned_ranges().is_none();
        let mut blocks = Vec::new();
        for (id, share) in self.shares()? {
            let Some(range) = share.range.clone() else {
                continue;
            };
            let tp_copy = tp_rank > 0 && self.shards.split(&share.name)? == Split::Replicated;
            if self.pipeline.is_tied_copy(id) || tp_copy || (replicated_over_dp && dp_rank > 0) {
                continue;
            }
            let unclipped = share.region(range.clone());
            let region = unclipped.clipped(&share.global);
            if region.is_empty() {
                continue;
            }
            for (name, part) in [
                (share.name.clone(), Part::Weights),
                (format!("m.{}", share.name), Part::M),
                (format!("v.{}", share.name), Part::V),
            ] {
                let block = HeldBlock {
                    name,
                    global: share.global.clone(),
                    region: region.clone(),
                };
                let origin = Origin {
                    id,
                    name: share.name.clone(),
                    part,
                    range: range.clone(),
                    unclipped: unclipped.clone(),
                };
                blocks.push((block, origin));
            }
        }
        Ok(blocks)
    }

    /// The values of the block `origin` describes, copied to the host now
    /// (one tensor at a time: a parameter, or one of its moments).
    fn block_values(&self, origin: &Origin, global: &[usize]) -> Vec<f32> {
        let range = origin.range.clone();
        let values = match origin.part {
            Part::Weights => match self.sync.param_piece(origin.id) {
                Some(p) => p,
                None => {
                    let mut all = one_parameter(self.held_model(), origin.id)
                        .unwrap_or_else(|| panic!("parameter '{}' is held", origin.name));
                    all.truncate(range.end);
                    all.drain(..range.start);
                    all
                }
            },
            Part::M | Part::V => self
                .moment_values(origin.id, origin.part == Part::M)
                .unwrap_or_else(|| vec![0.0; range.len()]),
        };
        origin.unclipped.clip(global, &values).1
    }

    /// AdamW's first (`first`) or second moment of parameter `id` over this
    /// rank's range, copied to the host from where it lives (the device,
    /// or host memory when offloaded); `None` before its first update.
    fn moment_values(&self, id: ParamId, first: bool) -> Option<Vec<f32>> {
        if let Some((m, v)) = self.optimizer.host_moments(id) {
            return Some(if first { m } else { v }.to_vec());
        }
        let (m, v) = self.optimizer.moments(id)?;
        Some(host_f32(if first { m } else { v }))
    }

    /// This rank's blocks of a checkpoint, with where their values come from.
    fn checkpoint_shard(&self, root: &Path) -> Result<(Shard, Vec<Origin>), CheckpointError> {
        let held = self.held_blocks().map_err(|e| CheckpointError::Format {
            path: root.display().to_string(),
            message: e.to_string(),
        })?;
        let (blocks, origins): (Vec<HeldBlock>, Vec<Origin>) = held.into_iter().unzip();
        let shard = Shard {
            blocks,
            layout: self.layout(),
            steps_done: self.steps_done,
            optimizer_steps: self.optimizer.steps_taken(),
            loss_scaler: self.scaler,
        };
        Ok((shard, origins))
    }

    /// Writes this rank's part of a complete checkpoint into `root` (a
    /// run's `checkpoints/`; a collective over the whole job, see
    /// [`super::checkpoint`]): each block's values are copied to the host
    /// only while it is written, so the save holds one tensor's host copy
    /// at a time beyond the training state. Rank 0 adds `sampler` and
    /// `extra` and gets the checkpoint's directory.
    pub fn write_checkpoint(
        &self,
        root: &Path,
        sampler: Option<SamplerState>,
        extra: &[(String, Vec<u8>)],
        keep: usize,
    ) -> Result<Option<PathBuf>, CheckpointError> {
        let (shard, origins) = self.checkpoint_shard(root)?;
        let world = self.groups.world();
        let mut values = |i: usize| self.block_values(&origins[i], &shard.blocks[i].global);
        checkpoint::write(root, &**world, &shard, &mut values, sampler, extra, keep)
    }

    /// [`Trainer::write_checkpoint`] in the background: this rank's blocks
    /// are copied to the host now (a second copy of its share), a thread
    /// writes them, and [`Background::finish`] (a collective, at a later
    /// step boundary) publishes the checkpoint.
    pub fn start_checkpoint(
        &self,
        root: &Path,
        sampler: Option<SamplerState>,
        extra: &[(String, Vec<u8>)],
        keep: usize,
    ) -> Result<Option<Background>, CheckpointError> {
        let (shard, origins) = self.checkpoint_shard(root)?;
        let values = origins
            .iter()
            .zip(&shard.blocks)
            .map(|(o, b)| self.block_values(o, &b.global))
            .collect();
        let world = self.groups.world();
        Background::start(root, &**world, shard, values, sampler, extra, keep)
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
        let sharded = self.sync.holds_param_pieces();
        let mut assign = HashMap::new();
        for (id, share) in &shares {
            if sharded {
                if let Some(range) = share.range.clone() {
                    let values = reader.read(&share.name, &share.global, &share.region(range))?;
                    // Replaced one at a time: the load holds one piece
                    // beyond the rank's share, not a second share.
                    self.sync.set_param_piece(*id, values);
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
                if self.offloaded {
                    self.optimizer.set_host_moments(*id, m, v);
                } else {
                    let (m, v) = (self.host_tensor(m), self.host_tensor(v));
                    self.optimizer.set_moments(*id, m, v);
                }
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
        self.optimizer.set_steps_taken(state.optimizer_steps);
        self.steps_done = state.step;
        // The scale and its counters continue; the window is the run's
        // setting, which `--override` may have changed.
        if let (Some(configured), Some(saved)) = (self.scaler, state.loss_scaler) {
            self.scaler = Some(LossScaler {
                window: configured.window,
                ..saved
            });
        }
        Ok(())
    }

    fn host_tensor(&self, values: Vec<f32>) -> Tensor<B::InnerBackend, 1> {
        from_host(values, &self.device)
    }
}
