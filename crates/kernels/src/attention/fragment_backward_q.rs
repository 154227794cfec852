//! FlashAttention-2 backward, query side (dQ by a separate pass, no
//! atomics), with its three products in 16 x 16 x 16 fragments
//! ([`super::fragment::fragment_product`]).

use cubecl::prelude::*;

use crate::dtype::store;

use super::cube_tile::{query_tile, QueryTile};
use super::fragment::{fragment_product, sync_block, CMMA_PLANE_SIZE, FRAGMENT, PER_LANE};
use super::stage::stage_row_pair;
use super::tiles::{pair_score, visible};

/// One cube per `16 * planes` query rows of one `(batch, head)`, `planes`
/// planes of 32 units; plane `p` owns query rows `16 p .. 16 p + 16` of the
/// cube and keeps their dQ (`16 x head_dim`) in registers, [`PER_LANE`]
/// values per unit and 16-column block. The cube stages its `q` and
/// `d_out` rows as `M`, and their log-sum-exp and `delta`, once. Then for
/// each tile of `keys` key rows up to the causal end (the cube's last
/// query):
///
/// 1. the units stage the tile's `k` and `v` rows as `M`;
/// 2. each plane computes its rows' scores `q k^T` and `d_out v^T` (`16 x
///    keys`, f32);
/// 3. the units form `ds = p * (dp - delta)` with `p = exp(scale * s + bias
///    - lse)`, 0 where masked, and store it as `M`;
/// 4. each plane adds `ds k` to its dQ, one 16-column block at a time.
///
/// Finally `dq = scale * dq`, rounded to `F` once. As in
/// [`super::fragment_backward_kv::attention_backward_kv_fragment_kernel`],
/// everything but the `M` operands is f32 and every barrier but
/// [`sync_block`] a cube barrier.
///
/// Cube grid: `x` = tile of `16 * planes` query rows, `y` = `batch *
/// n_heads + head`; cube dim `(32, planes)`. Layouts as
/// [`super::backward_q::attention_backward_q_kernel`]'s.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward_q_fragment_kernel<F: Float, M: Float, N: Size>(
    q: &Array<Vector<F, N>>,
    k: &Array<Vector<F, N>>,
    v: &Array<Vector<F, N>>,
    slopes: &Array<f32>,
    d_out: &Array<Vector<F, N>>,
    lse: &Array<f32>,
    delta: &Array<f32>,
    dq: &mut Array<F>,
    seq: u32,
    n_heads: u32,
    group: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] planes: usize,
    #[comptime] keys: usize,
    #[comptime] causal: bool,
    #[comptime] alibi: bool,
    #[comptime] round_bf16: bool,
    #[comptime] matrix_units: bool,
) {
    let seq = seq as usize;
    let n_heads = n_heads as usize;
    let group = group as usize;
    let units = comptime!(planes * CMMA_PLANE_SIZE);
    let queries = comptime!(planes * FRAGMENT);
    let QueryTile {
        lane,
        plane,
        unit,
        bh,
        head,
        first_query,
        q_base,
        kv_base,
    } = query_tile(seq, n_heads, group, CMMA_PLANE_SIZE, queries, head_dim);

    let query_elems = comptime!(queries * head_dim);
    let key_elems = comptime!(keys * head_dim);
    let pairs = comptime!(queries * keys);
    let block_elems = comptime!(FRAGMENT * FRAGMENT);
    let blocks = comptime!(head_dim / FRAGMENT);

    let mut q_tile = SharedMemory::<M>::new_aligned(query_elems, 128usize);
    let mut do_tile = SharedMemory::<M>::new_aligned(query_elems, 128usize);
    let mut k_tile = SharedMemory::<M>::new_aligned(key_elems, 128usize);
    let mut v_tile = SharedMemory::<M>::new_aligned(key_elems, 128usize);
    // Scores and `d_out v^T`, `[query][key]`.
    let mut s_tile = SharedMemory::<f32>::new_aligned(pairs, 128usize);
    let mut dp_tile = SharedMemory::<f32>::new_aligned(pairs, 128usize);
    let mut ds_tile = SharedMemory::<M>::new_aligned(pairs, 128usize);
    let mut dq_block = SharedMemory::<f32>::new_aligned(comptime!(planes * block_elems), 128usize);
    let mut lse_tile = SharedMemory::<f32>::new_aligned(queries, 128usize);
    let mut delta_tile = SharedMemory::<f32>::new_aligned(queries, 128usize);

    let mut slope = 0.0f32;
    if alibi {
        slope = slopes[head];
    }
    // Query rows past `seq` are zeros and are never written.
    stage_row_pair::<F, M, N>(
        q,
        d_out,
        &mut q_tile,
        &mut do_tile,
        q_base,
        first_query,
        seq,
        unit,
        query_elems,
        units,
        head_dim,
        head_dim,
        round_bf16,
    );
    for i in 0..comptime!(queries.div_ceil(units)) {
        let r = unit + i * units;
        if r < queries {
            let row = bh * seq + min(first_query + r, seq - 1);
            lse_tile[r] = lse[row];
            delta_tile[r] = delta[row];
        }
    }
    let mut dq_acc = Array::<f32>::new(comptime!(blocks * PER_LANE));
    for i in 0..comptime!(blocks * PER_LANE) {
        dq_acc[i] = 0.0f32;
    }

    let mut key_end = seq;
    if causal {
        key_end = min(first_query + queries, seq);
    }
    let plane_rows = plane * FRAGMENT;
    let plane_block = plane * block_elems;
    let lens = comptime!((query_elems, key_elems, pairs));

    let mut first_key = 0usize;
    while first_key < key_end {
        // The previous step's reads of the key-side tiles are done (and,
        // on the first step, the query-side tiles written).
        sync_cube();
        stage_row_pair::<F, M, N>(
            k,
            v,
            &mut k_tile,
            &mut v_tile,
            kv_base,
            first_key,
            seq,
            unit,
            key_elems,
            units,
            head_dim,
            head_dim,
            round_bf16,
        );
        sync_cube();

        // Query rows as A (row-major), key rows as B^T (column-major).
        #[unroll(matrix_units)]
        for nb in 0..comptime!(keys / FRAGMENT) {
            let to = plane_rows * keys + nb * FRAGMENT;
            fragment_product::<M>(
                &q_tile,
                plane_rows * head_dim,
                &k_tile,
                nb * FRAGMENT * head_dim,
                &mut s_tile,
                to,
                lane,
                comptime!((head_dim, head_dim, keys)),
                lens,
                head_dim,
                true,
                matrix_units,
            );
            fragment_product::<M>(
                &do_tile,
                plane_rows * head_dim,
                &v_tile,
                nb * FRAGMENT * head_dim,
                &mut dp_tile,
                to,
                lane,
                comptime!((head_dim, head_dim, keys)),
                lens,
                head_dim,
                true,
                matrix_units,
            );
        }
        sync_cube();

        for i in 0..comptime!(pairs / units) {
            let e = unit + i * units;
            let r = e / keys;
            let c = e % keys;
            let query = first_query + r;
            let key = first_key + c;
            let score = pair_score(s_tile[e], scale, slope, query, key, alibi);
            let p = f32::exp(score - lse_tile[r]);
            let ds = p * (dp_tile[e] - delta_tile[r]);
            ds_tile[e] = M::cast_from(select(visible(query, key, seq, causal), ds, 0.0f32));
        }
        sync_cube();

        // dQ += ds k: A is the plane's rows of `[query][key]`, B the key
        // rows (row-major).
        #[unroll(matrix_units)]
        for db in 0..blocks {
            fragment_product::<M>(
                &ds_tile,
                plane_rows * keys,
                &k_tile,
                db * FRAGMENT,
                &mut dq_block,
                plane_block,
                lane,
                comptime!((keys, head_dim, FRAGMENT)),
                comptime!((pairs, key_elems, planes * block_elems)),
                keys,
                false,
                matrix_units,
            );
            sync_block(matrix_units);
            #[unroll(matrix_units)]
            for j in 0..PER_LANE {
                dq_acc[db * PER_LANE + j] += dq_block[plane_block + lane + j * CMMA_PLANE_SIZE];
            }
            // Every unit has read the block before the next is stored.
            sync_block(matrix_units);
        }
        first_key += keys;
    }

    #[unroll(matrix_units)]
    for db in 0..blocks {
        #[unroll(matrix_units)]
        for j in 0..PER_LANE {
            let e = lane + j * CMMA_PLANE_SIZE;
            let query = first_query + plane_rows + e / FRAGMENT;
            if query < seq {
                let at = q_base + query * head_dim + db * FRAGMENT + e % FRAGMENT;
                dq[at] = store::<F>(dq_acc[db * PER_LANE + j] * scale, round_bf16);
            }
        }
    }
}
