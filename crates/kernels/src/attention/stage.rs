//! Staging rows of `q`, `k`, `v` or `dO` from global memory into a
//! shared-memory tile, as the fragment and register attention kernels do
//! at each step: every unit loads its vectors of the tile (all loads in
//! flight together), then stores them in the operand type, rows past the
//! sequence as zeros.

use cubecl::prelude::*;

use crate::dtype::load_vector;

/// Stages `elems / head_dim` rows from `first_row` of `src` (`[.., seq,
/// head_dim]`, the rows of one head from `base`, read `N` values at a
/// time) into `tile` as `M`, rows past `seq` as zeros; each of the cube's
/// `units` units takes every `units`-th vector. `N` divides `head_dim`.
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
    #[comptime] round_bf16: bool,
) {
    let width = src.vector_size();
    let mut held = Array::<Vector<F, N>>::new(comptime!(held_vectors(elems, units, width)));
    load_rows::<F, N>(
        src, &mut held, base, first_row, seq, unit, elems, units, head_dim,
    );
    store_rows::<F, M, N>(
        &held, tile, first_row, seq, unit, elems, units, head_dim, head_dim, round_bf16,
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
