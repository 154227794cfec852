//! One plane's 16 x 8 x 16 matrix product with every operand in its units'
//! registers (PTX's `mma.sync.m16n8k16`, through CubeCL's
//! [`MmaDefinition`]), and the reductions over the four units that share a
//! row of its accumulator: what the register forward
//! (`mma_forward.rs`) is built from.
//!
//! Unlike `cmma` fragments, whose layout is opaque, these registers have
//! PTX's documented layout, so a unit knows the row and column of every
//! value it holds and can scale, mask and exponentiate scores in place,
//! and an accumulator of scores is, value for value, the left operand of
//! the next product (FlashAttention-2's scheme). With unit `lane` of the
//! plane, `g = lane / 4` and `t = lane % 4`:
//!
//! - left operand `a` (16 x 16, 16-bit): value `i` of 8 at row `g + 8 *
//!   ((i / 2) % 2)`, column `2 t + i % 2 + 8 * (i / 4)`;
//! - right operand `b` (16 x 8): value `i` of 4 at row `2 t + i % 2 + 8 *
//!   (i / 2)`, column `g`;
//! - accumulator `c` (16 x 8, f32): value `i` of 4 at row `g + 8 * (i /
//!   2)`, column `2 t + i % 2`.
//!
//! Each operand is an array of [`Pair`]s (two values per 32-bit register).
//! On the matrix units the product is one instruction per plane, and an
//! operand read from a shared-memory tile is one `ldmatrix` (which hands
//! each unit its values of 8 x 8 matrices in this layout, transposed where
//! asked) instead of a load per value with its address. On plain
//! units (lavapipe, which has no matrix instructions, so the tests can
//! check the kernels' indexing and numerics) the plane writes its operands
//! to shared memory in this layout and each unit sums its four values in
//! f32; the row reductions go through shared memory too. The plain form
//! uses cube barriers, so every unit of the cube must call these together.

use cubecl::cmma::{MatrixIdent, MmaDefinition};
use cubecl::prelude::*;

use crate::dtype::store;

/// Two consecutive values of one register of an operand or accumulator.
pub(crate) type Pair<E> = Vector<E, Const<2>>;

/// Rows of a product (`m`): one plane's query rows.
pub(crate) const MMA_ROWS: usize = 16;

/// Columns of a product (`n`).
pub(crate) const MMA_COLS: usize = 8;

/// Depth of a product (`k`).
pub(crate) const MMA_DEPTH: usize = 16;

/// Pairs of the left operand per unit (`16 * 16 / 32 / 2`).
pub(crate) const A_PAIRS: usize = 4;

/// Pairs of the right operand per unit (`16 * 8 / 32 / 2`).
pub(crate) const B_PAIRS: usize = 2;

/// Pairs of the accumulator per unit (`16 * 8 / 32 / 2`).
pub(crate) const C_PAIRS: usize = 2;

/// Units per plane the layout is written for (NVIDIA's warp).
pub(crate) const MMA_PLANE_SIZE: usize = 32;

/// f32 values of shared memory each plane needs for the plain form: its
/// left and right operands (`16 * 16 + 16 * 8`), which also hold the
/// values of a row reduction.
pub(crate) const MMA_SCRATCH: usize = MMA_ROWS * MMA_DEPTH + MMA_DEPTH * MMA_COLS;

/// Row of value `i` of the left operand held by unit `lane`.
#[cube]
pub(crate) fn a_row(lane: usize, i: usize) -> usize {
    lane / 4 + 8 * ((i / 2) % 2)
}

/// Column of value `i` of the left operand held by unit `lane`.
#[cube]
pub(crate) fn a_col(lane: usize, i: usize) -> usize {
    2 * (lane % 4) + i % 2 + 8 * (i / 4)
}

/// Row (depth index) of value `i` of the right operand held by `lane`.
#[cube]
pub(crate) fn b_row(lane: usize, i: usize) -> usize {
    2 * (lane % 4) + i % 2 + 8 * (i / 2)
}

/// Row of value `i` of the accumulator held by unit `lane`.
#[cube]
pub(crate) fn c_row(lane: usize, i: usize) -> usize {
    lane / 4 + 8 * (i / 2)
}

/// Column of value `i` of the accumulator held by unit `lane`.
#[cube]
pub(crate) fn c_col(lane: usize, i: usize) -> usize {
    2 * (lane % 4) + i % 2
}

/// `c += a b` for the plane of unit `lane` (layouts in the module doc):
/// `a` [`A_PAIRS`], `b` [`B_PAIRS`] and `c` [`C_PAIRS`] pairs. On plain
/// units through `scratch` from `plane_at` ([`MMA_SCRATCH`] values per
/// plane), summing in f32 in depth order.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn mma<M: Float>(
    a: &Array<Pair<M>>,
    b: &Array<Pair<M>>,
    c: &mut Array<Pair<f32>>,
    scratch: &mut SharedMemory<f32>,
    plane_at: usize,
    lane: usize,
    #[comptime] matrix_units: bool,
) {
    if matrix_units {
        let definition = MmaDefinition::<M, M, f32>::new(MMA_ROWS, MMA_COLS, MMA_DEPTH);
        definition.execute_inplace(a, b, c);
    } else {
        let b_at = plane_at + MMA_ROWS * MMA_DEPTH;
        #[unroll]
        for i in 0..comptime!(2 * A_PAIRS) {
            let value = f32::cast_from(a[i / 2][i % 2]);
            scratch[plane_at + a_row(lane, i) * MMA_DEPTH + a_col(lane, i)] = value;
        }
        #[unroll]
        for i in 0..comptime!(2 * B_PAIRS) {
            let value = f32::cast_from(b[i / 2][i % 2]);
            scratch[b_at + b_row(lane, i) * MMA_COLS + lane / 4] = value;
        }
        sync_cube();
        #[unroll]
        for p in 0..C_PAIRS {
            let mut pair = c[p];
            #[unroll]
            for e in 0..2usize {
                let row = c_row(lane, 2 * p + e);
                let col = c_col(lane, 2 * p + e);
                let mut sum = pair[e];
                for k in 0..MMA_DEPTH {
                    sum += scratch[plane_at + row * MMA_DEPTH + k]
                        * scratch[b_at + k * MMA_COLS + col];
                }
                pair[e] = sum;
            }
            c[p] = pair;
        }
        sync_cube();
    }
}

/// [`mma`] with the left operand at pairs `a_at ..` of `ops` and the right
/// one at pairs `b_at ..` of `b` (one of the two that [`b_from_rows`] and
/// [`b_from_columns`] load with `steps = 2`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn mma_from<M: Float>(
    ops: &Array<Pair<M>>,
    a_at: usize,
    b: &Array<Pair<M>>,
    b_at: usize,
    c: &mut Array<Pair<f32>>,
    scratch: &mut SharedMemory<f32>,
    plane_at: usize,
    lane: usize,
    #[comptime] matrix_units: bool,
) {
    let mut a = Array::<Pair<M>>::new(A_PAIRS);
    let mut operand = Array::<Pair<M>>::new(B_PAIRS);
    copy_pairs::<M>(ops, a_at, &mut a, 0, A_PAIRS);
    copy_pairs::<M>(b, b_at, &mut operand, 0, B_PAIRS);
    mma::<M>(&a, &operand, c, scratch, plane_at, lane, matrix_units);
}

/// The largest of `value` over the four units of `lane`'s group (`lane /
/// 4`: the units holding one accumulator row), on every one of them.
#[cube]
pub(crate) fn quad_max(
    value: f32,
    scratch: &mut SharedMemory<f32>,
    plane_at: usize,
    lane: usize,
    #[comptime] matrix_units: bool,
) -> f32 {
    if matrix_units {
        let pairs = max(value, plane_shuffle_xor(value, 1u32));
        max(pairs, plane_shuffle_xor(pairs, 2u32))
    } else {
        let first = publish(value, scratch, plane_at, lane);
        let result = max(
            max(scratch[first], scratch[first + 1]),
            max(scratch[first + 2], scratch[first + 3]),
        );
        sync_cube();
        result
    }
}

/// The sum of `value` over the four units of `lane`'s group, on every one
/// of them: `(v0 + v1) + (v2 + v3)` in both forms (the butterfly of the
/// matrix-unit form adds the same pairs, and f32 addition commutes).
#[cube]
pub(crate) fn quad_sum(
    value: f32,
    scratch: &mut SharedMemory<f32>,
    plane_at: usize,
    lane: usize,
    #[comptime] matrix_units: bool,
) -> f32 {
    if matrix_units {
        let pairs = value + plane_shuffle_xor(value, 1u32);
        pairs + plane_shuffle_xor(pairs, 2u32)
    } else {
        let first = publish(value, scratch, plane_at, lane);
        let result =
            (scratch[first] + scratch[first + 1]) + (scratch[first + 2] + scratch[first + 3]);
        sync_cube();
        result
    }
}

/// Writes `value` to `lane`'s slot of the plane's scratch and returns, after
/// a cube barrier, where its group's four values start.
#[cube]
fn publish(value: f32, scratch: &mut SharedMemory<f32>, plane_at: usize, lane: usize) -> usize {
    scratch[plane_at + lane] = value;
    sync_cube();
    plane_at + (lane / 4) * 4
}

/// Loads into `a` the left operand of rows `first_row ..+ 16` and columns
/// `first_col ..+ 16` of the row-major `tile` (row stride `stride`): four
/// 8 x 8 matrices ([`load_matrices`]), pair `p` being matrix `p` (rows `8
/// (p % 2) ..`, columns `8 (p / 2) ..`), which is the operand's layout
/// (module doc).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn a_from_tile<M: Float>(
    tile: &SharedMemory<M>,
    a: &mut Array<Pair<M>>,
    first_row: usize,
    first_col: usize,
    scratch: &mut SharedMemory<f32>,
    plane_at: usize,
    lane: usize,
    #[comptime] stride: usize,
    #[comptime] matrix_units: bool,
) {
    // Lane `l` gives row `l % 8` of matrix `l / 8`.
    let matrix = lane / 8;
    let at = (first_row + 8 * (matrix % 2) + lane % 8) * stride + first_col + 8 * (matrix / 2);
    load_matrices::<M>(
        tile,
        a,
        at,
        scratch,
        plane_at,
        lane,
        A_PAIRS,
        false,
        matrix_units,
    );
}

/// Loads into `b` `steps` (1 or 2) right operands, operand `h` (pairs
/// `B_PAIRS h ..`) the one whose value `(k, n)` is `tile`'s `(first_row +
/// n, first_col + 16 h + k)`: 8 rows of the row-major `tile` read as
/// columns (`k^T` from a key tile), one or two depth steps. `2 steps` 8 x 8
/// matrices (depth `0 ..`, `8 ..`, and `16 ..`, `24 ..`, [`load_matrices`])
/// as they lie: unit `l` gets row `l / 4`, columns `2 (l % 4) ..+ 2` of
/// each, which is `b`'s layout.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn b_from_rows<M: Float>(
    tile: &SharedMemory<M>,
    b: &mut Array<Pair<M>>,
    first_row: usize,
    first_col: usize,
    scratch: &mut SharedMemory<f32>,
    plane_at: usize,
    lane: usize,
    #[comptime] stride: usize,
    #[comptime] steps: usize,
    #[comptime] matrix_units: bool,
) {
    // Lane `l` gives row `l % 8` of matrix `l / 8`; with one step lanes
    // 16-31 repeat lanes 0-15.
    let matrices = comptime!(2 * steps);
    let at = (first_row + lane % 8) * stride + first_col + 8 * ((lane / 8) % matrices);
    load_matrices::<M>(
        tile,
        b,
        at,
        scratch,
        plane_at,
        lane,
        comptime!(B_PAIRS * steps),
        false,
        matrix_units,
    );
}

/// Loads into `b` `steps` (1 or 2) right operands, operand `h` (pairs
/// `B_PAIRS h ..`) the one whose value `(k, n)` is `tile`'s `(first_row +
/// 16 h + k, first_col + n)`: 16 or 32 rows and 8 columns of the
/// row-major `tile` as they lie (`v` from a value tile). `2 steps` 8 x 8
/// matrices (rows `0 ..`, `8 ..`, and `16 ..`, `24 ..`,
/// [`load_matrices`]) transposed: unit `l` gets column `l / 4`, rows `2 (l
/// % 4) ..+ 2` of each, which is `b`'s layout.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn b_from_columns<M: Float>(
    tile: &SharedMemory<M>,
    b: &mut Array<Pair<M>>,
    first_row: usize,
    first_col: usize,
    scratch: &mut SharedMemory<f32>,
    plane_at: usize,
    lane: usize,
    #[comptime] stride: usize,
    #[comptime] steps: usize,
    #[comptime] matrix_units: bool,
) {
    let matrices = comptime!(2 * steps);
    let at = (first_row + 8 * ((lane / 8) % matrices) + lane % 8) * stride + first_col;
    load_matrices::<M>(
        tile,
        b,
        at,
        scratch,
        plane_at,
        lane,
        comptime!(B_PAIRS * steps),
        true,
        matrix_units,
    );
}

/// PTX's `ldmatrix` of `count` (2 or 4) 8 x 8 matrices of 16-bit values
/// from `tile` into `regs`, one pair per matrix: row `r` of matrix `i`
/// is the 8 values from where unit `8 i + r` of the plane says (`at`,
/// 16 bytes aligned on the matrix units; the other units' `at` is not
/// read, but must be inside `tile`). Unit `l` receives row `l / 4`,
/// columns `2 (l % 4) ..+ 2` of each matrix, or with `transpose` column
/// `l / 4`, rows `2 (l % 4) ..+ 2`.
///
/// On the matrix units one instruction. On plain units the same exchange
/// through `scratch` from `plane_at` (each unit publishes `at`, exact in
/// f32 below 2^24, and reads its values from the rows the others
/// published), so the tests check every caller's addresses on lavapipe;
/// it adds two cube barriers.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_matrices<M: Float>(
    tile: &SharedMemory<M>,
    regs: &mut Array<Pair<M>>,
    at: usize,
    scratch: &mut SharedMemory<f32>,
    plane_at: usize,
    lane: usize,
    #[comptime] count: usize,
    #[comptime] transpose: bool,
    #[comptime] matrix_units: bool,
) {
    if matrix_units {
        let definition = MmaDefinition::<M, M, f32>::new(MMA_ROWS, MMA_COLS, MMA_DEPTH);
        let row = tile.slice(at, at + 8);
        definition.load_matrix_inplace::<M, Const<2>>(&row, regs, MatrixIdent::A, count, transpose);
    } else {
        scratch[plane_at + lane] = f32::cast_from(at as u32);
        sync_cube();
        #[unroll]
        for i in 0..count {
            let mut pair = Pair::<M>::empty();
            #[unroll]
            for e in 0..2usize {
                let (row, col) = if transpose {
                    (2 * (lane % 4) + e, lane / 4)
                } else {
                    (lane / 4, 2 * (lane % 4) + e)
                };
                let row_at = u32::cast_from(scratch[plane_at + 8 * i + row]) as usize;
                pair[e] = tile[row_at + col];
            }
            regs[i] = pair;
        }
        sync_cube();
    }
}

/// Copies `count` pairs of `from` from `from_at` into `to` from `to_at`
/// (an operand or accumulator out of or into a unit's array of them).
#[cube]
pub(crate) fn copy_pairs<E: Float>(
    from: &Array<Pair<E>>,
    from_at: usize,
    to: &mut Array<Pair<E>>,
    to_at: usize,
    #[comptime] count: usize,
) {
    #[unroll]
    for p in 0..count {
        to[to_at + p] = from[from_at + p];
    }
}

/// `out` pairs from `first_out`: for each block `j < blocks`, the product
/// of the plane's 16 rows (`regs`, their left operands, `depth_steps` of
/// them as [`super::stage::a_through_tile`] loads them) and rows `8 j ..+ 8` of `tile` read
/// as columns ([`b_from_rows`], two depth steps per load, the odd one
/// last): `16 x 8 blocks` scores such as `q k^T`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn products_with_rows<M: Float>(
    regs: &Array<Pair<M>>,
    tile: &SharedMemory<M>,
    out: &mut Array<Pair<f32>>,
    scratch: &mut SharedMemory<f32>,
    plane_at: usize,
    lane: usize,
    #[comptime] blocks: usize,
    #[comptime] depth_steps: usize,
    #[comptime] stride: usize,
    #[comptime] matrix_units: bool,
) {
    let mut b = Array::<Pair<M>>::new(comptime!(2 * B_PAIRS));
    let mut c = Array::<Pair<f32>>::new(C_PAIRS);
    #[unroll(matrix_units)]
    for j in 0..blocks {
        #[unroll]
        for p in 0..C_PAIRS {
            c[p] = Pair::<f32>::new(0.0f32);
        }
        // Two depth steps per load, then the odd one.
        #[unroll(matrix_units)]
        for d2 in 0..comptime!(depth_steps / 2) {
            b_from_rows::<M>(
                tile,
                &mut b,
                j * MMA_COLS,
                d2 * 2 * MMA_DEPTH,
                scratch,
                plane_at,
                lane,
                stride,
                2usize,
                matrix_units,
            );
            #[unroll]
            for h in 0..2usize {
                mma_from::<M>(
                    regs,
                    (2 * d2 + h) * A_PAIRS,
                    &b,
                    h * B_PAIRS,
                    &mut c,
                    scratch,
                    plane_at,
                    lane,
                    matrix_units,
                );
            }
        }
        if comptime!(depth_steps % 2 == 1) {
            let d = comptime!(depth_steps - 1);
            b_from_rows::<M>(
                tile,
                &mut b,
                j * MMA_COLS,
                d * MMA_DEPTH,
                scratch,
                plane_at,
                lane,
                stride,
                1usize,
                matrix_units,
            );
            mma_from::<M>(
                regs,
                d * A_PAIRS,
                &b,
                0,
                &mut c,
                scratch,
                plane_at,
                lane,
                matrix_units,
            );
        }
        copy_pairs::<f32>(&c, 0, out, j * C_PAIRS, C_PAIRS);
    }
}

/// Adds to `acc` (`blocks` accumulators) depth step `step` (columns `16
/// step ..+ 16`) of the products of rows `first_row ..+ 16` of `a_tile`
/// ([`a_from_tile`]) with rows `8 j ..+ 8` of `b_tile` read as columns
/// ([`b_from_rows`]) for each block `j`: one step of `k q^T` or `v dO^T`
/// from two tiles, the left operand loaded once for every block.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn add_step_with_rows<M: Float>(
    a_tile: &SharedMemory<M>,
    b_tile: &SharedMemory<M>,
    acc: &mut Array<Pair<f32>>,
    first_row: usize,
    step: usize,
    scratch: &mut SharedMemory<f32>,
    plane_at: usize,
    lane: usize,
    #[comptime] blocks: usize,
    #[comptime] stride: usize,
    #[comptime] matrix_units: bool,
) {
    let mut a = Array::<Pair<M>>::new(A_PAIRS);
    let mut b = Array::<Pair<M>>::new(B_PAIRS);
    let mut c = Array::<Pair<f32>>::new(C_PAIRS);
    a_from_tile::<M>(
        a_tile,
        &mut a,
        first_row,
        step * MMA_DEPTH,
        scratch,
        plane_at,
        lane,
        stride,
        matrix_units,
    );
    #[unroll(matrix_units)]
    for j in 0..blocks {
        copy_pairs::<f32>(acc, j * C_PAIRS, &mut c, 0, C_PAIRS);
        b_from_rows::<M>(
            b_tile,
            &mut b,
            j * MMA_COLS,
            step * MMA_DEPTH,
            scratch,
            plane_at,
            lane,
            stride,
            1usize,
            matrix_units,
        );
        mma::<M>(&a, &b, &mut c, scratch, plane_at, lane, matrix_units);
        copy_pairs::<f32>(&c, 0, acc, j * C_PAIRS, C_PAIRS);
    }
}

/// `acc` (`blocks` accumulators: columns `8 n ..+ 8` of the plane's 16
/// rows) plus the product of the left operands `ops` (`steps` of them, for
/// rows `16 s ..+ 16` of `tile`) and those rows of `tile` as they lie
/// ([`b_from_columns`], `per_load` steps (1 or 2) per load, the odd one
/// last): `p v` and the gradients' sums. Two steps per load halve the
/// `ldmatrix` instructions and hold two more registers.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn accumulate_with_columns<M: Float>(
    ops: &Array<Pair<M>>,
    tile: &SharedMemory<M>,
    acc: &mut Array<Pair<f32>>,
    scratch: &mut SharedMemory<f32>,
    plane_at: usize,
    lane: usize,
    #[comptime] blocks: usize,
    #[comptime] steps: usize,
    #[comptime] stride: usize,
    #[comptime] per_load: usize,
    #[comptime] matrix_units: bool,
) {
    let mut b = Array::<Pair<M>>::new(comptime!(per_load * B_PAIRS));
    let mut c = Array::<Pair<f32>>::new(C_PAIRS);
    #[unroll(matrix_units)]
    for n in 0..blocks {
        copy_pairs::<f32>(acc, n * C_PAIRS, &mut c, 0, C_PAIRS);
        #[unroll(matrix_units)]
        for load in 0..comptime!(steps / per_load) {
            b_from_columns::<M>(
                tile,
                &mut b,
                load * per_load * MMA_DEPTH,
                n * MMA_COLS,
                scratch,
                plane_at,
                lane,
                stride,
                per_load,
                matrix_units,
            );
            #[unroll]
            for h in 0..per_load {
                mma_from::<M>(
                    ops,
                    (load * per_load + h) * A_PAIRS,
                    &b,
                    h * B_PAIRS,
                    &mut c,
                    scratch,
                    plane_at,
                    lane,
                    matrix_units,
                );
            }
        }
        if comptime!(steps % per_load == 1) {
            let s = comptime!(steps - 1);
            b_from_columns::<M>(
                tile,
                &mut b,
                s * MMA_DEPTH,
                n * MMA_COLS,
                scratch,
                plane_at,
                lane,
                stride,
                1usize,
                matrix_units,
            );
            mma_from::<M>(
                ops,
                s * A_PAIRS,
                &b,
                0,
                &mut c,
                scratch,
                plane_at,
                lane,
                matrix_units,
            );
        }
        copy_pairs::<f32>(&c, 0, acc, n * C_PAIRS, C_PAIRS);
    }
}

/// Writes this unit's share of `acc` (`head_dim / 8` accumulators of its
/// rows `row_top` and `row_top + 8`, one head of `dst` from `base`), each
/// row's values times its `factors` entry, rounded to `F`; rows past `seq`
/// are not written.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn store_accumulators<F: Float>(
    dst: &mut Array<F>,
    acc: &Array<Pair<f32>>,
    factors: &Array<f32>,
    base: usize,
    row_top: usize,
    seq: usize,
    lane: usize,
    #[comptime] head_dim: usize,
    #[comptime] round_bf16: bool,
    #[comptime] matrix_units: bool,
) {
    #[unroll]
    for h in 0..2usize {
        let row = row_top + 8 * h;
        if row < seq {
            #[unroll(matrix_units)]
            for n in 0..comptime!(head_dim / MMA_COLS) {
                let pair = acc[n * C_PAIRS + h];
                #[unroll]
                for e in 0..2usize {
                    let at = base + row * head_dim + n * MMA_COLS + c_col(lane, e);
                    dst[at] = store::<F>(pair[e] * factors[h], round_bf16);
                }
            }
        }
    }
}
