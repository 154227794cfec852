//! Cube-wide reductions through shared memory, shared by the row kernels
//! (norms, cross-entropy). Deterministic: a fixed tree, no atomics.

use cubecl::prelude::*;

/// Units per cube of the row kernels: one cube reduces one row.
/// A power of two, as the tree reductions below require.
pub(crate) const ROW_CUBE_DIM: u32 = 256;

/// Units per row in the norm kernels: a cube is `NORM_UNITS_PER_ROW` x
/// `NORM_ROWS_PER_CUBE` units and normalises `NORM_ROWS_PER_CUBE` rows at
/// once (one warp per row on NVIDIA). A power of two, as [`row_sum`] requires.
pub(crate) const NORM_UNITS_PER_ROW: u32 = 32;

/// Rows per cube in the norm kernels (see [`NORM_UNITS_PER_ROW`]).
pub(crate) const NORM_ROWS_PER_CUBE: u32 = 8;

/// Sums `value` over the units of the cube that share `UNIT_POS_Y` (one row
/// of a 2-d cube); each of them gets its row's total.
///
/// `scratch` must hold at least `CUBE_DIM` elements and `CUBE_DIM_X` must be
/// a power of two. Every unit of the cube must call this (it synchronises).
#[cube]
pub(crate) fn row_sum<F: Float>(scratch: &mut SharedMemory<F>, value: F) -> F {
    let unit = UNIT_POS_X as usize;
    let base = UNIT_POS_Y as usize * CUBE_DIM_X as usize;
    scratch[base + unit] = value;
    sync_cube();
    let mut stride = (CUBE_DIM_X / 2) as usize;
    while stride > 0 {
        if unit < stride {
            scratch[base + unit] = scratch[base + unit] + scratch[base + unit + stride];
        }
        sync_cube();
        stride /= 2;
    }
    let total = scratch[base];
    sync_cube();
    total
}

/// Sums `value` over the units of the cube; every unit gets the total.
///
/// `scratch` must hold at least `CUBE_DIM` elements and `CUBE_DIM` must be a
/// power of two. Every unit of the cube must call this (it synchronises).
#[cube]
pub(crate) fn cube_sum<F: Float>(scratch: &mut SharedMemory<F>, value: F) -> F {
    let unit = UNIT_POS as usize;
    scratch[unit] = value;
    sync_cube();
    let mut stride = (CUBE_DIM / 2) as usize;
    while stride > 0 {
        if unit < stride {
            scratch[unit] = scratch[unit] + scratch[unit + stride];
        }
        sync_cube();
        stride /= 2;
    }
    let total = scratch[0];
    sync_cube();
    total
}

/// Combines per-unit online-softmax states `(max, sum of exp(x - max))` over
/// the cube; every unit gets the row's `(max, sum)`.
///
/// Same requirements as [`cube_sum`]; `max_scratch` and `sum_scratch` each
/// hold at least `CUBE_DIM` elements.
#[cube]
pub(crate) fn cube_max_sum_exp<F: Float>(
    max_scratch: &mut SharedMemory<F>,
    sum_scratch: &mut SharedMemory<F>,
    max: F,
    sum: F,
) -> (F, F) {
    let unit = UNIT_POS as usize;
    max_scratch[unit] = max;
    sum_scratch[unit] = sum;
    sync_cube();
    let mut stride = (CUBE_DIM / 2) as usize;
    while stride > 0 {
        if unit < stride {
            let m_a = max_scratch[unit];
            let m_b = max_scratch[unit + stride];
            let m = m_a.max(m_b);
            sum_scratch[unit] =
                sum_scratch[unit] * (m_a - m).exp() + sum_scratch[unit + stride] * (m_b - m).exp();
            max_scratch[unit] = m;
        }
        sync_cube();
        stride /= 2;
    }
    let row_max = max_scratch[0];
    let row_sum = sum_scratch[0];
    sync_cube();
    (row_max, row_sum)
}
