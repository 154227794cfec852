//! The two ZeRO collectives on one unit: all-gather of the owned chunks
//! into whole parameters through host `f32` vectors, and the flat vector
//! the reduce-scatter of whole gradients sends (on the host, or as a
//! device tensor for NCCL on device buffers).

use std::collections::HashMap;

use burn::module::ParamId;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::comm::{CommError, Communicator};
use crate::flat::{Piece, Unit};

/// The unit's flat vector (`chunk * dp` elements, zero-padded) from the
/// host values of its parameters; a parameter missing from `values`
/// (no gradient) contributes zeros.
pub(crate) fn flat_unit(unit: &Unit, dp: usize, values: &HashMap<ParamId, Vec<f32>>) -> Vec<f32> {
    let mut flat = vec![0.0; unit.chunk * dp];
    for s in &unit.slots {
        if let Some(v) = values.get(&s.id) {
            flat[s.offset..s.offset + s.numel()].copy_from_slice(v);
        }
    }
    flat
}

/// [`flat_unit`] on the device: the unit's flat vector (`chunk * dp`
/// elements, zero-padded) joined from the flat gradient tensors in
/// `grads`; a parameter missing from `grads` contributes zeros.
pub(crate) fn flat_unit_tensor<B: Backend>(
    unit: &Unit,
    dp: usize,
    grads: &HashMap<ParamId, Tensor<B, 1>>,
    device: &B::Device,
) -> Tensor<B, 1> {
    let zeros = |n: usize| Tensor::<B, 1>::zeros([n], device);
    let mut parts = Vec::new();
    let mut at = 0;
    for s in &unit.slots {
        if s.offset > at {
            parts.push(zeros(s.offset - at));
        }
        parts.push(match grads.get(&s.id) {
            Some(g) => g.clone(),
            None => zeros(s.numel()),
        });
        at = s.offset + s.numel();
    }
    if unit.chunk * dp > at {
        parts.push(zeros(unit.chunk * dp - at));
    }
    Tensor::cat(parts, 0)
}

/// This rank's chunk (`unit.chunk` elements, zero-padded) from the host
/// values of its `pieces`.
pub(crate) fn chunk_from_pieces(
    unit: &Unit,
    pieces: &[Piece],
    values: &HashMap<ParamId, Vec<f32>>,
) -> Vec<f32> {
    let mut chunk = vec![0.0; unit.chunk];
    for p in pieces {
        chunk[p.chunk_offset..p.chunk_offset + p.len()].copy_from_slice(&values[&p.id]);
    }
    chunk
}

/// All-gathers every rank's `chunk` of `unit` and returns each parameter
/// whole, in its shape.
pub(crate) fn all_gather_unit(
    comm: &dyn Communicator,
    unit: &Unit,
    chunk: &[f32],
) -> Result<HashMap<ParamId, TensorData>, CommError> {
    let mut flat = vec![0.0; unit.chunk * comm.world_size()];
    comm.all_gather(chunk, &mut flat)?;
    Ok(unit_values(unit, &flat))
}

/// Each parameter of `unit`, whole in its shape, cut out of the unit's
/// gathered flat vector `flat` (`chunk * dp` values).
pub(crate) fn unit_values(unit: &Unit, flat: &[f32]) -> HashMap<ParamId, TensorData> {
    unit.slots
        .iter()
        .map(|s| {
            let v = flat[s.offset..s.offset + s.numel()].to_vec();
            (s.id, TensorData::new(v, s.shape.clone()))
        })
        .collect()
}
