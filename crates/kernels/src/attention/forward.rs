//! FlashAttention forward kernel: tiled online softmax that writes the output
//! and the per-row log-sum-exp, never the score matrix.

use cubecl::prelude::*;

use super::tiles::{alibi_bias, stage_rows, visible};

/// Large negative start value of the running row maximum (finite, because
/// WGSL has no infinity literal).
const NEG_LARGE: f32 = -1.0e30;

/// One cube computes `ROWS_PER_CUBE` (= `CUBE_DIM_X`) query rows of one
/// `(batch, head)`; each unit owns one query row and keeps it, its output
/// accumulator and its running max / sum in local memory, while the cube
/// stages K and V tiles of `block_k` keys in shared memory.
///
/// Cube grid: `x` = query tile, `y` = `batch * n_heads + head`.
/// Layouts (contiguous, row-major): `q`, `out` `[batch, n_heads, seq,
/// head_dim]`; `k`, `v` `[batch, n_heads / group, seq, head_dim]`; `lse`
/// `[batch, n_heads, seq]`; `slopes` `[n_heads]` (read only when `alibi`).
/// Query head `h` reads key/value head `h / group`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_forward_kernel<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    slopes: &Array<F>,
    out: &mut Array<F>,
    lse: &mut Array<F>,
    seq: u32,
    n_heads: u32,
    group: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] block_k: usize,
    #[comptime] causal: bool,
    #[comptime] alibi: bool,
) {
    let seq = seq as usize;
    let scale = F::cast_from(scale);
    let n_heads = n_heads as usize;
    let group = group as usize;
    let bh = CUBE_POS_Y as usize;
    let head = bh % n_heads;
    let kv_bh = (bh / n_heads) * (n_heads / group) + head / group;
    let block_q = CUBE_DIM_X as usize;
    let first_query = CUBE_POS_X as usize * block_q;
    let query = first_query + UNIT_POS_X as usize;
    let row_base = (bh * seq + query) * head_dim;
    let kv_base = kv_bh * seq * head_dim;

    let mut slope = F::new(0.0);
    if alibi {
        slope = slopes[head];
    }

    // The query row is pre-multiplied by the softmax scale.
    let mut q_row = Array::<F>::new(head_dim);
    let mut acc = Array::<F>::new(head_dim);
    for d in 0..head_dim {
        let mut value = F::new(0.0);
        if query < seq {
            value = q[row_base + d] * scale;
        }
        q_row[d] = value;
        acc[d] = F::new(0.0);
    }
    let mut scores = Array::<F>::new(block_k);
    let mut k_tile = SharedMemory::<F>::new(block_k * head_dim);
    let mut v_tile = SharedMemory::<F>::new(block_k * head_dim);

    // With a causal mask, keys after the cube's last query are never visible.
    let mut key_end = seq;
    if causal {
        key_end = min(first_query + block_q, seq);
    }
    let mut row_max = F::new(NEG_LARGE);
    let mut row_sum = F::new(0.0);

    let mut first_key = 0usize;
    while first_key < key_end {
        stage_rows::<F>(k, kv_base, first_key, seq, &mut k_tile, block_k, head_dim);
        stage_rows::<F>(v, kv_base, first_key, seq, &mut v_tile, block_k, head_dim);
        sync_cube();

        let mut tile_max = F::new(NEG_LARGE);
        for j in 0..block_k {
            let key = first_key + j;
            if visible(query, key, seq, causal) {
                let mut score = F::new(0.0);
                for d in 0..head_dim {
                    score += q_row[d] * k_tile[j * head_dim + d];
                }
                if alibi {
                    score += alibi_bias::<F>(slope, query, key);
                }
                scores[j] = score;
                tile_max = max(tile_max, score);
            }
        }

        // Rescale what was accumulated under the old maximum, then add this
        // tile's keys. A row with no visible key here keeps its state.
        let new_max = max(row_max, tile_max);
        let correction = F::exp(row_max - new_max);
        row_sum *= correction;
        for d in 0..head_dim {
            acc[d] *= correction;
        }
        for j in 0..block_k {
            if visible(query, first_key + j, seq, causal) {
                let p = F::exp(scores[j] - new_max);
                row_sum += p;
                for d in 0..head_dim {
                    acc[d] += p * v_tile[j * head_dim + d];
                }
            }
        }
        row_max = new_max;

        sync_cube();
        first_key += block_k;
    }

    if query < seq {
        let inv_sum = F::new(1.0) / row_sum;
        for d in 0..head_dim {
            out[row_base + d] = acc[d] * inv_sum;
        }
        lse[bh * seq + query] = row_max + F::ln(row_sum);
    }
}
