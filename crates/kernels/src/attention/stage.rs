//! Staging rows of `q`, `k`, `v` or `dO` from global memory into a
//! shared-memory tile, as the fragment and register attention kernels do
//! at each step: every unit loads its vectors of the tile (all loads in
//! flight together), then stores them in the operand type, rows past the
//! sequence as zeros. The register kernels also take their planes' left
//! operands of `q` or `dO` through a tile ([`a_through_tile`]).

use cubecl::prelude::*;

use super::mma::{a_from_tile, copy_pairs, Pair, A_PAIRS, MMA_DEPTH, MMA_ROWS};
use crate::dtype::load_vector;

/// Stages `elems / head_dim` rows from `first_row` of `src` (`[.., seq,
/// head_dim]`, the rows of one head from `base`, read `N` values at a
/// time) into `tile` as `M`, rows `stride` values apart (`stride >=
/// head_dim`; the values between are not written), rows past `seq` as
/// zeros; each of the cube's `units` units takes every `units`-th vector.
/// `N` divides `head_dim`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn stage_rows<F: Float, M: Float, N: Size>(
    src: &Array<Vector<F, N>>,
    tile: &mut SharedMemory<M>,
    base: usize,
    first_row: usize,
    seq: usize,
    unit: usize,
    #[comptime] elems: usize,
    #[comptime] units: usize,
    #[comptime] head_dim: usize,
    #[comptime] stride: usize,
    #[comptime] round_bf16: bool,
) {
    let width = src.vector_size();
    let mut held = Array::<Vector<F, N>>::new(comptime!(held_vectors(elems, units, width)));
    load_rows::<F, N>(
        src, &mut held, base, first_row, seq, unit, elems, units, head_dim,
    );
    store_rows::<F, M, N>(
        &held, tile, first_row, seq, unit, elems, units, head_dim, stride, round_bf16,
    );
}

/// Vectors of `width` values each of a cube's `units` units holds when
/// they stage `elems` values: every `units`-th of the `elems / width`.
fn held_vectors(elems: usize, units: usize, width: usize) -> usize {
    (elems / width).div_ceil(units)
}

/// The first half of [`stage_rows`]: this unit's vectors of the
/// rows from `first_row` (its `i`-th is vector `unit + i * units` of the
/// tile) into `held`, every load issued before any value is used (no
/// branch between them, so they are in flight together). A row past `seq`
/// reads row `seq - 1` instead, so that every load is in bounds, and
/// [`store_rows`] stores zeros for it; a vector past the tile (where the
/// units do not divide the tile's vectors) is loaded and not stored.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_rows<F: Float, N: Size>(
    src: &Array<Vector<F, N>>,
    held: &mut Array<Vector<F, N>>,
    base: usize,
    first_row: usize,
    seq: usize,
    unit: usize,
    #[comptime] elems: usize,
    #[comptime] units: usize,
    #[comptime] head_dim: usize,
) {
    let width = src.vector_size();
    #[unroll]
    for i in 0..comptime!(held_vectors(elems, units, width)) {
        let e = (unit + i * units) * width;
        let row = min(first_row + e / head_dim, seq - 1);
        held[i] = src[(base + row * head_dim + e % head_dim) / width];
    }
}

/// The second half of [`stage_rows`]: `held` ([`load_rows`]'s)
/// into `tile` as `M`, rows past `seq` as zeros. Only the last tile of a
/// sequence has such rows, so the others are stored without a per-value
/// choice between the value and zero (one branch, the same for the cube).
#[cube]
#[allow(clippy::too_many_arguments)]
fn store_rows<F: Float, M: Float, N: Size>(
    held: &Array<Vector<F, N>>,
    tile: &mut SharedMemory<M>,
    first_row: usize,
    seq: usize,
    unit: usize,
    #[comptime] elems: usize,
    #[comptime] units: usize,
    #[comptime] head_dim: usize,
    #[comptime] stride: usize,
    #[comptime] round_bf16: bool,
) {
    let width = held.vector_size();
    // Whether every unit's every vector is inside the tile.
    let exact = comptime!((elems / width).is_multiple_of(units));
    let count = comptime!(held_vectors(elems, units, width));
    if first_row + comptime!(elems / head_dim) <= seq {
        #[unroll]
        for i in 0..count {
            let e = (unit + i * units) * width;
            if exact || e < elems {
                let x = staged::<F, M, N>(held[i], round_bf16);
                put_vector::<M, N>(tile, x, (e / head_dim) * stride + e % head_dim);
            }
        }
    } else {
        #[unroll]
        for i in 0..count {
            let e = (unit + i * units) * width;
            if exact || e < elems {
                let x = select(
                    first_row + e / head_dim < seq,
                    staged::<F, M, N>(held[i], round_bf16),
                    Vector::<M, N>::new(M::from_int(0)),
                );
                put_vector::<M, N>(tile, x, (e / head_dim) * stride + e % head_dim);
            }
        }
    }
}

/// Writes the values of `x` to `tile` from `at`.
#[cube]
fn put_vector<M: Float, N: Size>(tile: &mut SharedMemory<M>, x: Vector<M, N>, at: usize) {
    #[unroll]
    for j in 0..x.vector_size() {
        tile[at + j] = x[j];
    }
}

/// `value` as the operand type `M`: with `round_bf16` through f32 rounded
/// to bf16 ([`load_vector`]), else converted directly (no conversion at
/// all when `F` is `M`, which the f32 round trip would cost).
#[cube]
fn staged<F: Float, M: Float, N: Size>(
    value: Vector<F, N>,
    #[comptime] round_bf16: bool,
) -> Vector<M, N> {
    if round_bf16 {
        Vector::<M, N>::cast_from(load_vector::<F, N>(value, true))
    } else {
        Vector::<M, N>::cast_from(value)
    }
}

/// Stages `elems / head_dim` rows from `first_row` of `a` and of `b` (each
/// `[.., seq, head_dim]`, the rows of one head from `base`) into `a_tile`
/// and `b_tile` as `M`, rows `stride` values apart (`stride >= head_dim`;
/// the values between are not written), rows past `seq` as zeros, as
/// [`stage_rows`], both tiles' loads issued before either is stored.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn stage_row_pair<F: Float, M: Float, N: Size>(
    a: &Array<Vector<F, N>>,
    b: &Array<Vector<F, N>>,
    a_tile: &mut SharedMemory<M>,
    b_tile: &mut SharedMemory<M>,
    base: usize,
    first_row: usize,
    seq: usize,
    unit: usize,
    #[comptime] elems: usize,
    #[comptime] units: usize,
    #[comptime] head_dim: usize,
    #[comptime] stride: usize,
    #[comptime] round_bf16: bool,
) {
    let count = comptime!(held_vectors(elems, units, a.vector_size()));
    let mut a_held = Array::<Vector<F, N>>::new(count);
    let mut b_held = Array::<Vector<F, N>>::new(count);
    load_rows::<F, N>(
        a,
        &mut a_held,
        base,
        first_row,
        seq,
        unit,
        elems,
        units,
        head_dim,
    );
    load_rows::<F, N>(
        b,
        &mut b_held,
        base,
        first_row,
        seq,
        unit,
        elems,
        units,
        head_dim,
    );
    store_rows::<F, M, N>(
        &a_held, a_tile, first_row, seq, unit, elems, units, head_dim, stride, round_bf16,
    );
    store_rows::<F, M, N>(
        &b_held, b_tile, first_row, seq, unit, elems, units, head_dim, stride, round_bf16,
    );
}

/// Loads into `regs` the left operands of plane `plane`'s 16 rows (rows
/// `first_row + 16 plane ..` of one head of `src`, `[.., seq, head_dim]`
/// from `base`), one per 16 columns ([`A_PAIRS`] pairs each, in column
/// order), as `M`, rows past `seq` as zeros. The cube stages its `rows`
/// rows in `tile` (rows `stride` values apart), `tile_rows` at a time, as
/// [`stage_rows`] does (16-byte vectors, all in flight together), and each
/// plane reads its operands there with [`a_from_tile`] (one `ldmatrix`
/// per 16 columns on the matrix units), instead of each unit loading its
/// values one by one out of vectors. Every unit of the cube calls it (cube
/// barriers); `tile` holds the last chunk after it, so the caller syncs the
/// cube before staging there again.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn a_through_tile<F: Float, M: Float, N: Size>(
    src: &Array<Vector<F, N>>,
    regs: &mut Array<Pair<M>>,
    tile: &mut SharedMemory<M>,
    scratch: &mut SharedMemory<f32>,
    base: usize,
    first_row: usize,
    seq: usize,
    unit: usize,
    plane: usize,
    plane_at: usize,
    lane: usize,
    #[comptime] rows: usize,
    #[comptime] tile_rows: usize,
    #[comptime] units: usize,
    #[comptime] head_dim: usize,
    #[comptime] stride: usize,
    #[comptime] round_bf16: bool,
    #[comptime] matrix_units: bool,
) {
    let chunks = comptime!(rows.div_ceil(tile_rows));
    let elems = comptime!(tile_rows * head_dim);
    let plane_row = plane * MMA_ROWS;
    let mut a = Array::<Pair<M>>::new(A_PAIRS);
    #[unroll]
    for c in 0..chunks {
        let chunk_first = c * tile_rows;
        // The tile's earlier reads (the last chunk's) are done.
        sync_cube();
        stage_rows::<F, M, N>(
            src,
            tile,
            base,
            first_row + chunk_first,
            seq,
            unit,
            elems,
            units,
            head_dim,
            stride,
            round_bf16,
        );
        sync_cube();
        // A plane whose rows are in another chunk reads this one's first
        // rows (every plane reads, for the plain form's barriers) and keeps
        // nothing.
        let mine = comptime!(chunks == 1)
            || (plane_row >= chunk_first && plane_row < chunk_first + tile_rows);
        let mut local = 0usize;
        if mine {
            local = plane_row - chunk_first;
        }
        #[unroll(matrix_units)]
        for d in 0..comptime!(head_dim / MMA_DEPTH) {
            a_from_tile::<M>(
                tile,
                &mut a,
                local,
                d * MMA_DEPTH,
                scratch,
                plane_at,
                lane,
                stride,
                matrix_units,
            );
            if mine {
                copy_pairs::<M>(&a, 0, regs, d * A_PAIRS, A_PAIRS);
            }
        }
    }
}
