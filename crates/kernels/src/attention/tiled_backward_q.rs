//! Tiled FlashAttention-2 backward, query side: dQ by a separate pass (no
//! atomics, so deterministic), one cube per tile of query rows walking the
//! key/value tiles staged in shared memory.

use cubecl::prelude::*;

use crate::dtype::store;

use super::tiled_backward_kv::{pair_dots, stage_padded_pair, BACKWARD_UNITS};
use super::tiles::{pair_score, visible};

/// One cube per `queries` query rows of one `(batch, head)`,
/// [`BACKWARD_UNITS`] units. The cube stages its `q` and `d_out` rows, their
/// log-sum-exp and `delta` in shared memory once and keeps its `queries x
/// head_dim` dQ accumulator in registers (each unit a fixed share). Then
/// for each tile of `keys` key rows up to the causal end (the cube's last
/// query):
///
/// 1. the units load the tile's `k` and `v` rows into shared memory
///    together;
/// 2. each unit computes its share of the `queries x keys` pairs (all of
///    one key, see [`pair_dots`]): `p = exp(scale * q.k + bias - lse)`,
///    `ds = p * (d_out.v - delta)`, 0 where masked (causal, rows and keys
///    past `seq`);
/// 3. each unit adds to its dQ elements `sum_c ds[r, c] k[c, :]` (where
///    `head_dim` divides [`BACKWARD_UNITS`], all of a unit's elements are
///    in one column, whose `k` value it reads once per key row).
///
/// Finally `dq = scale * dq`, rounded to `F` once; every value before that
/// is f32.
///
/// Cube grid: `x` = tile of `queries` query rows, `y` = `batch * n_heads +
/// head`. Layouts as [`super::backward_q::attention_backward_q_kernel`]'s.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward_q_tiled_kernel<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    slopes: &Array<f32>,
    d_out: &Array<F>,
    lse: &Array<f32>,
    delta: &Array<f32>,
    dq: &mut Array<F>,
    seq: u32,
    n_heads: u32,
    group: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] queries: usize,
    #[comptime] keys: usize,
    #[comptime] causal: bool,
    #[comptime] alibi: bool,
    #[comptime] round_bf16: bool,
) {
    let seq = seq as usize;
    let n_heads = n_heads as usize;
    let group = group as usize;
    let unit = UNIT_POS_X as usize;
    let bh = CUBE_POS_Y as usize;
    let head = bh % n_heads;
    let kv_bh = (bh / n_heads) * (n_heads / group) + head / group;
    let first_query = CUBE_POS_X as usize * queries;
    let q_base = bh * seq * head_dim;
    let kv_base = kv_bh * seq * head_dim;

    let stride = comptime!(head_dim + 1);
    let s_stride = comptime!(keys + 1);
    let query_elems = comptime!(queries * head_dim);
    let key_elems = comptime!(keys * head_dim);
    let pairs = comptime!(queries * keys);
    let per_query = comptime!(query_elems.div_ceil(BACKWARD_UNITS));
    let pairs_per_unit = comptime!(pairs.div_ceil(BACKWARD_UNITS));

    let mut q_tile = SharedMemory::<f32>::new(comptime!(queries * (head_dim + 1)));
    let mut do_tile = SharedMemory::<f32>::new(comptime!(queries * (head_dim + 1)));
    let mut k_tile = SharedMemory::<f32>::new(comptime!(keys * (head_dim + 1)));
    let mut v_tile = SharedMemory::<f32>::new(comptime!(keys * (head_dim + 1)));
    let mut ds_tile = SharedMemory::<f32>::new(comptime!(queries * (keys + 1)));
    let mut lse_tile = SharedMemory::<f32>::new(queries);
    let mut delta_tile = SharedMemory::<f32>::new(queries);
    let mut qk = Array::<f32>::new(pairs_per_unit);
    let mut dp = Array::<f32>::new(pairs_per_unit);

    let mut slope = 0.0f32;
    if alibi {
        slope = slopes[head];
    }

    // Query rows past `seq` load a copy of the last row and are never
    // written.
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
    let mut dq_acc = Array::<f32>::new(per_query);
    for i in 0..per_query {
        dq_acc[i] = 0.0f32;
    }
    if unit < queries {
        let row = bh * seq + min(first_query + unit, seq - 1);
        lse_tile[unit] = lse[row];
        delta_tile[unit] = delta[row];
    }

    let mut key_end = seq;
    if causal {
        key_end = min(first_query + queries, seq);
    }
    let mut first_key = 0usize;
    while first_key < key_end {
        // The previous step's reads of the key-side tiles are done (and, on
        // the first step, the query-side tiles written).
        sync_cube();
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
                let ds = f32::exp(score - lse_tile[r]) * (dp[i] - delta_tile[r]);
                ds_tile[r * s_stride + c] = select(visible(query, key, seq, causal), ds, 0.0f32);
            }
        }
        sync_cube();

        if comptime!(BACKWARD_UNITS.is_multiple_of(head_dim)) {
            // Every element of a unit is in column `unit % head_dim`: each
            // key row's `k` value is read once for all of them.
            let d = unit % head_dim;
            for c in 0..keys {
                let x = k_tile[c * stride + d];
                #[unroll]
                for i in 0..per_query {
                    let e = unit + i * BACKWARD_UNITS;
                    if e < query_elems {
                        dq_acc[i] += ds_tile[(e / head_dim) * s_stride + c] * x;
                    }
                }
            }
        } else {
            for i in 0..per_query {
                let e = unit + i * BACKWARD_UNITS;
                if e < query_elems {
                    let r = e / head_dim;
                    let d = e % head_dim;
                    let mut grad = dq_acc[i];
                    for c in 0..keys {
                        grad += ds_tile[r * s_stride + c] * k_tile[c * stride + d];
                    }
                    dq_acc[i] = grad;
                }
            }
        }
        first_key += keys;
    }

    for i in 0..per_query {
        let e = unit + i * BACKWARD_UNITS;
        if e < query_elems {
            let query = first_query + e / head_dim;
            if query < seq {
                dq[q_base + query * head_dim + e % head_dim] =
                    store::<F>(dq_acc[i] * scale, round_bf16);
            }
        }
    }
}
