//! LayerNorm: `y = (x - mean) / sqrt(var + eps) * weight + bias` over the
//! last axis of `x: [rows, hidden]`, with the biased variance
//! (`var = mean((x - mean)^2)`, as PyTorch), `weight, bias: [hidden]`.

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
#[allow(clippy::too_many_arguments)]
fn layer_norm_forward_kernel<F: Float>(
    x: &Array<F>,
    weight: &Array<F>,
    bias: &Array<F>,
    y: &mut Array<F>,
    mean: &mut Array<f32>,
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
    let n = f32::cast_from(hidden);
    let mut scratch = SharedMemory::<f32>::new((NORM_UNITS_PER_ROW * NORM_ROWS_PER_CUBE) as usize);

    // Two passes over the row (mean, then centred squares) for accuracy.
    let mut sum = 0.0f32;
    let mut j = UNIT_POS_X as usize;
    while j < hidden {
        sum += load::<F>(x[base + j], round_bf16);
        j += CUBE_DIM_X as usize;
    }
    let mu = row_sum::<f32>(&mut scratch, sum) / n;

    let mut sum_sq = 0.0f32;
    let mut j = UNIT_POS_X as usize;
    while j < hidden {
        let d = load::<F>(x[base + j], round_bf16) - mu;
        sum_sq += d * d;
        j += CUBE_DIM_X as usize;
    }
    let r = 1.0f32 / (row_sum::<f32>(&mut scratch, sum_sq) / n + eps).sqrt();

    if live {
        let mut j = UNIT_POS_X as usize;
        while j < hidden {
            y[base + j] = store::<F>(
                (load::<F>(x[base + j], round_bf16) - mu) * r * load::<F>(weight[j], round_bf16)
                    + load::<F>(bias[j], round_bf16),
                round_bf16,
            );
            j += CUBE_DIM_X as usize;
        }
        if UNIT_POS_X == 0 {
            mean[row] = mu;
            rstd[row] = r;
        }
    }
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn layer_norm_backward_dx_kernel<F: Float>(
    x: &Array<F>,
    weight: &Array<F>,
    mean: &Array<f32>,
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
    let n = f32::cast_from(hidden);
    let mu = mean[row];
    let r = rstd[row];
    let mut scratch = SharedMemory::<f32>::new((NORM_UNITS_PER_ROW * NORM_ROWS_PER_CUBE) as usize);

    // With g = dy * w and xhat = (x - mean) * rstd:
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
    let mut sum_g = 0.0f32;
    let mut sum_g_xhat = 0.0f32;
    let mut j = UNIT_POS_X as usize;
    while j < hidden {
        let g = load::<F>(dy[base + j], round_bf16) * load::<F>(weight[j], round_bf16);
        sum_g += g;
        sum_g_xhat += g * (load::<F>(x[base + j], round_bf16) - mu) * r;
        j += CUBE_DIM_X as usize;
    }
    let mean_g = row_sum::<f32>(&mut scratch, sum_g) / n;
    let mean_g_xhat = row_sum::<f32>(&mut scratch, sum_g_xhat) / n;

    if live {
        let mut j = UNIT_POS_X as usize;
        while j < hidden {
            let g = load::<F>(dy[base + j], round_bf16) * load::<F>(weight[j], round_bf16);
            let xhat = (load::<F>(x[base + j], round_bf16) - mu) * r;
            dx[base + j] = store::<F>(r * (g - mean_g - xhat * mean_g_xhat), round_bf16);
            j += CUBE_DIM_X as usize;
        }
    }
}

/// The first pass of `d_weight` and `d_bias` (see the `column_sums`
/// module): for the chunk `CUBE_POS_Y` of `chunk_rows` rows and the column
/// tile `CUBE_POS_X`, `partials_w[chunk * hidden + col]` = sum over the
/// chunk's rows of `dy * (x - mean) * rstd` and `partials_b[...]` that of
/// `dy`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn layer_norm_params_partials_kernel<F: Float>(
    x: &Array<F>,
    mean: &Array<f32>,
    rstd: &Array<f32>,
    dy: &Array<F>,
    partials_w: &mut Array<f32>,
    partials_b: &mut Array<f32>,
    rows: u32,
    hidden: u32,
    chunk_rows: u32,
    #[comptime] round_bf16: bool,
) {
    let hidden = hidden as usize;
    let at = chunk_column(rows, chunk_rows);
    let (chunk, col) = (at.chunk, at.col);
    let mut scratch = SharedMemory::<f32>::new((PARAM_TILE_COLS * PARAM_ROW_LANES) as usize);

    let mut acc_w = 0.0f32;
    let mut acc_b = 0.0f32;
    if col < hidden {
        let mut row = at.start + UNIT_POS_Y as usize;
        while row < at.end {
            let i = row * hidden + col;
            let g = load::<F>(dy[i], round_bf16);
            acc_w += g * (load::<F>(x[i], round_bf16) - mean[row]) * rstd[row];
            acc_b += g;
            row += CUBE_DIM_Y as usize;
        }
    }
    let total_w = lane_sum(&mut scratch, acc_w);
    let total_b = lane_sum(&mut scratch, acc_b);
    if col < hidden && UNIT_POS_Y == 0 {
        partials_w[chunk * hidden + col] = total_w;
        partials_b[chunk * hidden + col] = total_b;
    }
}

/// LayerNorm forward on f32 buffers: [`layer_norm_forward_typed`] with
/// [`FloatDtype::F32`].
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_forward<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Handle,
    weight: &Handle,
    bias: &Handle,
    y: &Handle,
    mean: &Handle,
    rstd: &Handle,
    rows: usize,
    hidden: usize,
    eps: f32,
) -> Result<(), ShapeError> {
    layer_norm_forward_typed(
        client,
        FloatDtype::F32,
        x,
        weight,
        bias,
        y,
        mean,
        rstd,
        rows,
        hidden,
        eps,
    )
}

/// LayerNorm forward over the rows of `x: [rows, hidden]` (row-major).
///
/// Writes `y: [rows, hidden]`, and per row `mean: [rows]` and
/// `rstd: [rows]` = `1 / sqrt(var + eps)` for [`layer_norm_backward_typed`].
/// `weight, bias: [hidden]`. `x`, `weight`, `bias` and `y` hold `dtype`;
/// `mean` and `rstd` are always f32 (statistics, kept at the precision they
/// are computed in). Sums in f32; `y` is rounded once to `dtype`. `y` must
/// not alias `x`.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_forward_typed<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    x: &Handle,
    weight: &Handle,
    bias: &Handle,
    y: &Handle,
    mean: &Handle,
    rstd: &Handle,
    rows: usize,
    hidden: usize,
    eps: f32,
) -> Result<(), ShapeError> {
    const OP: &str = "layer_norm_forward";
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
            ("bias", bias, hidden),
            ("y", y, n),
        ],
        &[("mean", mean, rows), ("rstd", rstd, rows)],
    )?;
    with_storage!(dtype, F, round_bf16, {
        // SAFETY: buffer sizes checked above; the kernel guards rows and
        // columns.
        unsafe {
            layer_norm_forward_kernel::launch_unchecked::<F, R>(
                client,
                row_cubes(client, rows),
                CubeDim::new_2d(NORM_UNITS_PER_ROW, NORM_ROWS_PER_CUBE),
                ArrayArg::from_raw_parts(x.clone(), n),
                ArrayArg::from_raw_parts(weight.clone(), hidden),
                ArrayArg::from_raw_parts(bias.clone(), hidden),
                ArrayArg::from_raw_parts(y.clone(), n),
                ArrayArg::from_raw_parts(mean.clone(), rows),
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

/// LayerNorm backward on f32 buffers: [`layer_norm_backward_typed`] with
/// [`FloatDtype::F32`].
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_backward<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Handle,
    weight: &Handle,
    mean: &Handle,
    rstd: &Handle,
    dy: &Handle,
    dx: &Handle,
    d_weight: &Handle,
    d_bias: &Handle,
    rows: usize,
    hidden: usize,
) -> Result<(), ShapeError> {
    layer_norm_backward_typed(
        client,
        FloatDtype::F32,
        x,
        weight,
        mean,
        rstd,
        dy,
        dx,
        d_weight,
        d_bias,
        rows,
        hidden,
    )
}

/// LayerNorm backward: from `dy: [rows, hidden]` and the forward's `x`,
/// `weight`, `mean` and `rstd`, writes `dx: [rows, hidden]` and
/// `d_weight, d_bias: [hidden]` (summed over rows in two passes through
/// two f32 workspaces `[chunks, hidden]` allocated here, in an order fixed
/// by the shapes: see the `column_sums` module).
///
/// Every buffer holds `dtype` except `mean` and `rstd` (f32, as the forward
/// wrote them). Sums in f32; the gradients are rounded once to `dtype`. The
/// outputs must not alias the inputs.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_backward_typed<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    x: &Handle,
    weight: &Handle,
    mean: &Handle,
    rstd: &Handle,
    dy: &Handle,
    dx: &Handle,
    d_weight: &Handle,
    d_bias: &Handle,
    rows: usize,
    hidden: usize,
) -> Result<(), ShapeError> {
    const OP: &str = "layer_norm_backward";
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
            ("d_bias", d_bias, hidden),
        ],
        &[("mean", mean, rows), ("rstd", rstd, rows)],
    )?;
    let cut = ParamChunks::new(rows, hidden);
    let (partials_w, partials_b) = (cut.workspace(client, hidden), cut.workspace(client, hidden));
    with_storage!(dtype, F, round_bf16, {
        // SAFETY: buffer sizes checked above, the workspaces sized by
        // `cut`; the kernels guard rows and columns.
        unsafe {
            layer_norm_backward_dx_kernel::launch_unchecked::<F, R>(
                client,
                row_cubes(client, rows),
                CubeDim::new_2d(NORM_UNITS_PER_ROW, NORM_ROWS_PER_CUBE),
                ArrayArg::from_raw_parts(x.clone(), n),
                ArrayArg::from_raw_parts(weight.clone(), hidden),
                ArrayArg::from_raw_parts(mean.clone(), rows),
                ArrayArg::from_raw_parts(rstd.clone(), rows),
                ArrayArg::from_raw_parts(dy.clone(), n),
                ArrayArg::from_raw_parts(dx.clone(), n),
                rows as u32,
                hidden as u32,
                round_bf16,
            );
            layer_norm_params_partials_kernel::launch_unchecked::<F, R>(
                client,
                cut.cube_count(),
                cut.cube_dim(),
                ArrayArg::from_raw_parts(x.clone(), n),
                ArrayArg::from_raw_parts(mean.clone(), rows),
                ArrayArg::from_raw_parts(rstd.clone(), rows),
                ArrayArg::from_raw_parts(dy.clone(), n),
                ArrayArg::from_raw_parts(partials_w.clone(), cut.chunks * hidden),
                ArrayArg::from_raw_parts(partials_b.clone(), cut.chunks * hidden),
                rows as u32,
                hidden as u32,
                cut.chunk_rows as u32,
                round_bf16,
            );
            params::finish::<F, R>(client, &cut, &partials_w, d_weight, hidden, round_bf16);
            params::finish::<F, R>(client, &cut, &partials_b, d_bias, hidden, round_bf16);
        }
    });
    Ok(())
}
