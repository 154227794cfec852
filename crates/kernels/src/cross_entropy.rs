//! Fused softmax cross-entropy over a large vocabulary that never
//! materialises the probability tensor.
//!
//! For logits `[rows, vocab]` (f32, row-major) and targets `[rows]` (u32):
//!
//! 1. one cube per row makes a single online pass over the vocabulary for
//!    the running max and the sum of `exp(logit - max)` (f32), and keeps
//!    the row's log-sum-exp `lse` and loss `lse - logit[target]`;
//! 2. one cube sums the row losses and counts the rows that are not ignored
//!    (deterministic tree, no atomics) into the mean loss;
//! 3. one cube per row overwrites the logits with the gradient of
//!    `grad_scale * mean loss`:
//!    `(exp(logit - lse) - onehot(target)) * grad_scale / valid_rows`.
//!
//! Rows whose target is [`IGNORE_INDEX`] (or any value `>= vocab`) are
//! ignored: their loss is 0, they are left out of the mean, and their
//! gradient row is 0. The only memory beyond the inputs and outputs is two
//! f32 per row.

use crate::check::{self, ShapeError};
use crate::reduce::{cube_max_sum_exp, cube_sum, ROW_CUBE_DIM};
use cubecl::prelude::*;
use cubecl::server::Handle;

/// Target value that marks a row as ignored (PyTorch's `-100` becomes this
/// when the targets are stored as u32).
pub const IGNORE_INDEX: u32 = u32::MAX;

#[cube(launch_unchecked)]
fn cross_entropy_rows_kernel<F: Float>(
    logits: &Array<F>,
    targets: &Array<u32>,
    row_loss: &mut Array<F>,
    lse: &mut Array<F>,
    rows: u32,
    vocab: u32,
) {
    let row = CUBE_POS;
    if row >= rows as usize {
        terminate!();
    }
    let vocab_len = vocab as usize;
    let base = row * vocab_len;
    let mut max_scratch = SharedMemory::<F>::new(ROW_CUBE_DIM as usize);
    let mut sum_scratch = SharedMemory::<F>::new(ROW_CUBE_DIM as usize);

    // Online max and sum of exp(x - max) over this unit's strided columns.
    // F::min_value() stands for -inf (WGSL has no infinite literal).
    let mut m = F::min_value();
    let mut s = F::new(0.0);
    let mut j = UNIT_POS as usize;
    while j < vocab_len {
        let v = logits[base + j];
        if v > m {
            s = s * (m - v).exp() + F::new(1.0);
            m = v;
        } else {
            s += (v - m).exp();
        }
        j += CUBE_DIM as usize;
    }
    let (row_max, row_sum) = cube_max_sum_exp::<F>(&mut max_scratch, &mut sum_scratch, m, s);

    if UNIT_POS == 0 {
        let row_lse = row_max + row_sum.ln();
        lse[row] = row_lse;
        let target = targets[row];
        let mut loss = F::new(0.0);
        if target < vocab {
            loss = row_lse - logits[base + target as usize];
        }
        row_loss[row] = loss;
    }
}

#[cube(launch_unchecked)]
fn cross_entropy_mean_kernel<F: Float>(
    row_loss: &Array<F>,
    targets: &Array<u32>,
    mean_loss: &mut Array<F>,
    valid_rows: &mut Array<F>,
    rows: u32,
    vocab: u32,
) {
    let mut scratch = SharedMemory::<F>::new(ROW_CUBE_DIM as usize);
    let mut sum = F::new(0.0);
    let mut count = F::new(0.0);
    let mut r = UNIT_POS as usize;
    while r < rows as usize {
        sum += row_loss[r];
        if targets[r] < vocab {
            count += F::new(1.0);
        }
        r += CUBE_DIM as usize;
    }
    let sum = cube_sum::<F>(&mut scratch, sum);
    let count = cube_sum::<F>(&mut scratch, count);
    if UNIT_POS == 0 {
        mean_loss[0] = sum / count.max(F::new(1.0));
        valid_rows[0] = count;
    }
}

#[cube(launch_unchecked)]
fn cross_entropy_grad_kernel<F: Float>(
    logits: &mut Array<F>,
    targets: &Array<u32>,
    lse: &Array<F>,
    valid_rows: &Array<F>,
    rows: u32,
    vocab: u32,
    grad_scale: f32,
) {
    let grad_scale = F::cast_from(grad_scale);
    let row = CUBE_POS;
    if row >= rows as usize {
        terminate!();
    }
    let vocab_len = vocab as usize;
    let base = row * vocab_len;
    let target = targets[row];
    let mut scale = F::new(0.0);
    if target < vocab {
        scale = grad_scale / valid_rows[0].max(F::new(1.0));
    }
    let row_lse = lse[row];
    let mut j = UNIT_POS as usize;
    while j < vocab_len {
        let mut g = (logits[base + j] - row_lse).exp();
        if j == target as usize {
            g -= F::new(1.0);
        }
        logits[base + j] = g * scale;
        j += CUBE_DIM as usize;
    }
}

/// Mean softmax cross-entropy of `logits: [rows, vocab]` (f32) against
/// `targets: [rows]` (u32 class ids, [`IGNORE_INDEX`] to skip a row), and
/// its gradient, written over the logits.
///
/// Outputs: `row_loss: [rows]` (natural-log loss per row, 0 for ignored
/// rows), `mean_loss: [1]` (sum of row losses / number of non-ignored rows,
/// 0 if there are none), and `logits` overwritten by
/// `d(grad_scale * mean_loss) / d logits` (pass `grad_scale = 1.0` for the
/// gradient of the mean; it is the upstream gradient of the loss).
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_forward_backward<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &Handle,
    targets: &Handle,
    row_loss: &Handle,
    mean_loss: &Handle,
    rows: usize,
    vocab: usize,
    grad_scale: f32,
) -> Result<(), ShapeError> {
    const OP: &str = "cross_entropy_forward_backward";
    check::nonzero(OP, "rows", rows)?;
    check::nonzero(OP, "vocab", vocab)?;
    // Kernel indices into the logits are u32 on wgpu; this also keeps
    // `vocab < IGNORE_INDEX`, so IGNORE_INDEX is never a valid class.
    check::fits_u32(OP, "rows * vocab", rows * vocab)?;
    check::elems_4b(OP, "logits", logits, rows * vocab)?;
    check::elems_4b(OP, "targets", targets, rows)?;
    check::elems_4b(OP, "row_loss", row_loss, rows)?;
    check::elems_4b(OP, "mean_loss", mean_loss, 1)?;
    let lse = client.empty(rows * 4);
    let valid_rows = client.empty(4);
    let row_cubes = cubecl::calculate_cube_count_elemwise(client, rows, CubeDim::new_1d(1));
    let cube_dim = CubeDim::new_1d(ROW_CUBE_DIM);
    let n = rows * vocab;
    // SAFETY: buffer sizes checked above (`lse` and `valid_rows` allocated
    // here); the kernels guard rows and columns, and read a logit only at a
    // target `< vocab`.
    unsafe {
        cross_entropy_rows_kernel::launch_unchecked::<f32, R>(
            client,
            row_cubes.clone(),
            cube_dim,
            ArrayArg::from_raw_parts(logits.clone(), n),
            ArrayArg::from_raw_parts(targets.clone(), rows),
            ArrayArg::from_raw_parts(row_loss.clone(), rows),
            ArrayArg::from_raw_parts(lse.clone(), rows),
            rows as u32,
            vocab as u32,
        );
        cross_entropy_mean_kernel::launch_unchecked::<f32, R>(
            client,
            CubeCount::new_single(),
            cube_dim,
            ArrayArg::from_raw_parts(row_loss.clone(), rows),
            ArrayArg::from_raw_parts(targets.clone(), rows),
            ArrayArg::from_raw_parts(mean_loss.clone(), 1),
            ArrayArg::from_raw_parts(valid_rows.clone(), 1),
            rows as u32,
            vocab as u32,
        );
        cross_entropy_grad_kernel::launch_unchecked::<f32, R>(
            client,
            row_cubes,
            cube_dim,
            ArrayArg::from_raw_parts(logits.clone(), n),
            ArrayArg::from_raw_parts(targets.clone(), rows),
            ArrayArg::from_raw_parts(lse, rows),
            ArrayArg::from_raw_parts(valid_rows, 1),
            rows as u32,
            vocab as u32,
            grad_scale,
        );
    }
    Ok(())
}
