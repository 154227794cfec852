//! Sizes and the per-score helpers shared by the forward and backward
//! attention kernels.

use cubecl::prelude::*;

/// Units per cube: each unit owns one query row (forward, dQ) or one key row
/// (dK/dV), so this is also the number of rows a cube handles.
pub(crate) const ROWS_PER_CUBE: usize = 64;

/// Largest supported head dimension. Each unit keeps up to four rows of
/// `head_dim` values in local memory.
pub const MAX_HEAD_DIM: usize = 256;

/// Keys (or queries) a unit handles per step of its inner loop, with their
/// scores kept in registers.
pub(crate) const KEYS_PER_STEP: usize = 16;

/// Large negative score of masked keys and start value of running maxima
/// (finite, because WGSL has no infinity literal).
pub(crate) const NEG_LARGE: f32 = -1.0e30;

/// Whether key `key` takes part in the softmax of query `query`: both lie
/// inside the sequence and, with `causal`, the key is not after the query.
#[cube]
pub(crate) fn visible(query: usize, key: usize, seq: usize, #[comptime] causal: bool) -> bool {
    let mut inside = query < seq && key < seq;
    if causal {
        inside = inside && key <= query;
    }
    inside
}

/// The ALiBi bias `slope * (key - query)` added to the score of `(query, key)`.
#[cube]
pub(crate) fn alibi_bias(slope: f32, query: usize, key: usize) -> f32 {
    slope * (f32::cast_from(key as u32) - f32::cast_from(query as u32))
}

/// The score of pair `(query, key)` from its dot product `qk`: `scale *
/// qk`, plus the ALiBi bias with `alibi` (unmasked: the kernels mask with
/// [`visible`]).
#[cube]
pub(crate) fn pair_score(
    qk: f32,
    scale: f32,
    slope: f32,
    query: usize,
    key: usize,
    #[comptime] alibi: bool,
) -> f32 {
    let mut score = qk * scale;
    if alibi {
        score += alibi_bias(slope, query, key);
    }
    score
}
