//! LayerNorm: `y = (x - mean) / sqrt(var + eps) * weight + bias` over the
//! last axis of `x: [rows, hidden]`, with the biased variance
//! (`var = mean((x - mean)^2)`, as PyTorch), `weight, bias: [hidden]`.

use super::check_buffers;
use crate::check::ShapeError;
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
    mean: &mut Array<F>,
    rstd: &mut Array<F>,
    rows: u32,
    hidden: u32,
    eps: f32,
) {
    let eps = F::cast_from(eps);
    // Rows past `rows` in the last cube compute on a copy of the last row
    // and write nothing (every unit must reach the barriers).
    let row = CUBE_POS * CUBE_DIM_Y as usize + UNIT_POS_Y as usize;
    let live = row < rows as usize;
    let row = min(row, rows as usize - 1);
    let hidden = hidden as usize;
    let base = row * hidden;
    let n = F::cast_from(hidden);
    let mut scratch = SharedMemory::<F>::new((NORM_UNITS_PER_ROW * NORM_ROWS_PER_CUBE) as usize);

    // Two passes over the row (mean, then centred squares) for accuracy.
    let mut sum = F::new(0.0);
    let mut j = UNIT_POS_X as usize;
    while j < hidden {
        sum += x[base + j];
        j += CUBE_DIM_X as usize;
    }
    let mu = row_sum::<F>(&mut scratch, sum) / n;

    let mut sum_sq = F::new(0.0);
    let mut j = UNIT_POS_X as usize;
    while j < hidden {
        let d = x[base + j] - mu;
        sum_sq += d * d;
        j += CUBE_DIM_X as usize;
    }
    let r = F::new(1.0) / (row_sum::<F>(&mut scratch, sum_sq) / n + eps).sqrt();

    if live {
        let mut j = UNIT_POS_X as usize;
        while j < hidden {
            y[base + j] = (x[base + j] - mu) * r * weight[j] + bias[j];
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
    mean: &Array<F>,
    rstd: &Array<F>,
    dy: &Array<F>,
    dx: &mut Array<F>,
    rows: u32,
    hidden: u32,
) {
    // Rows past `rows` in the last cube compute on a copy of the last row
    // and write nothing (every unit must reach the barriers).
    let row = CUBE_POS * CUBE_DIM_Y as usize + UNIT_POS_Y as usize;
    let live = row < rows as usize;
    let row = min(row, rows as usize - 1);
    let hidden = hidden as usize;
    let base = row * hidden;
    let n = F::cast_from(hidden);
    let mu = mean[row];
    let r = rstd[row];
    let mut scratch = SharedMemory::<F>::new((NORM_UNITS_PER_ROW * NORM_ROWS_PER_CUBE) as usize);

    // With g = dy * w and xhat = (x - mean) * rstd:
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
    let mut sum_g = F::new(0.0);
    let mut sum_g_xhat = F::new(0.0);
    let mut j = UNIT_POS_X as usize;
    while j < hidden {
        let g = dy[base + j] * weight[j];
        sum_g += g;
        sum_g_xhat += g * (x[base + j] - mu) * r;
        j += CUBE_DIM_X as usize;
    }
    let mean_g = row_sum::<F>(&mut scratch, sum_g) / n;
    let mean_g_xhat = row_sum::<F>(&mut scratch, sum_g_xhat) / n;

    if live {
        let mut j = UNIT_POS_X as usize;
        while j < hidden {
            let g = dy[base + j] * weight[j];
            let xhat = (x[base + j] - mu) * r;
            dx[base + j] = r * (g - mean_g - xhat * mean_g_xhat);
            j += CUBE_DIM_X as usize;
        }
    }
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn layer_norm_backward_params_kernel<F: Float>(
    x: &Array<F>,
    mean: &Array<F>,
    rstd: &Array<F>,
    dy: &Array<F>,
    d_weight: &mut Array<F>,
    d_bias: &mut Array<F>,
    rows: u32,
    hidden: u32,
) {
    let col = ABSOLUTE_POS;
    let hidden = hidden as usize;
    if col < hidden {
        let mut acc_w = F::new(0.0);
        let mut acc_b = F::new(0.0);
        for row in 0..rows as usize {
            let i = row * hidden + col;
            acc_w += dy[i] * (x[i] - mean[row]) * rstd[row];
            acc_b += dy[i];
        }
        d_weight[col] = acc_w;
        d_bias[col] = acc_b;
    }
}

/// LayerNorm forward over the rows of `x: [rows, hidden]` (row-major f32).
///
/// Writes `y: [rows, hidden]`, and per row `mean: [rows]` and
/// `rstd: [rows]` = `1 / sqrt(var + eps)` for [`layer_norm_backward`].
/// `weight, bias: [hidden]`. `y` must not alias `x`.
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
    let n = rows * hidden;
    check_buffers(
        "layer_norm_forward",
        rows,
        hidden,
        &[
            ("x", x, n),
            ("weight", weight, hidden),
            ("bias", bias, hidden),
            ("y", y, n),
            ("mean", mean, rows),
            ("rstd", rstd, rows),
        ],
    )?;
    // SAFETY: buffer sizes checked above; the kernel guards rows and columns.
    unsafe {
        layer_norm_forward_kernel::launch_unchecked::<f32, R>(
            client,
            cubecl::calculate_cube_count_elemwise(
                client,
                rows.div_ceil(NORM_ROWS_PER_CUBE as usize),
                CubeDim::new_1d(1),
            ),
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
        );
    }
    Ok(())
}

/// LayerNorm backward: from `dy: [rows, hidden]` and the forward's `x`,
/// `weight`, `mean` and `rstd`, writes `dx: [rows, hidden]` and
/// `d_weight, d_bias: [hidden]` (summed over rows, in row order).
///
/// The outputs must not alias the inputs.
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
    let n = rows * hidden;
    check_buffers(
        "layer_norm_backward",
        rows,
        hidden,
        &[
            ("x", x, n),
            ("weight", weight, hidden),
            ("mean", mean, rows),
            ("rstd", rstd, rows),
            ("dy", dy, n),
            ("dx", dx, n),
            ("d_weight", d_weight, hidden),
            ("d_bias", d_bias, hidden),
        ],
    )?;
    let col_dim = CubeDim::new_1d(NORM_UNITS_PER_ROW * NORM_ROWS_PER_CUBE);
    // SAFETY: buffer sizes checked above; the kernels guard rows and columns.
    unsafe {
        layer_norm_backward_dx_kernel::launch_unchecked::<f32, R>(
            client,
            cubecl::calculate_cube_count_elemwise(
                client,
                rows.div_ceil(NORM_ROWS_PER_CUBE as usize),
                CubeDim::new_1d(1),
            ),
            CubeDim::new_2d(NORM_UNITS_PER_ROW, NORM_ROWS_PER_CUBE),
            ArrayArg::from_raw_parts(x.clone(), n),
            ArrayArg::from_raw_parts(weight.clone(), hidden),
            ArrayArg::from_raw_parts(mean.clone(), rows),
            ArrayArg::from_raw_parts(rstd.clone(), rows),
            ArrayArg::from_raw_parts(dy.clone(), n),
            ArrayArg::from_raw_parts(dx.clone(), n),
            rows as u32,
            hidden as u32,
        );
        layer_norm_backward_params_kernel::launch_unchecked::<f32, R>(
            client,
            cubecl::calculate_cube_count_elemwise(client, hidden, col_dim),
            col_dim,
            ArrayArg::from_raw_parts(x.clone(), n),
            ArrayArg::from_raw_parts(mean.clone(), rows),
            ArrayArg::from_raw_parts(rstd.clone(), rows),
            ArrayArg::from_raw_parts(dy.clone(), n),
            ArrayArg::from_raw_parts(d_weight.clone(), hidden),
            ArrayArg::from_raw_parts(d_bias.clone(), hidden),
            rows as u32,
            hidden as u32,
        );
    }
    Ok(())
}
