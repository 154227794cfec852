//! FlashAttention-2 forward with both products (`q k^T` and `p v`) in
//! 16 x 16 x 16 fragments ([`super::fragment::fragment_product`]): on the
//! device's matrix units (CubeCL's `cmma`: tensor cores on CUDA) with
//! 16-bit operands, or on plain units (how the tests check it on
//! lavapipe). Writes the same outputs as the row and tiled kernels (output
//! and per-row log-sum-exp), so every backward consumes them.

use cubecl::prelude::*;

use crate::dtype::store;

use super::cube_tile::{query_tile, QueryTile};
use super::fragment::{fragment_product, sync_block, CMMA_PLANE_SIZE, FRAGMENT, PER_LANE};
use super::stage::stage_rows;
use super::tiles::{pair_score, visible, NEG_LARGE};

/// One cube per `16 * planes` query rows of one `(batch, head)`, `planes`
/// planes of 32 units; plane `p` owns query rows `16 p .. 16 p + 16` of the
/// cube and keeps their `16 x head_dim` output accumulators in registers,
/// [`PER_LANE`] per unit and 16-column block. The query tile is staged once
/// in shared memory as `M`; then for each tile of `keys` keys up to the
/// causal end (the cube's last row):
///
/// 1. the units stage the key tile as `M`;
/// 2. each plane computes its rows' `16 x keys` scores (f32);
/// 3. the units stage the value tile over the key tile while the two units
///    of each row (units `2 r` and `2 r + 1`, of the row's plane) each
///    scale, bias and mask half of the row's scores and take their
///    maximum; after a barrier both take the row's new running maximum
///    from the two halves, write their halves' probabilities as `M` and
///    their partial sums; the row's first unit updates the running sum
///    after the next barrier;
/// 4. each plane multiplies its probabilities by the value tile, one
///    16-column block of `head_dim` at a time, and each unit rescales its
///    share of the block's accumulators and adds the product.
///
/// Rows and keys past `seq` are staged as zeros and masked. Numerics: the
/// scores, softmax and accumulators are f32 as in the other kernels; the
/// probabilities are rounded to `M` before the second product
/// (FlashAttention-2's scheme), so with 16-bit `M` the output carries up to
/// one more unit roundoff of `M` relative to the values' magnitude.
///
/// With `matrix_units` the products run on `cmma`; the output blocks are
/// guarded by [`sync_block`], every other barrier is a cube barrier.
///
/// Cube grid: `x` = tile of `16 * planes` query rows, `y` = `batch *
/// n_heads + head`; cube dim `(32, planes)`. Layouts as
/// [`super::forward::attention_forward_kernel`]'s.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_forward_fragment_kernel<F: Float, M: Float, N: Size>(
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
    let units = comptime!(planes * CMMA_PLANE_SIZE);
    let rows = comptime!(planes * FRAGMENT);
    let QueryTile {
        lane,
        plane,
        unit,
        bh,
        head,
        first_query,
        q_base,
        kv_base,
    } = query_tile(seq, n_heads, group, CMMA_PLANE_SIZE, rows, head_dim);

    let query_elems = comptime!(rows * head_dim);
    let key_elems = comptime!(keys * head_dim);
    let pairs = comptime!(rows * keys);
    let block_elems = comptime!(FRAGMENT * FRAGMENT);
    let blocks = comptime!(head_dim / FRAGMENT);
    // Keys of a row each of its two units takes per step.
    let half = comptime!(keys / 2);

    let mut q_tile = SharedMemory::<M>::new_aligned(query_elems, 128usize);
    let mut kv_tile = SharedMemory::<M>::new_aligned(key_elems, 128usize);
    // Scores and probabilities, `[row][key]`.
    let mut scores = SharedMemory::<f32>::new_aligned(pairs, 128usize);
    let mut probs = SharedMemory::<M>::new_aligned(pairs, 128usize);
    let mut block_out = SharedMemory::<f32>::new_aligned(comptime!(planes * block_elems), 128usize);
    let mut row_max = SharedMemory::<f32>::new_aligned(rows, 128usize);
    let mut row_sum = SharedMemory::<f32>::new_aligned(rows, 128usize);
    let mut row_rescale = SharedMemory::<f32>::new_aligned(rows, 128usize);
    let mut part_max = SharedMemory::<f32>::new_aligned(units, 128usize);
    let mut part_sum = SharedMemory::<f32>::new_aligned(units, 128usize);

    let mut slope = 0.0f32;
    if alibi {
        slope = slopes[head];
    }

    // Rows past `seq` are zeros and are never written.
    stage_rows::<F, M, N>(
        q,
        &mut q_tile,
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
    let mut acc = Array::<f32>::new(comptime!(blocks * PER_LANE));
    for i in 0..comptime!(blocks * PER_LANE) {
        acc[i] = 0.0f32;
    }
    if unit < rows {
        row_max[unit] = f32::new(NEG_LARGE);
        row_sum[unit] = 0.0f32;
    }

    let mut key_end = seq;
    if causal {
        key_end = min(first_query + rows, seq);
    }
    let plane_rows = plane * FRAGMENT;
    let plane_block = plane * block_elems;
    // This unit's half row of the softmax: row `unit / 2`, keys from
    // `first_col` of each step.
    let row = unit / 2;
    let side = unit % 2;
    let row_query = first_query + row;
    let first_col = side * half;
    let at = row * keys + first_col;

    let mut first_key = 0usize;
    while first_key < key_end {
        // The previous step's reads of `kv_tile` and `probs` are done (and,
        // on the first step, the query tile and the row statistics are
        // written).
        sync_cube();
        stage_rows::<F, M, N>(
            k,
            &mut kv_tile,
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
            fragment_product::<M>(
                &q_tile,
                plane_rows * head_dim,
                &kv_tile,
                nb * FRAGMENT * head_dim,
                &mut scores,
                plane_rows * keys + nb * FRAGMENT,
                lane,
                comptime!((head_dim, head_dim, keys)),
                comptime!((query_elems, key_elems, pairs)),
                head_dim,
                true,
                matrix_units,
            );
        }
        sync_cube();

        // The value tile replaces the key tile (every score is computed).
        stage_rows::<F, M, N>(
            v,
            &mut kv_tile,
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
        // Masked scores are `NEG_LARGE`. Key 0 (in the first step) is
        // visible to every row below `seq`, so each such row's running
        // maximum is a real score after the first step.
        let old_max = row_max[row];
        let mut top = old_max;
        for c in 0..half {
            let key = first_key + first_col + c;
            let score = select(
                visible(row_query, key, seq, causal),
                pair_score(scores[at + c], scale, slope, row_query, key, alibi),
                f32::new(NEG_LARGE),
            );
            scores[at + c] = score;
            top = max(top, score);
        }
        part_max[unit] = top;
        sync_cube();

        // Both units of the row read `row_max` above, before this write.
        let new_max = max(part_max[2 * row], part_max[2 * row + 1]);
        let mut sum = 0.0f32;
        for c in 0..half {
            let p = select(
                visible(row_query, first_key + first_col + c, seq, causal),
                f32::exp(scores[at + c] - new_max),
                0.0f32,
            );
            probs[at + c] = M::cast_from(p);
            sum += p;
        }
        part_sum[unit] = sum;
        if side == 0 {
            row_max[row] = new_max;
            row_rescale[row] = f32::exp(old_max - new_max);
        }
        sync_cube();

        if side == 0 {
            row_sum[row] = row_sum[row] * row_rescale[row] + part_sum[unit] + part_sum[unit + 1];
        }
        // Out += p v: A is the plane's rows of `[row][key]`, B the value
        // rows (row-major).
        #[unroll(matrix_units)]
        for db in 0..blocks {
            fragment_product::<M>(
                &probs,
                plane_rows * keys,
                &kv_tile,
                db * FRAGMENT,
                &mut block_out,
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
                let e = lane + j * CMMA_PLANE_SIZE;
                let i = db * PER_LANE + j;
                acc[i] =
                    acc[i] * row_rescale[plane_rows + e / FRAGMENT] + block_out[plane_block + e];
            }
            // Every lane has read the block before the next one is stored.
            sync_block(matrix_units);
        }
        first_key += keys;
    }
    // The last step's running sums are written.
    sync_cube();

    #[unroll(matrix_units)]
    for db in 0..blocks {
        #[unroll(matrix_units)]
        for j in 0..PER_LANE {
            let e = lane + j * CMMA_PLANE_SIZE;
            let r = plane_rows + e / FRAGMENT;
            let query = first_query + r;
            if query < seq {
                out[q_base + query * head_dim + db * FRAGMENT + e % FRAGMENT] =
                    store::<F>(acc[db * PER_LANE + j] / row_sum[r], round_bf16);
            }
        }
    }
    if unit < rows {
        let query = first_query + unit;
        if query < seq {
            lse[bh * seq + query] = row_max[unit] + f32::ln(row_sum[unit]);
        }
    }
}
