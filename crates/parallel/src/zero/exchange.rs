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
    let zeros = |n: usize| Tensor::<B, 1>::zeros([n], device);
    let mut parts = Vec::new();
    let mut at = 0;
    for p in order {
        if p.chunk_offset > at {
            parts.push(zeros(p.chunk_offset - at));
        }
        parts.push(tensors.remove(&p.id).expect("every piece has its values"));
        at = p.chunk_offset + p.len();
    }
    if unit.chunk > at {
        parts.push(zeros(unit.chunk - at));
    }
    Tensor::cat(parts, 0)
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
