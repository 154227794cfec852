//! FlashAttention-2 backward, query side (dQ by a separate pass, no
//! atomics), with everything a plane owns in its units' registers
//! ([`super::mma`], as the register forward).

use cubecl::prelude::*;

use super::cube_tile::{query_tile, QueryTile};
use super::mma::{
    accumulate_with_columns, c_col, products_with_rows, store_accumulators, Pair, A_PAIRS, C_PAIRS,
    MMA_COLS, MMA_DEPTH, MMA_PLANE_SIZE, MMA_ROWS, MMA_SCRATCH,
};
use super::mma_forward::TILE_PAD;
use super::stage::{a_through_tile, stage_row_pair};
use super::tiles::{all_visible, pair_gradient};

/// One cube per `16 * planes` query rows of one `(batch, head)`, `planes`
/// planes of 32 units; plane `p` owns query rows `16 p .. 16 p + 16` of the
/// cube, and unit `lane` of it rows `lane / 4` and `lane / 4 + 8` of those
/// (`mma.rs`'s accumulator layout), with their log-sum-exp and `delta`.
/// Each unit loads its share of the plane's `q` and `d_out` rows once, as
/// left operands (staged through the key and the value tile,
/// [`a_through_tile`]). Then for each tile of `keys` key rows up to the causal
/// end (the cube's last query):
///
/// 1. the units stage the tile's `k` and `v` rows as `M` (rows padded by
///    [`TILE_PAD`]);
/// 2. each plane computes its rows' scores `q k^T` and `d_out v^T` (`16 x
///    keys`, f32, in registers);
/// 3. each unit forms `ds = p * (dp - delta)` with `p = exp(scale * s +
///    bias - lse)`, 0 where masked, in place;
/// 4. `ds`, rounded to `M`, is the left operand of `ds k` as it lies, and
///    each plane adds `ds k` to its dQ accumulators (`head_dim / 8` of
///    them).
///
/// Finally `dq = scale * dq`, rounded to `F` once. Barriers as the
/// register forward's: two cube barriers per key tile on the matrix units.
///
/// Cube grid: `x` = tile of `16 * planes` query rows, `y` = `batch *
/// n_heads + head`; cube dim `(32, planes)`. Layouts as
/// [`super::backward_q::attention_backward_q_kernel`]'s.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward_q_mma_kernel<F: Float, M: Float, N: Size>(
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
    let units = comptime!(planes * MMA_PLANE_SIZE);
    let rows = comptime!(planes * MMA_ROWS);
    let QueryTile {
        lane,
        plane,
        unit,
        bh,
        head,
        first_query,
        q_base,
        kv_base,
    } = query_tile(seq, n_heads, group, MMA_PLANE_SIZE, rows, head_dim);
    let plane_first = first_query + plane * MMA_ROWS;
    let row_top = plane_first + lane / 4;

    let depth_steps = comptime!(head_dim / MMA_DEPTH);
    let key_blocks = comptime!(keys / MMA_COLS);
    let key_steps = comptime!(keys / MMA_DEPTH);
    let dim_blocks = comptime!(head_dim / MMA_COLS);
    let stride = comptime!(head_dim + TILE_PAD);

    let mut k_tile = SharedMemory::<M>::new_aligned(comptime!(keys * stride), 128usize);
    let mut v_tile = SharedMemory::<M>::new_aligned(comptime!(keys * stride), 128usize);
    let mut scratch = SharedMemory::<f32>::new(comptime!(if matrix_units {
        1
    } else {
        planes * MMA_SCRATCH
    }));
    let plane_at = plane * MMA_SCRATCH;

    let mut slope = 0.0f32;
    if alibi {
        slope = slopes[head];
    }
    // The plane's query rows and their output gradients as left operands,
    // one per 16 columns, staged through the key and the value tile.
    let mut q_regs = Array::<Pair<M>>::new(comptime!(depth_steps * A_PAIRS));
    let mut do_regs = Array::<Pair<M>>::new(comptime!(depth_steps * A_PAIRS));
    a_through_tile::<F, M, N>(
        q,
        &mut q_regs,
        &mut k_tile,
        &mut scratch,
        q_base,
        first_query,
        seq,
        unit,
        plane,
        plane_at,
        lane,
        rows,
        keys,
        units,
        head_dim,
        stride,
        round_bf16,
        matrix_units,
    );
    a_through_tile::<F, M, N>(
        d_out,
        &mut do_regs,
        &mut v_tile,
        &mut scratch,
        q_base,
        first_query,
        seq,
        unit,
        plane,
        plane_at,
        lane,
        rows,
        keys,
        units,
        head_dim,
        stride,
        round_bf16,
        matrix_units,
    );
    let mut row_lse = Array::<f32>::new(2usize);
    let mut row_delta = Array::<f32>::new(2usize);
    #[unroll]
    for h in 0..2usize {
        let at = bh * seq + min(row_top + 8 * h, seq - 1);
        row_lse[h] = lse[at];
        row_delta[h] = delta[at];
    }
    let mut dq_acc = Array::<Pair<f32>>::new(comptime!(dim_blocks * C_PAIRS));
    #[unroll(matrix_units)]
    for i in 0..comptime!(dim_blocks * C_PAIRS) {
        dq_acc[i] = Pair::<f32>::new(0.0f32);
    }
    let mut scores = Array::<Pair<f32>>::new(comptime!(key_blocks * C_PAIRS));
    let mut dps = Array::<Pair<f32>>::new(comptime!(key_blocks * C_PAIRS));
    let mut ds_ops = Array::<Pair<M>>::new(comptime!(key_steps * A_PAIRS));

    let mut key_end = seq;
    if causal {
        key_end = min(first_query + comptime!(planes * MMA_ROWS), seq);
    }
    let mut first_key = 0usize;
    while first_key < key_end {
        // The previous step's reads of both tiles are done.
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
            comptime!(keys * head_dim),
            units,
            head_dim,
            stride,
            round_bf16,
        );
        sync_cube();

        // Block `j` of both holds keys `8 j ..`.
        products_with_rows::<M>(
            &q_regs,
            &k_tile,
            &mut scores,
            &mut scratch,
            plane_at,
            lane,
            key_blocks,
            depth_steps,
            stride,
            matrix_units,
        );
        products_with_rows::<M>(
            &do_regs,
            &v_tile,
            &mut dps,
            &mut scratch,
            plane_at,
            lane,
            key_blocks,
            depth_steps,
            stride,
            matrix_units,
        );

        // Whether every pair of the plane's rows and the tile's keys is
        // visible (then none is masked), as in the register forward.
        if all_visible(plane_first, MMA_ROWS, first_key, keys, seq, causal) {
            score_gradients(
                &mut scores,
                &dps,
                &row_lse,
                &row_delta,
                row_top,
                first_key,
                seq,
                scale,
                slope,
                lane,
                key_blocks,
                causal,
                alibi,
                false,
                matrix_units,
            );
        } else {
            score_gradients(
                &mut scores,
                &dps,
                &row_lse,
                &row_delta,
                row_top,
                first_key,
                seq,
                scale,
                slope,
                lane,
                key_blocks,
                causal,
                alibi,
                true,
                matrix_units,
            );
        }
        // Score accumulators `2 s` and `2 s + 1` are the left operand of
        // keys `16 s ..`.
        #[unroll(matrix_units)]
        for i in 0..comptime!(key_steps * A_PAIRS) {
            ds_ops[i] = Pair::<M>::cast_from(scores[i]);
        }

        // dQ block `n` (columns `8 n ..`) += ds k.
        accumulate_with_columns::<M>(
            &ds_ops,
            &k_tile,
            &mut dq_acc,
            &mut scratch,
            plane_at,
            lane,
            dim_blocks,
            key_steps,
            stride,
            2usize,
            matrix_units,
        );
        first_key += keys;
    }

    let mut factors = Array::<f32>::new(2usize);
    factors[0] = scale;
    factors[1] = scale;
    store_accumulators::<F>(
        dq,
        &dq_acc,
        &factors,
        q_base,
        row_top,
        seq,
        lane,
        head_dim,
        round_bf16,
        matrix_units,
    );
}

/// Step 3 of [`attention_backward_q_mma_kernel`] for one unit: `scores`
/// (pairs `2 j + h`: row `row_top + 8 h`'s products `q . k` at keys
/// `first_key + 8 j + 2 (lane % 4) ..+ 2`) become, in place, `ds = p * (dp
/// - delta)` with `p = exp(scale * s + bias - lse)` and `dp` the same
/// pairs of `dps` (`d_out . v`); with `masked`, 0 where the pair is not
/// [`super::tiles::visible`] (a plane's tiles other than the diagonal one and the
/// sequence's end have none, and skip the test).
#[cube]
#[allow(clippy::too_many_arguments)]
fn score_gradients(
    scores: &mut Array<Pair<f32>>,
    dps: &Array<Pair<f32>>,
    row_lse: &Array<f32>,
    row_delta: &Array<f32>,
    row_top: usize,
    first_key: usize,
    seq: usize,
    scale: f32,
    slope: f32,
    lane: usize,
    #[comptime] key_blocks: usize,
    #[comptime] causal: bool,
    #[comptime] alibi: bool,
    #[comptime] masked: bool,
    #[comptime] matrix_units: bool,
) {
    #[unroll]
    for h in 0..2usize {
        let query = row_top + 8 * h;
        #[unroll(matrix_units)]
        for j in 0..key_blocks {
            let mut s = scores[j * C_PAIRS + h];
            let dp = dps[j * C_PAIRS + h];
            #[unroll]
            for e in 0..2usize {
                let key = first_key + j * MMA_COLS + c_col(lane, e);
                let step = pair_gradient(
                    s[e],
                    dp[e],
                    row_lse[h],
                    row_delta[h],
                    scale,
                    slope,
                    query,
                    key,
                    seq,
                    causal,
                    alibi,
                    masked,
                );
                s[e] = step[1];
            }
            scores[j * C_PAIRS + h] = s;
        }
    }
}
