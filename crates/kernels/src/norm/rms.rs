//! RMSNorm as in Llama: `y = x / sqrt(mean(x^2) + eps) * weight`, over the
//! last axis of `x: [rows, hidden]`, with `weight: [hidden]`.

use super::check_buffers;
use crate::check::ShapeError;
use crate::reduce::{row_sum, NORM_ROWS_PER_CUBE, NORM_UNITS_PER_ROW};
use cubecl::prelude::*;
use cubecl::server::Handle;

#[cube(launch_unchecked)]
fn rms_norm_forward_kernel<F: Float>(
    x: &Array<F>,
    weight: &Array<F>,
    y: &mut Array<F>,
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
    let mut scratch = SharedMemory::<F>::new((NORM_UNITS_PER_ROW * NORM_ROWS_PER_CUBE) as usize);

    let mut sum_sq = F::new(0.0);
    let mut j = UNIT_POS_X as usize;
    while j < hidden {
        let v = x[base + j];
        sum_sq += v * v;
        j += CUBE_DIM_X as usize;
    }
    let sum_sq = row_sum::<F>(&mut scratch, sum_sq);
    let r = F::new(1.0) / (sum_sq / F::cast_from(hidden) + eps).sqrt();

    if live {
        let mut j = UNIT_POS_X as usize;
        while j < hidden {
            y[base + j] = x[base + j] * r * weight[j];
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
    let r = rstd[row];
    let mut scratch = SharedMemory::<F>::new((NORM_UNITS_PER_ROW * NORM_ROWS_PER_CUBE) as usize);

    // dot = sum_k dy_k * w_k * x_k
    let mut dot = F::new(0.0);
    let mut j = UNIT_POS_X as usize;
    while j < hidden {
        dot += dy[base + j] * weight[j] * x[base + j];
        j += CUBE_DIM_X as usize;
    }
    let dot = row_sum::<F>(&mut scratch, dot);
    // dx_j = r * dy_j * w_j - r^3 / hidden * x_j * dot
    let c = r * r * r * dot / F::cast_from(hidden);

    if live {
        let mut j = UNIT_POS_X as usize;
        while j < hidden {
            dx[base + j] = r * dy[base + j] * weight[j] - c * x[base + j];
            j += CUBE_DIM_X as usize;
        }
    }
}

#[cube(launch_unchecked)]
fn rms_norm_backward_weight_kernel<F: Float>(
    x: &Array<F>,
    rstd: &Array<F>,
    dy: &Array<F>,
    d_weight: &mut Array<F>,
    rows: u32,
    hidden: u32,
) {
    let col = ABSOLUTE_POS;
    let hidden = hidden as usize;
    if col < hidden {
        let mut acc = F::new(0.0);
        for row in 0..rows as usize {
            let i = row * hidden + col;
            acc += dy[i] * x[i] * rstd[row];
        }
        d_weight[col] = acc;
    }
}

/// RMSNorm forward over the rows of `x: [rows, hidden]` (row-major f32).
///
/// Writes `y: [rows, hidden]` and the per-row reciprocal RMS
/// `rstd: [rows]` = `1 / sqrt(mean(x^2) + eps)`, which
/// [`rms_norm_backward`] needs. `weight: [hidden]`. `y` must not alias `x`.
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
    let n = rows * hidden;
    check_buffers(
        "rms_norm_forward",
        rows,
        hidden,
        &[
            ("x", x, n),
            ("weight", weight, hidden),
            ("y", y, n),
            ("rstd", rstd, rows),
        ],
    )?;
    // SAFETY: buffer sizes checked above; the kernel guards rows and columns.
    unsafe {
        rms_norm_forward_kernel::launch_unchecked::<f32, R>(
            client,
            cubecl::calculate_cube_count_elemwise(
                client,
                rows.div_ceil(NORM_ROWS_PER_CUBE as usize),
                CubeDim::new_1d(1),
            ),
            CubeDim::new_2d(NORM_UNITS_PER_ROW, NORM_ROWS_PER_CUBE),
            ArrayArg::from_raw_parts(x.clone(), n),
            ArrayArg::from_raw_parts(weight.clone(), hidden),
            ArrayArg::from_raw_parts(y.clone(), n),
            ArrayArg::from_raw_parts(rstd.clone(), rows),
            rows as u32,
            hidden as u32,
            eps,
        );
    }
    Ok(())
}

/// RMSNorm backward: from `dy: [rows, hidden]` and the forward's `x`,
/// `weight` and `rstd`, writes `dx: [rows, hidden]` and
/// `d_weight: [hidden]` (summed over rows, in row order).
///
/// `dx` and `d_weight` must not alias the inputs.
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
    let n = rows * hidden;
    check_buffers(
        "rms_norm_backward",
        rows,
        hidden,
        &[
            ("x", x, n),
            ("weight", weight, hidden),
            ("rstd", rstd, rows),
            ("dy", dy, n),
            ("dx", dx, n),
            ("d_weight", d_weight, hidden),
        ],
    )?;
    let col_dim = CubeDim::new_1d(NORM_UNITS_PER_ROW * NORM_ROWS_PER_CUBE);
    // SAFETY: buffer sizes checked above; the kernels guard rows and columns.
    unsafe {
        rms_norm_backward_dx_kernel::launch_unchecked::<f32, R>(
            client,
            cubecl::calculate_cube_count_elemwise(
                client,
                rows.div_ceil(NORM_ROWS_PER_CUBE as usize),
                CubeDim::new_1d(1),
            ),
            CubeDim::new_2d(NORM_UNITS_PER_ROW, NORM_ROWS_PER_CUBE),
            ArrayArg::from_raw_parts(x.clone(), n),
            ArrayArg::from_raw_parts(weight.clone(), hidden),
            ArrayArg::from_raw_parts(rstd.clone(), rows),
            ArrayArg::from_raw_parts(dy.clone(), n),
            ArrayArg::from_raw_parts(dx.clone(), n),
            rows as u32,
            hidden as u32,
        );
        rms_norm_backward_weight_kernel::launch_unchecked::<f32, R>(
            client,
            cubecl::calculate_cube_count_elemwise(client, hidden, col_dim),
            col_dim,
            ArrayArg::from_raw_parts(x.clone(), n),
            ArrayArg::from_raw_parts(rstd.clone(), rows),
            ArrayArg::from_raw_parts(dy.clone(), n),
            ArrayArg::from_raw_parts(d_weight.clone(), hidden),
            rows as u32,
            hidden as u32,
        );
    }
    Ok(())
}
