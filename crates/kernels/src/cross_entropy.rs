//! Fused softmax cross-entropy over a large vocabulary that never
//! materialises the probability tensor.
//!
//! For logits `[rows, vocab]` (f32, f16 or bf16, [`FloatDtype`];
//! row-major) and targets `[rows]` (u32), computing in f32:
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
use crate::dtype::{load, store, with_storage, FloatDtype};
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
    row_loss: &mut Array<f32>,
    lse: &mut Array<f32>,
    rows: u32,
    vocab: u32,
    #[comptime] round_bf16: bool,
) {
    let row = CUBE_POS;
    if row >= rows as usize {
        terminate!();
    }
    let vocab_len = vocab as usize;
    let base = row * vocab_len;
    let mut max_scratch = SharedMemory::<f32>::new(ROW_CUBE_DIM as usize);
    let mut sum_scratch = SharedMemory::<f32>::new(ROW_CUBE_DIM as usize);

    // Online max and sum of exp(x - max) over this unit's strided columns.
    // f32::min_value() stands for -inf (WGSL has no infinite literal).
    let mut m = f32::min_value();
    let mut s = 0.0f32;
    let mut j = UNIT_POS as usize;
    while j < vocab_len {
        let v = load::<F>(logits[base + j], round_bf16);
        if v > m {
            s = s * (m - v).exp() + 1.0f32;
            m = v;
        } else {
            s += (v - m).exp();
        }
        j += CUBE_DIM as usize;
    }
    let (row_max, row_sum) = cube_max_sum_exp::<f32>(&mut max_scratch, &mut sum_scratch, m, s);

    if UNIT_POS == 0 {
        let row_lse = row_max + row_sum.ln();
        lse[row] = row_lse;
        let target = targets[row];
        let mut loss = 0.0f32;
        if target < vocab {
            loss = row_lse - load::<F>(logits[base + target as usize], round_bf16);
        }
        row_loss[row] = loss;
    }
}

#[cube(launch_unchecked)]
fn cross_entropy_mean_kernel(
    row_loss: &Array<f32>,
    targets: &Array<u32>,
    mean_loss: &mut Array<f32>,
    valid_rows: &mut Array<f32>,
    rows: u32,
    vocab: u32,
) {
    let mut scratch = SharedMemory::<f32>::new(ROW_CUBE_DIM as usize);
    let mut sum = 0.0f32;
    let mut count = 0.0f32;
    let mut r = UNIT_POS as usize;
    while r < rows as usize {
        sum += row_loss[r];
        if targets[r] < vocab {
            count += 1.0f32;
        }
        r += CUBE_DIM as usize;
    }
    let sum = cube_sum::<f32>(&mut scratch, sum);
    let count = cube_sum::<f32>(&mut scratch, count);
    if UNIT_POS == 0 {
        mean_loss[0] = sum / count.max(1.0f32);
        valid_rows[0] = count;
    }
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn cross_entropy_grad_kernel<F: Float>(
    logits: &mut Array<F>,
    targets: &Array<u32>,
    lse: &Array<f32>,
    valid_rows: &Array<f32>,
    rows: u32,
    vocab: u32,
    grad_scale: f32,
    #[comptime] round_bf16: bool,
) {
    let row = CUBE_POS;
    if row >= rows as usize {
        terminate!();
    }
    let vocab_len = vocab as usize;
    let base = row * vocab_len;
    let target = targets[row];
    let mut scale = 0.0f32;
    if target < vocab {
        scale = grad_scale / valid_rows[0].max(1.0f32);
    }
    let row_lse = lse[row];
    let mut j = UNIT_POS as usize;
    while j < vocab_len {
        let mut g = (load::<F>(logits[base + j], round_bf16) - row_lse).exp();
        if j == target as usize {
            g -= 1.0f32;
        }
        logits[base + j] = store::<F>(g * scale, round_bf16);
        j += CUBE_DIM as usize;
    }
}

/// Cross-entropy on f32 logits: [`cross_entropy_forward_backward_typed`]
/// with [`FloatDtype::F32`].
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
    cross_entropy_forward_backward_typed(
        client,
        FloatDtype::F32,
        logits,
        targets,
        row_loss,
        mean_loss,
        rows,
        vocab,
        grad_scale,
    )
}

/// Mean softmax cross-entropy of `logits: [rows, vocab]` (elements of
/// `dtype`) against `targets: [rows]` (u32 class ids, [`IGNORE_INDEX`] to
/// skip a row), and its gradient, written over the logits.
///
/// Outputs: `row_loss: [rows]` (natural-log loss per row, 0 for ignored
/// rows), `mean_loss: [1]` (sum of row losses / number of non-ignored rows,
/// 0 if there are none), both always f32 (a loss is a sum over the
/// vocabulary and the rows; 16 bits would round it to 2-3 digits), and
/// `logits` overwritten by `d(grad_scale * mean_loss) / d logits` (pass
/// `grad_scale = 1.0` for the gradient of the mean; it is the upstream
/// gradient of the loss), computed in f32 and rounded once to `dtype`.
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_forward_backward_typed<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    logits: &Handle,
    targets: &Handle,
    row_loss: &Handle,
    mean_loss: &Handle,
    rows: usize,
    vocab: usize,
    grad_scale: f32,
) -> Result<(), ShapeError> {
    const OP: &str = "cross_entropy_forward_backward";
    check_rows(OP, client, dtype, logits, targets, rows, vocab)?;
    check::elems_4b(OP, "row_loss", row_loss, rows)?;
    check::elems_4b(OP, "mean_loss", mean_loss, 1)?;
    let lse = client.empty(rows * 4);
    cross_entropy_rows_typed(client, dtype, logits, targets, row_loss, &lse, rows, vocab)?;
    let valid_rows = client.empty(4);
    // SAFETY: `row_loss` and `targets` were checked by the rows launcher,
    // `mean_loss` above; `valid_rows` is allocated here.
    unsafe {
        cross_entropy_mean_kernel::launch_unchecked::<R>(
            client,
            CubeCount::new_single(),
            CubeDim::new_1d(ROW_CUBE_DIM),
            ArrayArg::from_raw_parts(row_loss.clone(), rows),
            ArrayArg::from_raw_parts(targets.clone(), rows),
            ArrayArg::from_raw_parts(mean_loss.clone(), 1),
            ArrayArg::from_raw_parts(valid_rows.clone(), 1),
            rows as u32,
            vocab as u32,
        );
    }
    cross_entropy_grad_typed(
        client,
        dtype,
        logits,
        targets,
        &lse,
        &valid_rows,
        rows,
        vocab,
        grad_scale,
    )
}

/// The checks shared by the launchers: `dtype` runs on `client`, `rows`
/// and `vocab` are non-zero, the indices fit u32, and `logits` holds `rows
/// * vocab` elements of `dtype` and `targets` `rows` u32 ids.
fn check_rows<R: Runtime>(
    op: &'static str,
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    logits: &Handle,
    targets: &Handle,
    rows: usize,
    vocab: usize,
) -> Result<(), ShapeError> {
    check::dtype(op, client, dtype)?;
    check::nonzero(op, "rows", rows)?;
    check::nonzero(op, "vocab", vocab)?;
    // Kernel indices into the logits are u32 on wgpu; this also keeps
    // `vocab < IGNORE_INDEX`, so IGNORE_INDEX is never a valid class.
    check::fits_u32(op, "rows * vocab", rows * vocab)?;
    check::elems(op, "logits", logits, rows * vocab, dtype.size_bytes())?;
    check::elems_4b(op, "targets", targets, rows)
}

/// The forward of [`cross_entropy_forward_backward_typed`] alone, one cube
/// per row: each row's loss into `row_loss: [rows]` (0 for an ignored row)
/// and its log-sum-exp into `lse: [rows]` (both f32), the logits unchanged.
/// With [`cross_entropy_grad_typed`] it serves a caller that splits the
/// rows into blocks and divides by the kept rows of all blocks.
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_rows_typed<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    logits: &Handle,
    targets: &Handle,
    row_loss: &Handle,
    lse: &Handle,
    rows: usize,
    vocab: usize,
) -> Result<(), ShapeError> {
    const OP: &str = "cross_entropy_rows";
    check_rows(OP, client, dtype, logits, targets, rows, vocab)?;
    check::elems_4b(OP, "row_loss", row_loss, rows)?;
    check::elems_4b(OP, "lse", lse, rows)?;
    let row_cubes = cubecl::calculate_cube_count_elemwise(client, rows, CubeDim::new_1d(1));
    with_storage!(dtype, F, round_bf16, {
        // SAFETY: buffer sizes checked above; the kernel guards rows and
        // columns, and reads a logit only at a target `< vocab`.
        unsafe {
            cross_entropy_rows_kernel::launch_unchecked::<F, R>(
                client,
                row_cubes,
                CubeDim::new_1d(ROW_CUBE_DIM),
                ArrayArg::from_raw_parts(logits.clone(), rows * vocab),
                ArrayArg::from_raw_parts(targets.clone(), rows),
                ArrayArg::from_raw_parts(row_loss.clone(), rows),
                ArrayArg::from_raw_parts(lse.clone(), rows),
                rows as u32,
                vocab as u32,
                round_bf16,
            );
        }
    });
    Ok(())
}

/// The gradient of [`cross_entropy_forward_backward_typed`] alone, written
/// over `logits: [rows, vocab]` (elements of `dtype`): row `r` becomes
/// `(softmax(logits[r]) - onehot(targets[r])) * grad_scale / max(count, 1)`,
/// computed in f32 from the row's `lse` (of [`cross_entropy_rows_typed`])
/// and rounded once to `dtype`; an ignored row becomes 0. `count: [1]` (f32)
/// is the number of rows the mean loss divides by, which may span more rows
/// than this call's.
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_grad_typed<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    logits: &Handle,
    targets: &Handle,
    lse: &Handle,
    count: &Handle,
    rows: usize,
    vocab: usize,
    grad_scale: f32,
) -> Result<(), ShapeError> {
    const OP: &str = "cross_entropy_grad";
    check_rows(OP, client, dtype, logits, targets, rows, vocab)?;
    check::elems_4b(OP, "lse", lse, rows)?;
    check::elems_4b(OP, "count", count, 1)?;
    let row_cubes = cubecl::calculate_cube_count_elemwise(client, rows, CubeDim::new_1d(1));
    with_storage!(dtype, F, round_bf16, {
        // SAFETY: buffer sizes checked above; the kernel guards rows and
        // columns.
        unsafe {
            cross_entropy_grad_kernel::launch_unchecked::<F, R>(
                client,
                row_cubes,
                CubeDim::new_1d(ROW_CUBE_DIM),
                ArrayArg::from_raw_parts(logits.clone(), rows * vocab),
                ArrayArg::from_raw_parts(targets.clone(), rows),
                ArrayArg::from_raw_parts(lse.clone(), rows),
                ArrayArg::from_raw_parts(count.clone(), 1),
                rows as u32,
                vocab as u32,
                grad_scale,
                round_bf16,
            );
        }
    });
    Ok(())
}
