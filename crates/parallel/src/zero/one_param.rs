//! ZeRO-3: one parameter made whole from the DP ranks' pieces, without
//! gathering the rest of its unit (a checkpoint export or the run
//! directory's weights, tensor by tensor).
//!
//! In its unit's flat vector a parameter occupies `[offset, offset +
//! numel)`, and rank `r` owns `[r * chunk, (r + 1) * chunk)` of it, so every
//! rank knows which ranks hold which segment: each owner broadcasts its
//! segment over the DP group in rank order. The values arrive unchanged
//! (no arithmetic), and no rank holds more than the one parameter.

use burn::module::{AutodiffModule, ParamId};
use burn::tensor::backend::AutodiffBackend;
use ferrotron_engine::lm::LmUnits;

use super::Zero;
use crate::comm::CommError;

impl<B: AutodiffBackend, M: AutodiffModule<B> + LmUnits<B>> Zero<B, M> {
    /// Parameter `id` whole (flat row-major), from every rank's piece: a
    /// collective over the DP group.
    ///
    /// # Panics
    /// If `id` is not a parameter of the layout (a caller bug).
    pub(super) fn gather_param(&self, id: ParamId) -> Result<Vec<f32>, CommError> {
        let (unit, slot) = self
            .layout
            .units()
            .iter()
            .find_map(|u| u.slots.iter().find(|s| s.id == id).map(|s| (u, s)))
            .expect("the parameter belongs to a unit");
        let (start, end) = (slot.offset, slot.offset + slot.numel());
        let mut whole = vec![0.0; slot.numel()];
        for r in 0..self.comm.world_size() {
            let (a, b) = (start.max(r * unit.chunk), end.min((r + 1) * unit.chunk));
            if a >= b {
                continue;
            }
            let segment = &mut whole[a - start..b - start];
            if r == self.comm.rank() {
                let piece = self.params.values(id);
                segment.copy_from_slice(&piece);
            }
            self.comm.broadcast(segment, r)?;
        }
        Ok(whole)
    }
}
