//! FlashAttention-2 backward, key/value side, with the probabilities,
//! their gradient and each plane's dK and dV in its units' registers
//! ([`super::mma`], as the register forward).

use cubecl::prelude::*;

use super::cube_tile::{key_tile, KeyTile};
use super::mma::{
    accumulate_with_columns, add_step_with_rows, c_col, store_accumulators, Pair, A_PAIRS, C_PAIRS,
    MMA_COLS, MMA_DEPTH, MMA_PLANE_SIZE, MMA_ROWS, MMA_SCRATCH,
};
use super::mma_forward::TILE_PAD;
use super::stage::stage_row_pair;
use super::tiles::{all_visible, pair_gradient};

/// One cube per `16 * planes` key rows of one `(batch, kv_head)`, `planes`
/// planes of 32 units; plane `p` owns key rows `16 p .. 16 p + 16` of the
/// cube, and unit `lane` of it rows `lane / 4` and `lane / 4 + 8` of those
/// (`mma.rs`'s accumulator layout), with their dK and dV (`head_dim / 8`
/// accumulators each). The cube's key and value rows are staged in shared
/// memory once as `M` (rows padded by [`TILE_PAD`]). Then for each query
/// head of the group that shares this key/value head (grouped-query
/// attention: the group's sum happens here, without atomics) and each tile
/// of `queries` query rows from the causal start (the cube's first key):
///
/// 1. the units stage the tile's `q` and `d_out` rows as `M`, and its
///    log-sum-exp and `delta`;
/// 2. each plane computes its keys' transposed scores `k q^T` and `v
///    d_out^T` (`16 x queries`, f32, in registers);
/// 3. each unit forms `p = exp(scale * s + bias - lse)` and `ds = p * (dp
///    - delta)` in place, 0 where masked (causal, rows and keys past
///    `seq`);
/// 4. `p` and `ds`, rounded to `M`, are the left operands of `p^T d_out`
///    and `ds^T q` as they lie, which each plane adds to its dV and dK.
///
/// Finally `dk = scale * dk`; each gradient is rounded to `F` once.
/// Barriers as the register forward's: two cube barriers per query tile
/// on the matrix units.
///
/// Cube grid: `x` = tile of `16 * planes` key rows, `y` = `batch *
/// n_kv_heads + kv_head`; cube dim `(32, planes)`. Layouts as
/// [`super::backward_kv::attention_backward_kv_kernel`]'s.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward_kv_mma_kernel<F: Float, M: Float, N: Size>(
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
    let units = comptime!(planes * MMA_PLANE_SIZE);
    let keys = comptime!(planes * MMA_ROWS);
    let KeyTile {
        lane,
        plane,
        unit,
        batch,
        kv_head,
        first_key,
        kv_base,
    } = key_tile(seq, n_heads, group, MMA_PLANE_SIZE, keys, head_dim);
    let plane_keys = plane * MMA_ROWS;
    let key_top = first_key + plane_keys + lane / 4;

    let depth_steps = comptime!(head_dim / MMA_DEPTH);
    let query_blocks = comptime!(queries / MMA_COLS);
    let query_steps = comptime!(queries / MMA_DEPTH);
    let dim_blocks = comptime!(head_dim / MMA_COLS);
    let stride = comptime!(head_dim + TILE_PAD);

    let mut k_tile = SharedMemory::<M>::new_aligned(comptime!(keys * stride), 128usize);
    let mut v_tile = SharedMemory::<M>::new_aligned(comptime!(keys * stride), 128usize);
    let mut q_tile = SharedMemory::<M>::new_aligned(comptime!(queries * stride), 128usize);
    let mut do_tile = SharedMemory::<M>::new_aligned(comptime!(queries * stride), 128usize);
    let mut lse_tile = SharedMemory::<f32>::new_aligned(queries, 128usize);
    let mut delta_tile = SharedMemory::<f32>::new_aligned(queries, 128usize);
    let mut scratch = SharedMemory::<f32>::new(comptime!(if matrix_units {
        1
    } else {
        planes * MMA_SCRATCH
    }));
    let plane_at = plane * MMA_SCRATCH;

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
        comptime!(keys * head_dim),
        units,
        head_dim,
        stride,
        round_bf16,
    );
    let mut dk_acc = Array::<Pair<f32>>::new(comptime!(dim_blocks * C_PAIRS));
    let mut dv_acc = Array::<Pair<f32>>::new(comptime!(dim_blocks * C_PAIRS));
    #[unroll(matrix_units)]
    for i in 0..comptime!(dim_blocks * C_PAIRS) {
        dk_acc[i] = Pair::<f32>::new(0.0f32);
        dv_acc[i] = Pair::<f32>::new(0.0f32);
    }
    let mut probs = Array::<Pair<f32>>::new(comptime!(query_blocks * C_PAIRS));
    let mut grads = Array::<Pair<f32>>::new(comptime!(query_blocks * C_PAIRS));
    let mut p_ops = Array::<Pair<M>>::new(comptime!(query_steps * A_PAIRS));
    let mut ds_ops = Array::<Pair<M>>::new(comptime!(query_steps * A_PAIRS));

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
            stage_row_pair::<F, M, N>(
                q,
                d_out,
                &mut q_tile,
                &mut do_tile,
                q_base,
                first_query,
                seq,
                unit,
                comptime!(queries * head_dim),
                units,
                head_dim,
                stride,
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

            // Block `j` of both holds queries `8 j ..`; each left operand
            // (the plane's key or value rows) serves every block.
            #[unroll(matrix_units)]
            for i in 0..comptime!(query_blocks * C_PAIRS) {
                probs[i] = Pair::<f32>::new(0.0f32);
                grads[i] = Pair::<f32>::new(0.0f32);
            }
            #[unroll(matrix_units)]
            for d in 0..depth_steps {
                add_step_with_rows::<M>(
                    &k_tile,
                    &q_tile,
                    &mut probs,
                    plane_keys,
                    d,
                    &mut scratch,
                    plane_at,
                    lane,
                    query_blocks,
                    stride,
                    matrix_units,
                );
                add_step_with_rows::<M>(
                    &v_tile,
                    &do_tile,
                    &mut grads,
                    plane_keys,
                    d,
                    &mut scratch,
                    plane_at,
                    lane,
                    query_blocks,
                    stride,
                    matrix_units,
                );
            }

            // Whether every pair of the plane's keys and the tile's queries
            // is visible (then none is masked).
            let plane_first = first_key + plane_keys;
            if all_visible(first_query, queries, plane_first, MMA_ROWS, seq, causal) {
                key_gradients(
                    &mut probs,
                    &mut grads,
                    &lse_tile,
                    &delta_tile,
                    key_top,
                    first_query,
                    seq,
                    scale,
                    slope,
                    lane,
                    query_blocks,
                    causal,
                    alibi,
                    false,
                    matrix_units,
                );
            } else {
                key_gradients(
                    &mut probs,
                    &mut grads,
                    &lse_tile,
                    &delta_tile,
                    key_top,
                    first_query,
                    seq,
                    scale,
                    slope,
                    lane,
                    query_blocks,
                    causal,
                    alibi,
                    true,
                    matrix_units,
                );
            }
            // Accumulators `2 s` and `2 s + 1` are the left operand of
            // queries `16 s ..`.
            #[unroll(matrix_units)]
            for i in 0..comptime!(query_steps * A_PAIRS) {
                p_ops[i] = Pair::<M>::cast_from(probs[i]);
                ds_ops[i] = Pair::<M>::cast_from(grads[i]);
            }

            // dV block `n` (columns `8 n ..`) += p^T d_out, dK's += ds^T q.
            accumulate_with_columns::<M>(
                &p_ops,
                &do_tile,
                &mut dv_acc,
                &mut scratch,
                plane_at,
                lane,
                dim_blocks,
                query_steps,
                stride,
                1usize,
                matrix_units,
            );
            accumulate_with_columns::<M>(
                &ds_ops,
                &q_tile,
                &mut dk_acc,
                &mut scratch,
                plane_at,
                lane,
                dim_blocks,
                query_steps,
                stride,
                1usize,
                matrix_units,
            );
            first_query += queries;
        }
    }

    let mut factors = Array::<f32>::new(2usize);
    factors[0] = scale;
    factors[1] = scale;
    store_accumulators::<F>(
        dk,
        &dk_acc,
        &factors,
        kv_base,
        key_top,
        seq,
        lane,
        head_dim,
        round_bf16,
        matrix_units,
    );
    factors[0] = 1.0f32;
    factors[1] = 1.0f32;
    store_accumulators::<F>(
        dv,
        &dv_acc,
        &factors,
        kv_base,
        key_top,
        seq,
        lane,
        head_dim,
        round_bf16,
        matrix_units,
    );
}

/// Step 3 of [`attention_backward_kv_mma_kernel`] for one unit: `probs`
/// (pairs `2 j + h`: key `key_top + 8 h`'s products `k . q` with queries
/// `first_query + 8 j + 2 (lane % 4) ..+ 2`) become `p = exp(scale * s +
/// bias - lse)` and `grads` (the same pairs of `v . d_out`) `ds = p * (dp
/// - delta)`, in place, with the tile's rows' `lse` and `delta` from
/// shared memory; with `masked`, both 0 where the pair is not [`super::tiles::visible`]
/// (a plane's tiles other than the diagonal one and the sequence's end
/// have none, and skip the test).
#[cube]
#[allow(clippy::too_many_arguments)]
fn key_gradients(
    probs: &mut Array<Pair<f32>>,
    grads: &mut Array<Pair<f32>>,
    lse_tile: &SharedMemory<f32>,
    delta_tile: &SharedMemory<f32>,
    key_top: usize,
    first_query: usize,
    seq: usize,
    scale: f32,
    slope: f32,
    lane: usize,
    #[comptime] query_blocks: usize,
    #[comptime] causal: bool,
    #[comptime] alibi: bool,
    #[comptime] masked: bool,
    #[comptime] matrix_units: bool,
) {
    #[unroll]
    for h in 0..2usize {
        let key = key_top + 8 * h;
        #[unroll(matrix_units)]
        for j in 0..query_blocks {
            let mut s = probs[j * C_PAIRS + h];
            let mut dp = grads[j * C_PAIRS + h];
            #[unroll]
            for e in 0..2usize {
                let r = j * MMA_COLS + c_col(lane, e);
                let query = first_query + r;
                let step = pair_gradient(
                    s[e],
                    dp[e],
                    lse_tile[r],
                    delta_tile[r],
                    scale,
                    slope,
                    query,
                    key,
                    seq,
                    causal,
                    alibi,
                    masked,
                );
                s[e] = step[0];
                dp[e] = step[1];
            }
            probs[j * C_PAIRS + h] = s;
            grads[j * C_PAIRS + h] = dp;
        }
    }
}
