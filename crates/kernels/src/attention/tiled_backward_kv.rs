//! Tiled FlashAttention-2 backward, key/value side (Algorithm 2 of the
//! FlashAttention-2 paper): a cube holds a tile of key and value rows in
//! shared memory and its dK/dV in registers, and walks the query rows in
//! tiles staged in shared memory, recomputing the probabilities from the
//! saved log-sum-exp.

use cubecl::prelude::*;

use crate::dtype::{load, store};

use super::tiles::{pair_score, visible};

/// Units per cube of both tiled backward kernels.
pub(crate) const BACKWARD_UNITS: usize = 128;

/// Tile sizes `(outer, inner)` the tiled backward kernels are compiled for,
/// largest first. `outer` is the number of rows a cube owns (key rows in
/// the dK/dV kernel, query rows in the dQ kernel), `inner` the number of
/// rows of the other side staged per step of its loop.
pub const BACKWARD_TILES: [(usize, usize); 4] = [(32, 32), (32, 16), (16, 16), (16, 8)];

/// Shared memory of one cube of the tiled backward with tiles `(outer,
/// inner)`, in bytes, for `head_dim`: the larger of the two kernels' (the
/// dK/dV kernel's for every pair of [`BACKWARD_TILES`]). Both hold two
/// `outer` and two `inner` tiles of `head_dim` values (rows padded by one
/// against bank conflicts); the dK/dV kernel adds two `inner x outer` score
/// tiles (padded likewise) and two values per inner row (log-sum-exp and
/// `delta`), the dQ kernel one `outer x inner` score tile and two values
/// per outer row; all f32.
pub(crate) fn tiled_backward_shared_bytes(outer: usize, inner: usize, head_dim: usize) -> usize {
    let rows = 2 * (outer + inner) * (head_dim + 1);
    let kv = rows + 2 * inner * (outer + 1) + 2 * inner;
    let q = rows + outer * (inner + 1) + 2 * outer;
    kv.max(q) * size_of::<f32>()
}

/// One cube per `keys` key rows of one `(batch, kv_head)`,
/// [`BACKWARD_UNITS`] units. The cube stages its key and value rows in
/// shared memory once and keeps its `keys x head_dim` dK and dV
/// accumulators in registers (each unit a fixed share). Then for each query
/// head of the group that shares this key/value head (grouped-query
/// attention: the group's sum happens here, without atomics) and each tile
/// of `queries` query rows from the causal start (the cube's first key):
///
/// 1. the units load the tile's `q`, `d_out`, log-sum-exp and `delta` rows
///    into shared memory together;
/// 2. each unit computes its share of the `queries x keys` pairs (all of
///    one key, see [`pair_dots`]): `s = scale * q.k + bias`, `dp =
///    d_out.v`, `p = exp(s - lse)`, `ds = p * (dp - delta)`, both 0 where
///    masked (causal, rows and keys past `seq`);
/// 3. each unit adds to its dV elements `sum_r p[r, c] d_out[r, :]` and to
///    its dK elements `sum_r ds[r, c] q[r, :]` (where `head_dim` divides
///    [`BACKWARD_UNITS`], all of a unit's elements are in one column, whose
///    `d_out` and `q` values it reads once per row).
///
/// Finally `dk = scale * dk`. Every value is f32 in shared memory and
/// registers whatever the storage type `F`; each gradient is rounded to `F`
/// once.
///
/// Cube grid: `x` = tile of `keys` key rows, `y` = `batch * n_kv_heads +
/// kv_head`. Layouts as [`super::backward_kv::attention_backward_kv_kernel`]'s.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward_kv_tiled_kernel<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    slopes: &Array<f32>,
    d_out: &Array<F>,
    lse: &Array<f32>,
    delta: &Array<f32>,
    dk: &mut Array<F>,
    dv: &mut Array<F>,
    seq: u32,
    n_heads: u32,
    group: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] keys: usize,
    #[comptime] queries: usize,
    #[comptime] causal: bool,
    #[comptime] alibi: bool,
    #[comptime] round_bf16: bool,
) {
    let seq = seq as usize;
    let n_heads = n_heads as usize;
    let group = group as usize;
    let unit = UNIT_POS_X as usize;
    let kv_bh = CUBE_POS_Y as usize;
    let n_kv_heads = n_heads / group;
    let batch = kv_bh / n_kv_heads;
    let kv_head = kv_bh % n_kv_heads;
    let first_key = CUBE_POS_X as usize * keys;
    let kv_base = kv_bh * seq * head_dim;

    let stride = comptime!(head_dim + 1);
    let p_stride = comptime!(keys + 1);
    let key_elems = comptime!(keys * head_dim);
    let query_elems = comptime!(queries * head_dim);
    let pairs = comptime!(queries * keys);
    let per_key = comptime!(key_elems.div_ceil(BACKWARD_UNITS));
    let pairs_per_unit = comptime!(pairs.div_ceil(BACKWARD_UNITS));

    let mut k_tile = SharedMemory::<f32>::new(comptime!(keys * (head_dim + 1)));
    let mut v_tile = SharedMemory::<f32>::new(comptime!(keys * (head_dim + 1)));
    let mut q_tile = SharedMemory::<f32>::new(comptime!(queries * (head_dim + 1)));
    let mut do_tile = SharedMemory::<f32>::new(comptime!(queries * (head_dim + 1)));
    let mut p_tile = SharedMemory::<f32>::new(comptime!(queries * (keys + 1)));
    let mut ds_tile = SharedMemory::<f32>::new(comptime!(queries * (keys + 1)));
    let mut lse_tile = SharedMemory::<f32>::new(queries);
    let mut delta_tile = SharedMemory::<f32>::new(queries);
    let mut qk = Array::<f32>::new(pairs_per_unit);
    let mut dp = Array::<f32>::new(pairs_per_unit);

    // Key rows past `seq` load a copy of the last row and are never written.
    stage_padded_pair::<F>(
        k,
        v,
        &mut k_tile,
        &mut v_tile,
        kv_base,
        first_key,
        seq,
        unit,
        key_elems,
        head_dim,
        round_bf16,
    );
    let mut dk_acc = Array::<f32>::new(per_key);
    let mut dv_acc = Array::<f32>::new(per_key);
    for i in 0..per_key {
        dk_acc[i] = 0.0f32;
        dv_acc[i] = 0.0f32;
    }

    // With a causal mask, queries before the cube's first key see none of
    // its keys.
    let mut query_start = 0usize;
    if causal {
        query_start = first_key;
    }

    for g in 0..group {
        let head = kv_head * group + g;
        let bh = batch * n_heads + head;
        let q_base = bh * seq * head_dim;
        let mut slope = 0.0f32;
        if alibi {
            slope = slopes[head];
        }

        let mut first_query = query_start;
        while first_query < seq {
            // The previous step's reads of the query-side tiles are done
            // (and, on the first step, the key and value tiles written).
            sync_cube();
            stage_padded_pair::<F>(
                q,
                d_out,
                &mut q_tile,
                &mut do_tile,
                q_base,
                first_query,
                seq,
                unit,
                query_elems,
                head_dim,
                round_bf16,
            );
            if unit < queries {
                let row = bh * seq + min(first_query + unit, seq - 1);
                lse_tile[unit] = lse[row];
                delta_tile[unit] = delta[row];
            }
            sync_cube();

            pair_dots(
                &q_tile,
                &do_tile,
                &k_tile,
                &v_tile,
                unit,
                &mut qk,
                &mut dp,
                head_dim,
                keys,
                pairs_per_unit,
            );
            #[unroll]
            for i in 0..pairs_per_unit {
                let e = unit + i * BACKWARD_UNITS;
                if e < pairs {
                    let r = e / keys;
                    let c = e % keys;
                    let query = first_query + r;
                    let key = first_key + c;
                    let score = pair_score(qk[i], scale, slope, query, key, alibi);
                    let p = f32::exp(score - lse_tile[r]);
                    let ds = p * (dp[i] - delta_tile[r]);
                    let seen = visible(query, key, seq, causal);
                    p_tile[r * p_stride + c] = select(seen, p, 0.0f32);
                    ds_tile[r * p_stride + c] = select(seen, ds, 0.0f32);
                }
            }
            sync_cube();

            if comptime!(BACKWARD_UNITS.is_multiple_of(head_dim)) {
                // Every element of a unit is in column `unit % head_dim`:
                // each query row's `d_out` and `q` value is read once for
                // all of them.
                let d = unit % head_dim;
                for r in 0..queries {
                    let o = do_tile[r * stride + d];
                    let x = q_tile[r * stride + d];
                    #[unroll]
                    for i in 0..per_key {
                        let e = unit + i * BACKWARD_UNITS;
                        if e < key_elems {
                            let c = e / head_dim;
                            dv_acc[i] += p_tile[r * p_stride + c] * o;
                            dk_acc[i] += ds_tile[r * p_stride + c] * x;
                        }
                    }
                }
            } else {
                for i in 0..per_key {
                    let e = unit + i * BACKWARD_UNITS;
                    if e < key_elems {
                        let c = e / head_dim;
                        let d = e % head_dim;
                        let mut grad_v = dv_acc[i];
                        let mut grad_k = dk_acc[i];
                        for r in 0..queries {
                            grad_v += p_tile[r * p_stride + c] * do_tile[r * stride + d];
                            grad_k += ds_tile[r * p_stride + c] * q_tile[r * stride + d];
                        }
                        dv_acc[i] = grad_v;
                        dk_acc[i] = grad_k;
                    }
                }
            }
            first_query += queries;
        }
    }

    for i in 0..per_key {
        let e = unit + i * BACKWARD_UNITS;
        if e < key_elems {
            let key = first_key + e / head_dim;
            if key < seq {
                let at = kv_base + key * head_dim + e % head_dim;
                dk[at] = store::<F>(dk_acc[i] * scale, round_bf16);
                dv[at] = store::<F>(dv_acc[i], round_bf16);
            }
        }
    }
}

/// The dot products of the query-key pairs `unit` owns in one step of a
/// tiled backward kernel: pair `e = unit + i * BACKWARD_UNITS` of the `rows
/// x keys` step (row `e / keys`, key `e % keys`) gets `qk[i] = q[row] .
/// k[key]` and `dp[i] = d_out[row] . v[key]`, summed over `d` in order.
/// Every tile pair of [`BACKWARD_TILES`] has `keys` dividing
/// [`BACKWARD_UNITS`] and a multiple of it as pairs, so a unit's pairs all
/// have key `unit % keys`: its `k` and `v` values are read from shared
/// memory once per column for all of them, and the sums stay in
/// registers. Tiles as the kernels stage them (rows of `head_dim` padded
/// by one).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn pair_dots(
    q_tile: &SharedMemory<f32>,
    do_tile: &SharedMemory<f32>,
    k_tile: &SharedMemory<f32>,
    v_tile: &SharedMemory<f32>,
    unit: usize,
    qk: &mut Array<f32>,
    dp: &mut Array<f32>,
    #[comptime] head_dim: usize,
    #[comptime] keys: usize,
    #[comptime] pairs_per_unit: usize,
) {
    let stride = comptime!(head_dim + 1);
    let c = unit % keys;
    #[unroll]
    for i in 0..pairs_per_unit {
        qk[i] = 0.0f32;
        dp[i] = 0.0f32;
    }
    for d in 0..head_dim {
        let kc = k_tile[c * stride + d];
        let vc = v_tile[c * stride + d];
        #[unroll]
        for i in 0..pairs_per_unit {
            let r = (unit + i * BACKWARD_UNITS) / keys;
            qk[i] += q_tile[r * stride + d] * kc;
            dp[i] += do_tile[r * stride + d] * vc;
        }
    }
}

/// Stages `elems / head_dim` rows from `first_row` of `a` and of `b` (each
/// `[.., seq, head_dim]`, the rows of one head from `base`) into `a_tile`
/// and `b_tile` as f32, rows padded to `head_dim + 1` values against bank
/// conflicts; rows past `seq` load a copy of the last row. Each of the
/// cube's [`BACKWARD_UNITS`] units takes every 128th value.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn stage_padded_pair<F: Float>(
    a: &Array<F>,
    b: &Array<F>,
    a_tile: &mut SharedMemory<f32>,
    b_tile: &mut SharedMemory<f32>,
    base: usize,
    first_row: usize,
    seq: usize,
    unit: usize,
    #[comptime] elems: usize,
    #[comptime] head_dim: usize,
    #[comptime] round_bf16: bool,
) {
    let stride = comptime!(head_dim + 1);
    for i in 0..comptime!(elems.div_ceil(BACKWARD_UNITS)) {
        let e = unit + i * BACKWARD_UNITS;
        if e < elems {
            let r = e / head_dim;
            let d = e % head_dim;
            let at = base + min(first_row + r, seq - 1) * head_dim + d;
            a_tile[r * stride + d] = load::<F>(a[at], round_bf16);
            b_tile[r * stride + d] = load::<F>(b[at], round_bf16);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{BACKWARD_TILES, BACKWARD_UNITS};

    #[test]
    fn every_unit_owns_pairs_of_one_key() {
        // `pair_dots` relies on it in both kernels: the dK/dV kernel's keys
        // are the outer tile, the dQ kernel's the inner.
        for (outer, inner) in BACKWARD_TILES {
            assert!(BACKWARD_UNITS.is_multiple_of(outer), "{outer}");
            assert!(BACKWARD_UNITS.is_multiple_of(inner), "{inner}");
            assert!(
                (outer * inner).is_multiple_of(BACKWARD_UNITS),
                "{outer} x {inner}"
            );
        }
    }
}
