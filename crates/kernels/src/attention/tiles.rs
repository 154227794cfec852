//! Tile sizes and the per-score helpers shared by the forward and backward
//! attention kernels.

use cubecl::prelude::*;

/// Shared memory one cube of an attention kernel may use, in `f32` elements
/// (16 KiB: the WebGPU minimum, so every runtime can launch every kernel).
const SHARED_F32_PER_CUBE: usize = 4096;

/// Units per cube: each unit owns one query row (forward, dQ) or one key row
/// (dK/dV), so this is also the number of rows a cube handles.
pub(crate) const ROWS_PER_CUBE: usize = 64;

/// Largest supported head dimension. Each unit keeps up to four rows of
/// `head_dim` values in local memory.
pub(crate) const MAX_HEAD_DIM: usize = 256;

/// Rows of the tile staged in shared memory when each staged row holds two
/// vectors of `head_dim` values (K and V, or Q and dO) plus `extra` scalars.
/// Between 1 and [`ROWS_PER_CUBE`].
pub(crate) fn staged_rows(head_dim: usize, extra: usize) -> usize {
    (SHARED_F32_PER_CUBE / (2 * head_dim + extra)).clamp(1, ROWS_PER_CUBE)
}

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
pub(crate) fn alibi_bias<F: Float>(slope: F, query: usize, key: usize) -> F {
    slope * (F::cast_from(key as u32) - F::cast_from(query as u32))
}

/// Copies rows `first_row..first_row + rows` of the `[seq, head_dim]` matrix
/// that starts at element `base` of `src` into `tile` (`[rows, head_dim]`),
/// writing zeros for rows at or past `seq`. All units of the cube take part;
/// the caller synchronises before reading `tile`.
#[cube]
pub(crate) fn stage_rows<F: Float>(
    src: &Array<F>,
    base: usize,
    first_row: usize,
    seq: usize,
    tile: &mut SharedMemory<F>,
    #[comptime] rows: usize,
    #[comptime] head_dim: usize,
) {
    let start = base + first_row * head_dim;
    let mut idx = UNIT_POS_X as usize;
    while idx < rows * head_dim {
        let mut value = F::new(0.0);
        if first_row + idx / head_dim < seq {
            value = src[start + idx];
        }
        tile[idx] = value;
        idx += CUBE_DIM_X as usize;
    }
}
