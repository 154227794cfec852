//! RMSNorm as in Llama: `y = x / sqrt(mean(x^2) + eps) * weight`, over the
//! last axis of `x: [rows, hidden]`, with `weight: [hidden]`.

use super::{check_buffers, row_cubes};
use crate::check::ShapeError;
use crate::column_sums::{
    self as params, chunk_column, lane_sum, ParamChunks, PARAM_ROW_LANES, PARAM_TILE_COLS,
};
use crate::dtype::{load, store, with_storage, FloatDtype};
use crate::reduce::{row_sum, NORM_ROWS_PER_CUBE, NORM_UNITS_PER_ROW};
use cubecl::prelude::*;
use cubecl::server::Handle;

#[cube(launch_unchecked)]
fn rms_norm_forward_kernel<F: Float>(
    x: &Array<F>,
    weight: &Array<F>,
    y: &mut Array<F>,
    rstd: &mut Array<f32>,
    rows: u32,
    hidden: u32,
    eps: f32,
    #[comptime] round_bf16: bool,
) {
    // Rows past `rows` in the last cube compute on a copy of the last row
    // and write nothing (every unit must reach the barriers).
    let row = CUBE_POS * CUBE_DIM_Y as usize + UNIT_POS_Y as usize;
    let live = row < rows as usize;
    let row = min(row, rows as usize - 1);
    let hidden = hidden as usize;
    let base = row * hidden;
    let mut scratch = SharedMemory::<f32>::new((NORM_UNITS_PER_ROW * NORM_ROWS_PER_CUBE) as usize);

    let mut sum_sq = 0.0f32;
    let mut j = UNIT_POS_X as usize;
    while j < hidden {
        let v = load::<F>(x[base + j], round_bf16);
        sum_sq += v * v;
        j += CUBE_DIM_X as usize;
    }
    let sum_sq = row_sum::<f32>(&mut scratch, sum_sq);
    let r = 1.0f32 / (sum_sq / f32::cast_from(hidden) + eps).sqrt();

    if live {
        let mut j = UNIT_POS_X as usize;
        while j < hidden {
            y[base + j] = store::<F>(
                load::<F>(x[base + j], round_bf16) * r * load::<F>(weight[j], round_bf16),
                round_bf16,
            );
            j += CUBE_DIM_X as usize;
        }
        if UNIT_POS_X == 0 {
            rstd[row] = r;
        }
    }
}

#[cube(launch_unchecked)]
fn rms_norm_backward_dx_kernel<F: Float>(
    x: &Array<F>,
    weight: &Array<F>,
    rstd: &Array<f32>,
    dy: &Array<F>,
    dx: &mut Array<F>,
    rows: u32,
    hidden: u32,
    #[comptime] round_bf16: bool,
) {
    // Rows past `rows` in the last cube compute on a copy of the last row
    // and write nothing (every unit must reach the barriers).
    let row = CUBE_POS * CUBE_DIM_Y as usize + UNIT_POS_Y as usize;
    let live = row < rows as usize;
    let row = min(row, rows as usize - 1);
    let hidden = hidden as usize;
    let base = row * hidden;
    let r = rstd[row];
    let mut scratch = SharedMemory::<f32>::new((NORM_UNITS_PER_ROW * NORM_ROWS_PER_CUBE) as usize);

    // dot = sum_k dy_k * w_k * x_k
    let mut dot = 0.0f32;
    let mut j = UNIT_POS_X as usize;
    while j < hidden {
        dot += load::<F>(dy[base + j], round_bf16)
            * load::<F>(weight[j], round_bf16)
            * load::<F>(x[base + j], round_bf16);
        j += CUBE_DIM_X as usize;
    }
    let dot = row_sum::<f32>(&mut scratch, dot);
    // dx_j = r * dy_j * w_j - r^3 / hidden * x_j * dot
    let c = r * r * r * dot / f32::cast_from(hidden);

    if live {
        let mut j = UNIT_POS_X as usize;
        while j < hidden {
            dx[base + j] = store::<F>(
                r * load::<F>(dy[base + j], round_bf16) * load::<F>(weight[j], round_bf16)
                    - c * load::<F>(x[base + j], round_bf16),
                round_bf16,
            );
            j += CUBE_DIM_X as usize;
        }
    }
}

/// The first pass of `d_weight` (see the `column_sums` module): for the
/// chunk `CUBE_POS_Y` of `chunk_rows` rows and the column tile
/// `CUBE_POS_X`, `partials[chunk * hidden + col]` = sum over the chunk's
/// rows of `dy * x * rstd`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn rms_norm_weight_partials_kernel<F: Float>(
    x: &Array<F>,
    rstd: &Array<f32>,
    dy: &Array<F>,
    partials: &mut Array<f32>,
    rows: u32,
    hidden: u32,
    chunk_rows: u32,
    #[comptime] round_bf16: bool,
) {
    let hidden = hidden as usize;
    let at = chunk_column(rows, chunk_rows);
    let (chunk, col) = (at.chunk, at.col);
    let mut scratch = SharedMemory::<f32>::new((PARAM_TILE_COLS * PARAM_ROW_LANES) as usize);

    let mut acc = 0.0f32;
    if col < hidden {
        let mut row = at.start + UNIT_POS_Y as usize;
        while row < at.end {
            let i = row * hidden + col;
            acc += load::<F>(dy[i], round_bf16) * load::<F>(x[i], round_bf16) * rstd[row];
            row += CUBE_DIM_Y as usize;
        }
    }
    let total = lane_sum(&mut scratch, acc);
    if col < hidden && UNIT_POS_Y == 0 {
        partials[chunk * hidden + col] = total;
    }
}

/// RMSNorm forward on f32 buffers: [`rms_norm_forward_typed`] with
/// [`FloatDtype::F32`].
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_forward<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Handle,
    weight: &Handle,
    y: &Handle,
    rstd: &Handle,
    rows: usize,
    hidden: usize,
    eps: f32,
) -> Result<(), ShapeError> {
    rms_norm_forward_typed(
        client,
        FloatDtype::F32,
        x,
        weight,
        y,
        rstd,
        rows,
        hidden,
        eps,
    )
}

/// RMSNorm forward over the rows of `x: [rows, hidden]` (row-major).
///
/// Writes `y: [rows, hidden]` and the per-row reciprocal RMS
/// `rstd: [rows]` = `1 / sqrt(mean(x^2) + eps)`, which
/// [`rms_norm_backward_typed`] needs. `weight: [hidden]`. `x`, `weight` and
/// `y` hold `dtype`; `rstd` is always f32 (a statistic, kept at the
/// precision it is computed in). Sums in f32; `y` is rounded once to
/// `dtype`. `y` must not alias `x`.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_forward_typed<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    x: &Handle,
    weight: &Handle,
    y: &Handle,
    rstd: &Handle,
    rows: usize,
    hidden: usize,
    eps: f32,
) -> Result<(), ShapeError> {
    const OP: &str = "rms_norm_forward";
    let n = rows * hidden;
    check_buffers(
        OP,
        client,
        dtype,
        rows,
        hidden,
        &[("x", x, n), ("weight", weight, hidden), ("y", y, n)],
        &[("rstd", rstd, rows)],
    )?;
    with_storage!(dtype, F, round_bf16, {
        // SAFETY: buffer sizes checked above; the kernel guards rows and
        // columns.
        unsafe {
            rms_norm_forward_kernel::launch_unchecked::<F, R>(
                client,
                row_cubes(client, rows),
                CubeDim::new_2d(NORM_UNITS_PER_ROW, NORM_ROWS_PER_CUBE),
                ArrayArg::from_raw_parts(x.clone(), n),
                ArrayArg::from_raw_parts(weight.clone(), hidden),
                ArrayArg::from_raw_parts(y.clone(), n),
                ArrayArg::from_raw_parts(rstd.clone(), rows),
                rows as u32,
                hidden as u32,
                eps,
                round_bf16,
            );
        }
    });
    Ok(())
}

/// RMSNorm backward on f32 buffers: [`rms_norm_backward_typed`] with
/// [`FloatDtype::F32`].
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_backward<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Handle,
    weight: &Handle,
    rstd: &Handle,
    dy: &Handle,
    dx: &Handle,
    d_weight: &Handle,
    rows: usize,
    hidden: usize,
) -> Result<(), ShapeError> {
    rms_norm_backward_typed(
        client,
        FloatDtype::F32,
        x,
        weight,
        rstd,
        dy,
        dx,
        d_weight,
        rows,
        hidden,
    )
}

/// RMSNorm backward: from `dy: [rows, hidden]` and the forward's `x`,
/// `weight` and `rstd`, writes `dx: [rows, hidden]` and
/// `d_weight: [hidden]` (summed over rows in two passes through an f32
/// workspace `[chunks, hidden]` allocated here, in an order fixed by the
/// shapes: see the `column_sums` module).
///
/// Every buffer holds `dtype` except `rstd` (f32, as the forward wrote
/// it). Sums in f32; `dx` and `d_weight` are rounded once to `dtype`. `dx`
/// and `d_weight` must not alias the inputs.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_backward_typed<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    x: &Handle,
    weight: &Handle,
    rstd: &Handle,
    dy: &Handle,
    dx: &Handle,
    d_weight: &Handle,
    rows: usize,
    hidden: usize,
) -> Result<(), ShapeError> {
    const OP: &str = "rms_norm_backward";
    let n = rows * hidden;
    check_buffers(
        OP,
        client,
        dtype,
        rows,
        hidden,
        &[
            ("x", x, n),
            ("weight", weight, hidden),
            ("dy", dy, n),
            ("dx", dx, n),
            ("d_weight", d_weight, hidden),
        ],
        &[("rstd", rstd, rows)],
    )?;
    let cut = ParamChunks::new(rows, hidden);
    let partials = cut.workspace(client, hidden);
    with_storage!(dtype, F, round_bf16, {
        // SAFETY: buffer sizes checked above, the workspace sized by `cut`;
        // the kernels guard rows and columns.
        unsafe {
            rms_norm_backward_dx_kernel::launch_unchecked::<F, R>(
                client,
                row_cubes(client, rows),
                CubeDim::new_2d(NORM_UNITS_PER_ROW, NORM_ROWS_PER_CUBE),
                ArrayArg::from_raw_parts(x.clone(), n),
                ArrayArg::from_raw_parts(weight.clone(), hidden),
                ArrayArg::from_raw_parts(rstd.clone(), rows),
                ArrayArg::from_raw_parts(dy.clone(), n),
                ArrayArg::from_raw_parts(dx.clone(), n),
                rows as u32,
                hidden as u32,
                round_bf16,
            );
            rms_norm_weight_partials_kernel::launch_unchecked::<F, R>(
                client,
                cut.cube_count(),
                cut.cube_dim(),
                ArrayArg::from_raw_parts(x.clone(), n),
                ArrayArg::from_raw_parts(rstd.clone(), rows),
                ArrayArg::from_raw_parts(dy.clone(), n),
                ArrayArg::from_raw_parts(partials.clone(), cut.chunks * hidden),
                rows as u32,
                hidden as u32,
                cut.chunk_rows as u32,
                round_bf16,
            );
            params::finish::<F, R>(client, &cut, &partials, d_weight, hidden, round_bf16);
        }
    });
    Ok(())
}
