//! The two ZeRO collectives on one unit, through host `f32` vectors:
//! all-gather of the owned chunks into whole parameters, and the two ends
//! of the reduce-scatter of whole gradients into the owned chunk (what is
//! sent, and the average made of what comes back).

use std::collections::HashMap;

use burn::module::ParamId;
use burn::tensor::TensorData;

use ferrotron_engine::precision::Precision;

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

/// The values of each piece, cut out of this rank's `chunk`.
pub(crate) fn split_chunk(pieces: &[Piece], chunk: &[f32]) -> Vec<(ParamId, Vec<f32>)> {
    pieces
        .iter()
        .map(|p| {
            let v = chunk[p.chunk_offset..p.chunk_offset + p.len()].to_vec();
            (p.id, v)
        })
        .collect()
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

/// A unit's flat gradient vector as a reduce-scatter over `dp` ranks
/// sends it: over more than one rank, rounded to `reduce` (a
/// low-precision reduction over an f32 wire).
pub(crate) fn rounded_for_reduction(mut flat: Vec<f32>, dp: usize, reduce: Precision) -> Vec<f32> {
    if dp > 1 {
        reduce.round_in_place(&mut flat);
    }
    flat
}

/// This rank's `chunk` of a reduce-scatter's sum over `dp` ranks, divided
/// by `dp` (the average) and, over more than one rank, rounded to `reduce`.
pub(crate) fn average_chunk(mut chunk: Vec<f32>, dp: usize, reduce: Precision) -> Vec<f32> {
    if dp > 1 {
        let w = dp as f32;
        chunk.iter_mut().for_each(|x| *x /= w);
        reduce.round_in_place(&mut chunk);
    }
    chunk
}
