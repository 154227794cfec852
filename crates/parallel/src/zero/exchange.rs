//! The flat vectors of ZeRO's two collectives on one unit, on the host or
//! as device tensors (NCCL on device buffers): the chunk a rank sends to
//! the all-gather and the whole parameters cut out of its result, and the
//! flat vector of whole gradients the reduce-scatter sends.

use std::collections::HashMap;

use burn::module::ParamId;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

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
    let parts = unit
        .slots
        .iter()
        .filter_map(|s| Some((s.offset, grads.get(&s.id)?.clone())));
    join_padded(parts, unit.chunk * dp, device)
}

/// The rank-1 tensors `parts`, each at its offset (in increasing order,
/// not overlapping), joined into one tensor of `total` elements with
/// zeros in the gaps.
fn join_padded<B: Backend>(
    parts: impl IntoIterator<Item = (usize, Tensor<B, 1>)>,
    total: usize,
    device: &B::Device,
) -> Tensor<B, 1> {
    let zeros = |n: usize| Tensor::<B, 1>::zeros([n], device);
    let mut joined = Vec::new();
    let mut at = 0;
    for (offset, t) in parts {
        if offset > at {
            joined.push(zeros(offset - at));
        }
        at = offset + t.dims()[0];
        joined.push(t);
    }
    if total > at {
        joined.push(zeros(total - at));
    }
    Tensor::cat(joined, 0)
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

/// [`chunk_from_pieces`] on the device: this rank's chunk (`unit.chunk`
/// elements, zero-padded) joined from its `pieces`' rank-1 tensors.
pub(crate) fn chunk_tensor<B: Backend>(
    unit: &Unit,
    pieces: &[Piece],
    mut tensors: HashMap<ParamId, Tensor<B, 1>>,
    device: &B::Device,
) -> Tensor<B, 1> {
    let mut order: Vec<&Piece> = pieces.iter().collect();
    order.sort_by_key(|p| p.chunk_offset);
    let parts = order.into_iter().map(|p| {
        let t = tensors.remove(&p.id).expect("every piece has its values");
        (p.chunk_offset, t)
    });
    join_padded(parts, unit.chunk, device)
}

/// [`unit_values`] on the device: each parameter of `unit`, whole, as a
/// rank-1 tensor with its shape, cut out of the unit's gathered flat
/// tensor `flat` (`chunk * dp` values).
pub(crate) fn unit_tensors<B: Backend>(
    unit: &Unit,
    flat: Tensor<B, 1>,
) -> HashMap<ParamId, (Tensor<B, 1>, Vec<usize>)> {
    unit.slots
        .iter()
        .map(|s| {
            let t = flat.clone().slice(s.offset..s.offset + s.numel());
            (s.id, (t, s.shape.clone()))
        })
        .collect()
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
