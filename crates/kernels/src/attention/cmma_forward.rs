//! FlashAttention-2 forward on matrix units: the tiled kernel's algorithm
//! with both products (`q k^T` and `p v`) on the device's
//! matrix-multiply-accumulate instructions (CubeCL's `cmma`: tensor cores
//! on CUDA), 16x16x16 fragments with 16-bit operands and f32 accumulators.
//! Writes the same outputs as the row and tiled kernels (output and per-row
//! log-sum-exp), so the same backward consumes them.

use cubecl::prelude::*;

use crate::dtype::{load, store};

use super::tiles::{alibi_bias, visible, NEG_LARGE};

/// Planes (warps) per cube; each owns [`FRAGMENT`] query rows.
pub(crate) const CMMA_PLANES: usize = 4;

/// Units per plane the kernel is written for (NVIDIA's warp).
pub(crate) const CMMA_PLANE_SIZE: usize = 32;

/// Side of the square `cmma` fragments (m = n = k = 16).
pub(crate) const FRAGMENT: usize = 16;

/// Query rows per cube: [`FRAGMENT`] per plane.
pub(crate) const CMMA_ROWS: usize = CMMA_PLANES * FRAGMENT;

/// Keys per tile.
pub(crate) const CMMA_KEYS: usize = 64;

/// Largest head dimension of the kernel (each lane keeps `head_dim / 2`
/// output accumulators in registers).
pub(crate) const CMMA_MAX_HEAD_DIM: usize = 128;

/// Shared memory of one cube, bytes: the query tile and one key/value tile
/// as 16-bit values (`rows * head_dim * 2`, `keys * head_dim * 2`), the f32 scores and
/// 16-bit probabilities of a tile (`rows * keys * (4 + 2)`), one f32
/// 16x16 fragment per plane, three f32 row statistics per row, each array
/// padded to 128 bytes.
pub(crate) fn cmma_shared_bytes(head_dim: usize) -> usize {
    let pad = |bytes: usize| bytes.next_multiple_of(128);
    pad(CMMA_ROWS * head_dim * 2)
        + pad(CMMA_KEYS * head_dim * 2)
        + pad(CMMA_ROWS * CMMA_KEYS * 4)
        + pad(CMMA_ROWS * CMMA_KEYS * 2)
        + pad(CMMA_PLANES * FRAGMENT * FRAGMENT * 4)
        + 3 * pad(CMMA_ROWS * 4)
}

/// One cube per [`CMMA_ROWS`] query rows of one `(batch, head)`, with
/// [`CMMA_PLANES`] planes of [`CMMA_PLANE_SIZE`] units; plane `p` owns rows
/// `16 p .. 16 p + 16` of the cube. The query tile is staged once in shared
/// memory as `M` (f16 or bf16, the storage type's 16-bit twin: loading
/// loses nothing); then for each tile of [`CMMA_KEYS`] keys:
///
/// 1. the units stage the key tile as `M`;
/// 2. each plane computes its `16 x keys` scores with `cmma` (f32
///    accumulators) into shared memory;
/// 3. the units stage the value tile over the key tile while one unit per
///    row scales its scores, adds the ALiBi bias, masks, updates the row's
///    running maximum and sum (f32) and writes the probabilities as `M`;
/// 4. each plane multiplies its probabilities by the value tile, one
///    16-column block of `head_dim` at a time, and each unit rescales and
///    adds its share of the block into the output accumulators it keeps in
///    registers.
///
/// Keys past `seq` are staged as zeros and masked; with a causal mask the
/// key tiles stop after the cube's last row. Numerics: the scores, softmax
/// and accumulators are f32 as in the other kernels; the probabilities
/// are rounded to `M` before the second product (FlashAttention-2's
/// scheme), so the output carries up to one more unit roundoff of `M`
/// relative to the values' magnitude.
///
/// Cube grid: `x` = tile of query rows, `y` = `batch * n_heads + head`;
/// cube dim `(CMMA_PLANE_SIZE, CMMA_PLANES)`. Layouts as
/// [`super::forward::attention_forward_kernel`]'s.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_forward_cmma_kernel<F: Float, M: Float>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    slopes: &Array<f32>,
    out: &mut Array<F>,
    lse: &mut Array<f32>,
    seq: u32,
    n_heads: u32,
    group: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] causal: bool,
    #[comptime] alibi: bool,
    #[comptime] round_bf16: bool,
) {
    let seq = seq as usize;
    let n_heads = n_heads as usize;
    let group = group as usize;
    let lane = UNIT_POS_X as usize;
    let plane = UNIT_POS_Y as usize;
    let unit = plane * CMMA_PLANE_SIZE + lane;
    let units = comptime!(CMMA_PLANES * CMMA_PLANE_SIZE);
    let bh = CUBE_POS_Y as usize;
    let head = bh % n_heads;
    let kv_bh = (bh / n_heads) * (n_heads / group) + head / group;
    let first_query = CUBE_POS_X as usize * CMMA_ROWS;
    let q_base = bh * seq * head_dim;
    let kv_base = kv_bh * seq * head_dim;

    let q_elems = comptime!(CMMA_ROWS * head_dim);
    let kv_elems = comptime!(CMMA_KEYS * head_dim);
    let tile_scores = comptime!(CMMA_ROWS * CMMA_KEYS);
    let fragment_elems = comptime!(FRAGMENT * FRAGMENT);
    // Output accumulators per lane: a plane's 16 x head_dim, 8 per lane and
    // 16-column block.
    let per_block = comptime!(fragment_elems / CMMA_PLANE_SIZE);
    let blocks = comptime!(head_dim / FRAGMENT);

    let mut q_tile = SharedMemory::<M>::new_aligned(q_elems, 128usize);
    let mut kv_tile = SharedMemory::<M>::new_aligned(kv_elems, 128usize);
    let mut scores = SharedMemory::<f32>::new_aligned(tile_scores, 128usize);
    let mut probs = SharedMemory::<M>::new_aligned(tile_scores, 128usize);
    let mut block_out =
        SharedMemory::<f32>::new_aligned(comptime!(CMMA_PLANES * fragment_elems), 128usize);
    let mut row_max = SharedMemory::<f32>::new(CMMA_ROWS);
    let mut row_sum = SharedMemory::<f32>::new(CMMA_ROWS);
    let mut row_rescale = SharedMemory::<f32>::new(CMMA_ROWS);

    let mut slope = 0.0f32;
    if alibi {
        slope = slopes[head];
    }

    // Rows past `seq` are zeros and are never written.
    for i in 0..comptime!(q_elems / units) {
        let e = unit + i * units;
        let row = first_query + e / head_dim;
        let mut x = 0.0f32;
        if row < seq {
            x = load::<F>(q[q_base + row * head_dim + e % head_dim], round_bf16);
        }
        q_tile[e] = M::cast_from(x);
    }
    let mut acc = Array::<f32>::new(comptime!(blocks * per_block));
    for i in 0..comptime!(blocks * per_block) {
        acc[i] = 0.0f32;
    }
    if unit < CMMA_ROWS {
        row_max[unit] = f32::new(NEG_LARGE);
        row_sum[unit] = 0.0f32;
    }

    let mut key_end = seq;
    if causal {
        key_end = min(first_query + CMMA_ROWS, seq);
    }
    let plane_q = plane * FRAGMENT * head_dim;
    let plane_s = plane * FRAGMENT * CMMA_KEYS;
    let plane_o = plane * fragment_elems;

    let mut first_key = 0usize;
    while first_key < key_end {
        // The previous tile's reads of `kv_tile` and `probs` are done (and,
        // on the first tile, the query tile and the row statistics are
        // written).
        sync_cube();
        stage_keys::<F, M>(
            k,
            &mut kv_tile,
            kv_base,
            first_key,
            seq,
            unit,
            head_dim,
            round_bf16,
        );
        sync_cube();

        #[unroll]
        for nb in 0..comptime!(CMMA_KEYS / FRAGMENT) {
            let s = cmma::Matrix::<f32>::from_value(
                cmma::MatrixIdent::Accumulator,
                FRAGMENT,
                FRAGMENT,
                FRAGMENT,
                cmma::MatrixLayout::Undefined,
                0.0f32,
            );
            #[unroll]
            for kb in 0..blocks {
                let a = cmma::Matrix::<M>::from_slice(
                    cmma::MatrixIdent::A,
                    FRAGMENT,
                    FRAGMENT,
                    FRAGMENT,
                    cmma::MatrixLayout::RowMajor,
                    &q_tile.slice(plane_q + kb * FRAGMENT, q_elems),
                    head_dim as u32,
                );
                // k^T: element (d, key) of the key block at key * head_dim + d.
                let b = cmma::Matrix::<M>::from_slice(
                    cmma::MatrixIdent::B,
                    FRAGMENT,
                    FRAGMENT,
                    FRAGMENT,
                    cmma::MatrixLayout::ColMajor,
                    &kv_tile.slice(nb * FRAGMENT * head_dim + kb * FRAGMENT, kv_elems),
                    head_dim as u32,
                );
                cmma::execute::<M, M, f32, f32>(&a, &b, &s, &s);
            }
            cmma::store(
                &mut scores.slice_mut(plane_s + nb * FRAGMENT, tile_scores),
                &s,
                CMMA_KEYS as u32,
                cmma::MatrixLayout::RowMajor,
            );
        }
        sync_cube();

        // The value tile replaces the key tile (every score is computed).
        stage_keys::<F, M>(
            v,
            &mut kv_tile,
            kv_base,
            first_key,
            seq,
            unit,
            head_dim,
            round_bf16,
        );
        if unit < CMMA_ROWS {
            let query = first_query + unit;
            let row = unit * CMMA_KEYS;
            let old_max = row_max[unit];
            let mut new_max = old_max;
            for c in 0..CMMA_KEYS {
                let key = first_key + c;
                let mut score = scores[row + c] * scale;
                if alibi {
                    score += alibi_bias(slope, query, key);
                }
                score = select(visible(query, key, seq, causal), score, f32::new(NEG_LARGE));
                scores[row + c] = score;
                new_max = max(new_max, score);
            }
            let rescale = f32::exp(old_max - new_max);
            let mut sum = row_sum[unit] * rescale;
            for c in 0..CMMA_KEYS {
                let p = select(
                    visible(query, first_key + c, seq, causal),
                    f32::exp(scores[row + c] - new_max),
                    0.0f32,
                );
                probs[row + c] = M::cast_from(p);
                sum += p;
            }
            row_max[unit] = new_max;
            row_sum[unit] = sum;
            row_rescale[unit] = rescale;
        }
        sync_cube();

        #[unroll]
        for db in 0..blocks {
            let o = cmma::Matrix::<f32>::from_value(
                cmma::MatrixIdent::Accumulator,
                FRAGMENT,
                FRAGMENT,
                FRAGMENT,
                cmma::MatrixLayout::Undefined,
                0.0f32,
            );
            #[unroll]
            for kb in 0..comptime!(CMMA_KEYS / FRAGMENT) {
                let a = cmma::Matrix::<M>::from_slice(
                    cmma::MatrixIdent::A,
                    FRAGMENT,
                    FRAGMENT,
                    FRAGMENT,
                    cmma::MatrixLayout::RowMajor,
                    &probs.slice(plane_s + kb * FRAGMENT, tile_scores),
                    CMMA_KEYS as u32,
                );
                let b = cmma::Matrix::<M>::from_slice(
                    cmma::MatrixIdent::B,
                    FRAGMENT,
                    FRAGMENT,
                    FRAGMENT,
                    cmma::MatrixLayout::RowMajor,
                    &kv_tile.slice(kb * FRAGMENT * head_dim + db * FRAGMENT, kv_elems),
                    head_dim as u32,
                );
                cmma::execute::<M, M, f32, f32>(&a, &b, &o, &o);
            }
            cmma::store(
                &mut block_out.slice_mut(plane_o, plane_o + fragment_elems),
                &o,
                FRAGMENT as u32,
                cmma::MatrixLayout::RowMajor,
            );
            sync_plane();
            #[unroll]
            for j in 0..per_block {
                let e = lane + j * CMMA_PLANE_SIZE;
                let r = plane * FRAGMENT + e / FRAGMENT;
                let i = db * per_block + j;
                acc[i] = acc[i] * row_rescale[r] + block_out[plane_o + e];
            }
            // Every lane has read the block before the next one is stored.
            sync_plane();
        }
        first_key += CMMA_KEYS;
    }

    // The last row statistics were written before the loop's last barrier.
    #[unroll]
    for db in 0..blocks {
        #[unroll]
        for j in 0..per_block {
            let e = lane + j * CMMA_PLANE_SIZE;
            let r = plane * FRAGMENT + e / FRAGMENT;
            let query = first_query + r;
            if query < seq {
                out[q_base + query * head_dim + db * FRAGMENT + e % FRAGMENT] =
                    store::<F>(acc[db * per_block + j] / row_sum[r], round_bf16);
            }
        }
    }
    if unit < CMMA_ROWS {
        let query = first_query + unit;
        if query < seq {
            lse[bh * seq + query] = row_max[unit] + f32::ln(row_sum[unit]);
        }
    }
}

/// Stages keys `first_key ..` (one tile) of `src` into `tile` as `M`, zeros
/// past `seq`; every unit of the cube takes part.
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage_keys<F: Float, M: Float>(
    src: &Array<F>,
    tile: &mut SharedMemory<M>,
    kv_base: usize,
    first_key: usize,
    seq: usize,
    unit: usize,
    #[comptime] head_dim: usize,
    #[comptime] round_bf16: bool,
) {
    let units = comptime!(CMMA_PLANES * CMMA_PLANE_SIZE);
    for i in 0..comptime!(CMMA_KEYS * head_dim / units) {
        let e = unit + i * units;
        let key = first_key + e / head_dim;
        let mut x = 0.0f32;
        if key < seq {
            x = load::<F>(src[kv_base + key * head_dim + e % head_dim], round_bf16);
        }
        tile[e] = M::cast_from(x);
    }
}
