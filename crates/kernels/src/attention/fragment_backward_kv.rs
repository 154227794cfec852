//! FlashAttention-2 backward, key/value side, with its four products in
//! 16 x 16 x 16 fragments ([`super::fragment::fragment_product`]): on the
//! matrix units where the device has them, else on plain units.

use cubecl::prelude::*;

use crate::dtype::store;

use super::cube_tile::{key_tile, KeyTile};
use super::fragment::{fragment_product, sync_block, CMMA_PLANE_SIZE, FRAGMENT, PER_LANE};
use super::stage::stage_row_pair;
use super::tiles::{pair_score, visible};

/// One cube per `16 * planes` key rows of one `(batch, kv_head)`, `planes`
/// planes of 32 units; plane `p` owns key rows `16 p .. 16 p + 16` of the
/// cube and keeps their dK and dV (`16 x head_dim` each) in registers,
/// [`PER_LANE`] values per unit and 16-column block. The key and value
/// rows are staged in shared memory once as `M`. Then for each query head
/// of the group that shares this key/value head (grouped-query attention:
/// the group's sum happens here, without atomics) and each tile of
/// `queries` query rows from the causal start (the cube's first key):
///
/// 1. the units stage the tile's `q` and `d_out` rows as `M`, and its
///    log-sum-exp and `delta` rows;
/// 2. each plane computes its keys' transposed scores `k q^T` and `v
///    d_out^T` (`16 x queries`, f32);
/// 3. the units form `p = exp(scale * s + bias - lse)` and `ds = p * (dp -
///    delta)`, 0 where masked (causal, rows and keys past `seq`), and store
///    both as `M`;
/// 4. each plane adds `p^T d_out` to its dV and `ds^T q` to its dK, one
///    16-column block of `head_dim` at a time.
///
/// Finally `dk = scale * dk`. Scores, softmax and accumulators are f32;
/// `p` and `ds` are rounded to `M` before their products (FlashAttention-2's
/// scheme for 16-bit operands; with `M = f32` nothing is rounded), each
/// gradient is rounded to `F` once.
///
/// Cube grid: `x` = tile of `16 * planes` key rows, `y` = `batch *
/// n_kv_heads + kv_head`; cube dim `(32, planes)`. Layouts as
/// [`super::backward_kv::attention_backward_kv_kernel`]'s. The gradient
/// blocks are guarded by [`sync_block`] (none on plain units), every other
/// barrier is a cube barrier, so the plain form runs on devices whose
/// planes are not 32 units wide.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward_kv_fragment_kernel<F: Float, M: Float, N: Size>(
    q: &Array<Vector<F, N>>,
    k: &Array<Vector<F, N>>,
    v: &Array<Vector<F, N>>,
    slopes: &Array<f32>,
    d_out: &Array<Vector<F, N>>,
    lse: &Array<f32>,
    delta: &Array<f32>,
    dk: &mut Array<F>,
    dv: &mut Array<F>,
    seq: u32,
    n_heads: u32,
    group: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] planes: usize,
    #[comptime] queries: usize,
    #[comptime] causal: bool,
    #[comptime] alibi: bool,
    #[comptime] round_bf16: bool,
    #[comptime] matrix_units: bool,
) {
    let seq = seq as usize;
    let n_heads = n_heads as usize;
    let group = group as usize;
    let units = comptime!(planes * CMMA_PLANE_SIZE);
    let keys = comptime!(planes * FRAGMENT);
    let KeyTile {
        lane,
        plane,
        unit,
        batch,
        kv_head,
        first_key,
        kv_base,
    } = key_tile(seq, n_heads, group, CMMA_PLANE_SIZE, keys, head_dim);

    let key_elems = comptime!(keys * head_dim);
    let query_elems = comptime!(queries * head_dim);
    let pairs = comptime!(keys * queries);
    let block_elems = comptime!(FRAGMENT * FRAGMENT);
    let blocks = comptime!(head_dim / FRAGMENT);

    let mut k_tile = SharedMemory::<M>::new_aligned(key_elems, 128usize);
    let mut v_tile = SharedMemory::<M>::new_aligned(key_elems, 128usize);
    let mut q_tile = SharedMemory::<M>::new_aligned(query_elems, 128usize);
    let mut do_tile = SharedMemory::<M>::new_aligned(query_elems, 128usize);
    // Transposed scores and `d_out v^T`, `[key][query]`.
    let mut s_tile = SharedMemory::<f32>::new_aligned(pairs, 128usize);
    let mut dp_tile = SharedMemory::<f32>::new_aligned(pairs, 128usize);
    let mut p_tile = SharedMemory::<M>::new_aligned(pairs, 128usize);
    let mut ds_tile = SharedMemory::<M>::new_aligned(pairs, 128usize);
    // One dV and one dK block per plane.
    let mut dv_block = SharedMemory::<f32>::new_aligned(comptime!(planes * block_elems), 128usize);
    let mut dk_block = SharedMemory::<f32>::new_aligned(comptime!(planes * block_elems), 128usize);
    let mut lse_tile = SharedMemory::<f32>::new_aligned(queries, 128usize);
    let mut delta_tile = SharedMemory::<f32>::new_aligned(queries, 128usize);

    // Key rows past `seq` are zeros and are never written.
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
    let mut dk_acc = Array::<f32>::new(comptime!(blocks * PER_LANE));
    let mut dv_acc = Array::<f32>::new(comptime!(blocks * PER_LANE));
    for i in 0..comptime!(blocks * PER_LANE) {
        dk_acc[i] = 0.0f32;
        dv_acc[i] = 0.0f32;
    }

    // With a causal mask, queries before the cube's first key see none of
    // its keys.
    let mut query_start = 0usize;
    if causal {
        query_start = first_key;
    }
    let plane_keys = plane * FRAGMENT;
    let plane_block = plane * block_elems;
    let lens = comptime!((key_elems, query_elems, pairs));

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
            sync_cube();

            // Both products read key rows as A (row-major) and query rows
            // as B^T (column-major: element (d, query) at query * head_dim + d).
            #[unroll(matrix_units)]
            for nb in 0..comptime!(queries / FRAGMENT) {
                let to = plane_keys * queries + nb * FRAGMENT;
                fragment_product::<M>(
                    &k_tile,
                    plane_keys * head_dim,
                    &q_tile,
                    nb * FRAGMENT * head_dim,
                    &mut s_tile,
                    to,
                    lane,
                    comptime!((head_dim, head_dim, queries)),
                    lens,
                    head_dim,
                    true,
                    matrix_units,
                );
                fragment_product::<M>(
                    &v_tile,
                    plane_keys * head_dim,
                    &do_tile,
                    nb * FRAGMENT * head_dim,
                    &mut dp_tile,
                    to,
                    lane,
                    comptime!((head_dim, head_dim, queries)),
                    lens,
                    head_dim,
                    true,
                    matrix_units,
                );
            }
            sync_cube();

            for i in 0..comptime!(pairs / units) {
                let e = unit + i * units;
                let c = e / queries;
                let r = e % queries;
                let query = first_query + r;
                let key = first_key + c;
                let score = pair_score(s_tile[e], scale, slope, query, key, alibi);
                let p = f32::exp(score - lse_tile[r]);
                let ds = p * (dp_tile[e] - delta_tile[r]);
                let seen = visible(query, key, seq, causal);
                p_tile[e] = M::cast_from(select(seen, p, 0.0f32));
                ds_tile[e] = M::cast_from(select(seen, ds, 0.0f32));
            }
            sync_cube();

            // dV += p^T d_out and dK += ds^T q: A is the plane's rows of
            // `[key][query]`, B the query rows (row-major).
            #[unroll(matrix_units)]
            for db in 0..blocks {
                fragment_product::<M>(
                    &p_tile,
                    plane_keys * queries,
                    &do_tile,
                    db * FRAGMENT,
                    &mut dv_block,
                    plane_block,
                    lane,
                    comptime!((queries, head_dim, FRAGMENT)),
                    comptime!((pairs, query_elems, planes * block_elems)),
                    queries,
                    false,
                    matrix_units,
                );
                fragment_product::<M>(
                    &ds_tile,
                    plane_keys * queries,
                    &q_tile,
                    db * FRAGMENT,
                    &mut dk_block,
                    plane_block,
                    lane,
                    comptime!((queries, head_dim, FRAGMENT)),
                    comptime!((pairs, query_elems, planes * block_elems)),
                    queries,
                    false,
                    matrix_units,
                );
                sync_block(matrix_units);
                #[unroll(matrix_units)]
                for j in 0..PER_LANE {
                    let e = plane_block + lane + j * CMMA_PLANE_SIZE;
                    dv_acc[db * PER_LANE + j] += dv_block[e];
                    dk_acc[db * PER_LANE + j] += dk_block[e];
                }
                // Every unit has read the blocks before the next are stored.
                sync_block(matrix_units);
            }
            first_query += queries;
        }
    }

    #[unroll(matrix_units)]
    for db in 0..blocks {
        #[unroll(matrix_units)]
        for j in 0..PER_LANE {
            let e = lane + j * CMMA_PLANE_SIZE;
            let key = first_key + plane_keys + e / FRAGMENT;
            if key < seq {
                let at = kv_base + key * head_dim + db * FRAGMENT + e % FRAGMENT;
                dk[at] = store::<F>(dk_acc[db * PER_LANE + j] * scale, round_bf16);
                dv[at] = store::<F>(dv_acc[db * PER_LANE + j], round_bf16);
            }
        }
    }
}
