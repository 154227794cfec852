//! FlashAttention-2 forward as the paper's CUDA kernel runs it: each plane
//! owns 16 query rows and keeps their scores, probabilities and output
//! accumulators in its units' registers, both products on
//! [`super::mma::mma`] (PTX `mma.sync.m16n8k16` on the matrix units, or
//! its plain-unit form, which is how the tests check it on lavapipe). Only
//! the key and value tiles, and the query rows once, pass through shared
//! memory. Writes the same
//! outputs as the other forward kernels (output and per-row log-sum-exp),
//! so every backward consumes them.

use cubecl::prelude::*;

use super::cube_tile::{query_tile, QueryTile};
use super::mma::{
    accumulate_with_columns, c_col, products_with_rows, quad_max, quad_sum, store_accumulators,
    Pair, A_PAIRS, C_PAIRS, MMA_COLS, MMA_DEPTH, MMA_PLANE_SIZE, MMA_ROWS, MMA_SCRATCH,
};
use super::stage::{a_through_tile, stage_row_pair};
use super::tiles::{all_visible, fast_exp, pair_score, visible, NEG_LARGE};

/// Values each row of the key and value tiles is padded by: 16 bytes of a
/// 16-bit type, so that the rows one operand load reads (8 rows, 4
/// columns apart) fall in distinct shared-memory banks.
pub(crate) const TILE_PAD: usize = 8;

/// One cube per `16 * planes` query rows of one `(batch, head)`, `planes`
/// planes of 32 units; plane `p` owns query rows `16 p .. 16 p + 16` of the
/// cube, and unit `lane` of it rows `lane / 4` and `lane / 4 + 8` of
/// those (`mma.rs`'s accumulator layout). Each unit loads its share of the
/// plane's query rows once, as the left operand of `q k^T`, `head_dim / 16`
/// products deep (staged through the key tile, [`a_through_tile`]). Then for each tile of `keys` keys up to the causal end
/// (the cube's last row):
///
/// 1. the units stage the key and the value tile in shared memory as `M`
///    (rows [`TILE_PAD`] values longer than `head_dim`);
/// 2. each plane computes its `16 x keys` scores, `keys / 8` accumulators
///    of `head_dim / 16` products each;
/// 3. each unit scales, biases and masks its scores, takes its rows' new
///    running maxima over its group of four units, rescales its output
///    accumulators and running partial sums, and exponentiates the scores
///    in place into probabilities;
/// 4. the probabilities, rounded to `M`, are the left operand of `p v`
///    as they lie (two score accumulators are one left operand), and each
///    plane adds `p v` to its `16 x head_dim` output accumulators,
///    `head_dim / 8` of them, `keys / 16` products deep.
///
/// At the end each row's sum is the sum of its four units' partial sums.
/// Rows and keys past `seq` are staged as zeros and masked. Numerics as the
/// fragment forward's: f32 scores, softmax and accumulators; probabilities
/// rounded to `M` before the second product.
///
/// With `matrix_units` the products are the device's `mma` instruction and
/// the group reductions plane shuffles; there are two cube barriers per
/// key tile. Every loop over registers is unrolled there, so that the
/// arrays stay in registers. On plain units every product and reduction
/// adds cube barriers (`mma.rs`).
///
/// Cube grid: `x` = tile of `16 * planes` query rows, `y` = `batch *
/// n_heads + head`; cube dim `(32, planes)`. Layouts as
/// [`super::forward::attention_forward_kernel`]'s.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_forward_mma_kernel<F: Float, M: Float, N: Size>(
    q: &Array<Vector<F, N>>,
    k: &Array<Vector<F, N>>,
    v: &Array<Vector<F, N>>,
    slopes: &Array<f32>,
    out: &mut Array<F>,
    lse: &mut Array<f32>,
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
    // This unit's two rows (accumulator values 0, 1 and 2, 3).
    let plane_first = first_query + plane * MMA_ROWS;
    let row_top = plane_first + lane / 4;

    let depth_steps = comptime!(head_dim / MMA_DEPTH);
    let key_blocks = comptime!(keys / MMA_COLS);
    let key_steps = comptime!(keys / MMA_DEPTH);
    let dim_blocks = comptime!(head_dim / MMA_COLS);
    let tile_elems = comptime!(keys * head_dim);
    // Tile rows padded by 8 values: the 8 units of a group column read
    // 8 rows at one column, which would otherwise share a bank.
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

    // The plane's query rows as left operands, one per 16 columns, staged
    // through the key tile.
    let mut q_regs = Array::<Pair<M>>::new(comptime!(depth_steps * A_PAIRS));
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
    let mut out_acc = Array::<Pair<f32>>::new(comptime!(dim_blocks * C_PAIRS));
    #[unroll(matrix_units)]
    for i in 0..comptime!(dim_blocks * C_PAIRS) {
        out_acc[i] = Pair::<f32>::new(0.0f32);
    }
    let mut scores = Array::<Pair<f32>>::new(comptime!(key_blocks * C_PAIRS));
    let mut probs = Array::<Pair<M>>::new(comptime!(key_steps * A_PAIRS));
    // Running maxima and this unit's partial sums of its two rows.
    let mut row_max = Array::<f32>::new(2usize);
    let mut row_sum = Array::<f32>::new(2usize);
    #[unroll]
    for h in 0..2usize {
        row_max[h] = f32::new(NEG_LARGE);
        row_sum[h] = 0.0f32;
    }

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
            tile_elems,
            units,
            head_dim,
            stride,
            round_bf16,
        );
        sync_cube();

        // Scores: block `j` holds keys `8 j ..`; `k^T`'s value (d, key) is
        // the key tile's (key, d).
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

        // Whether every score of the plane's rows in this tile is visible
        // (then none is masked).
        let whole = all_visible(plane_first, MMA_ROWS, first_key, keys, seq, causal);
        online_softmax(
            &mut scores,
            &mut row_max,
            &mut row_sum,
            &mut out_acc,
            &mut scratch,
            row_top,
            first_key,
            seq,
            whole,
            scale,
            slope,
            plane_at,
            lane,
            key_blocks,
            dim_blocks,
            causal,
            alibi,
            matrix_units,
        );
        // Score accumulators `2 s` and `2 s + 1` are, pair for pair, the
        // left operand of keys `16 s ..`.
        #[unroll(matrix_units)]
        for i in 0..comptime!(key_steps * A_PAIRS) {
            probs[i] = Pair::<M>::cast_from(scores[i]);
        }

        // Output block `n` (columns `8 n ..`) += p v.
        accumulate_with_columns::<M>(
            &probs,
            &v_tile,
            &mut out_acc,
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

    let mut sums = Array::<f32>::new(2usize);
    let mut reciprocal = Array::<f32>::new(2usize);
    #[unroll]
    for h in 0..2usize {
        sums[h] = quad_sum(row_sum[h], &mut scratch, plane_at, lane, matrix_units);
        reciprocal[h] = 1.0f32 / sums[h];
    }
    store_accumulators::<F>(
        out,
        &out_acc,
        &reciprocal,
        q_base,
        row_top,
        seq,
        lane,
        head_dim,
        round_bf16,
        matrix_units,
    );
    // The group's first unit writes its rows' log-sum-exp.
    let in_group = lane % 4;
    #[unroll]
    for h in 0..2usize {
        let row = row_top + 8 * h;
        if row < seq && in_group == 0 {
            lse[bh * seq + row] = row_max[h] + f32::ln(sums[h]);
        }
    }
}

/// Step 3 of [`attention_forward_mma_kernel`] for one unit: `scores` (its
/// `key_blocks` accumulators, pair `2 j + h` holding row `row_top + 8 h`'s
/// products `q . k` at keys `first_key + 8 j + 2 (lane % 4) ..+ 2`) become
/// probabilities: masked (unless the plane's whole tile is visible,
/// `whole`) and exponentiated against the rows' new running maxima
/// (`row_max`, of scaled and biased scores, over the unit's group of four);
/// the rows' partial sums `row_sum` and output accumulators `out_acc`
/// (pair `2 n + h`) are rescaled to the new maxima and the partial sums
/// take the new probabilities.
///
/// Without ALiBi the scores stay unscaled until the exponent, `exp(scale
/// * s - max)`, one fused multiply-add (`scale` is positive, so the
/// largest unscaled score times `scale` is the largest scaled one); with
/// ALiBi they are scaled and biased first. The exponential is
/// [`fast_exp`]: its inputs are rounded to `M` as the next product's
/// operands.
#[cube]
#[allow(clippy::too_many_arguments)]
fn online_softmax(
    scores: &mut Array<Pair<f32>>,
    row_max: &mut Array<f32>,
    row_sum: &mut Array<f32>,
    out_acc: &mut Array<Pair<f32>>,
    scratch: &mut SharedMemory<f32>,
    row_top: usize,
    first_key: usize,
    seq: usize,
    whole: bool,
    scale: f32,
    slope: f32,
    plane_at: usize,
    lane: usize,
    #[comptime] key_blocks: usize,
    #[comptime] dim_blocks: usize,
    #[comptime] causal: bool,
    #[comptime] alibi: bool,
    #[comptime] matrix_units: bool,
) {
    // What multiplies a score in the exponent: `scale`, or 1 where the
    // scores were scaled in place (ALiBi).
    let mut exponent_scale = scale;
    if alibi {
        exponent_scale = 1.0f32;
    }
    #[unroll]
    for h in 0..2usize {
        let row = row_top + 8 * h;
        let old_max = row_max[h];
        // One branch for the plane (its rows share `whole`), so that the
        // tiles without a masked score skip the per-score test.
        let top = if whole {
            score_row(
                scores,
                h,
                row,
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
            )
        } else {
            score_row(
                scores,
                h,
                row,
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
            )
        };
        // Key 0 (in the first tile) is visible to every row below `seq`,
        // so such a row's maximum is a real score from then on and a
        // masked score's probability is exactly 0.
        let tile_max = quad_max(top, scratch, plane_at, lane, matrix_units) * exponent_scale;
        let new_max = max(old_max, tile_max);
        let rescale = fast_exp(old_max - new_max);
        row_max[h] = new_max;
        let mut sum = 0.0f32;
        #[unroll(matrix_units)]
        for j in 0..key_blocks {
            let mut pair = scores[j * C_PAIRS + h];
            #[unroll]
            for e in 0..2usize {
                let p = fast_exp(pair[e] * exponent_scale - new_max);
                pair[e] = p;
                sum += p;
            }
            scores[j * C_PAIRS + h] = pair;
        }
        row_sum[h] = row_sum[h] * rescale + sum;
        #[unroll(matrix_units)]
        for n in 0..dim_blocks {
            out_acc[n * C_PAIRS + h] = out_acc[n * C_PAIRS + h] * Pair::<f32>::new(rescale);
        }
    }
}

/// Row `row`'s scores of this unit (pairs `2 j + h` of `scores`): with
/// `alibi` scaled and biased in place, else left as they are; with
/// `masked` masked to [`NEG_LARGE`] ([`visible`]); returns their maximum.
#[cube]
#[allow(clippy::too_many_arguments)]
fn score_row(
    scores: &mut Array<Pair<f32>>,
    h: usize,
    row: usize,
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
) -> f32 {
    let mut top = f32::new(NEG_LARGE);
    #[unroll(matrix_units)]
    for j in 0..key_blocks {
        let mut pair = scores[j * C_PAIRS + h];
        #[unroll]
        for e in 0..2usize {
            let key = first_key + j * MMA_COLS + c_col(lane, e);
            let mut score = pair[e];
            if alibi {
                score = pair_score(score, scale, slope, row, key, true);
            }
            if masked {
                score = select(visible(row, key, seq, causal), score, f32::new(NEG_LARGE));
            }
            pair[e] = score;
            top = max(top, score);
        }
        scores[j * C_PAIRS + h] = pair;
    }
    top
}
