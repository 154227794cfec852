//! Tiled FlashAttention-2 forward kernel: a cube computes a block of query
//! rows against key/value tiles staged in shared memory, with the online
//! softmax per row; writes the output and the per-row log-sum-exp (the
//! same outputs as the row kernel, so the same backward consumes them).

use cubecl::prelude::*;

use crate::dtype::{load, store};

use super::tiles::{alibi_bias, visible, NEG_LARGE};

/// Units per cube of the tiled forward kernel.
pub(crate) const TILED_UNITS: usize = 128;

/// Tile sizes the tiled forward kernel is compiled for, largest first: a
/// cube handles `tile` query rows and walks the keys `tile` at a time
/// (`Br = Bc = tile`).
pub const TILE_SIZES: [usize; 2] = [32, 16];

/// Shared memory of one cube of the tiled forward kernel, in bytes: the
/// scaled query tile (`tile * head_dim`), one key/value tile (`tile *
/// (head_dim + 1)`, padded against bank conflicts), the score tile (`tile *
/// (tile + 1)`), three f32 values per row (running maximum, running sum,
/// rescale factor) and two per unit (its partial maximum and sum of a
/// row's softmax); all f32.
pub(crate) fn tiled_shared_bytes(tile: usize, head_dim: usize) -> usize {
    let floats =
        tile * head_dim + tile * (head_dim + 1) + tile * (tile + 1) + 3 * tile + 2 * TILED_UNITS;
    floats * size_of::<f32>()
}

/// One cube per `tile` query rows of one `(batch, head)`, [`TILED_UNITS`]
/// units. The cube stages its query rows (pre-multiplied by the softmax
/// scale) in shared memory once, then for each tile of `tile` keys:
///
/// 1. the units load the key tile into shared memory together;
/// 2. the units compute the `tile x tile` scores (each a dot product over
///    `head_dim` read from shared memory), add the ALiBi bias and mask
///    (causal, keys and rows past `seq`);
/// 3. the units load the value tile over the key tile while each row's
///    `128 / tile` units (consecutive units, each `tile^2 / 128` adjacent
///    keys of the row) take their keys' maximum; after a barrier each
///    takes the row's new running maximum from the row's partial maxima
///    (in unit order), turns its scores into probabilities and writes
///    their sum; the row's first unit updates the running maximum and the
///    rescale factor, and the running sum after the next barrier, adding
///    the partial sums in unit order;
/// 4. each unit rescales its share of the `tile x head_dim` output
///    accumulator (kept in registers) and adds the tile's
///    probability-weighted values.
///
/// With a causal mask the key tiles stop after the cube's last query row,
/// so tiles wholly above the diagonal are never loaded. Every value is f32
/// in shared memory and registers whatever the storage type `F`; each
/// stored value is loaded and rounded (bf16-in-f32) once per cube.
///
/// Cube grid: `x` = tile of query rows, `y` = `batch * n_heads + head`.
/// Layouts as [`super::forward::attention_forward_kernel`]'s.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_forward_tiled_kernel<F: Float>(
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
    #[comptime] tile: usize,
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
    let first_query = CUBE_POS_X as usize * tile;
    let q_base = bh * seq * head_dim;
    let kv_base = kv_bh * seq * head_dim;

    let kv_stride = comptime!(head_dim + 1);
    let s_stride = comptime!(tile + 1);
    let tile_elems = comptime!(tile * head_dim);
    let tile_scores = comptime!(tile * tile);
    // Values of a `tile x head_dim` tile each unit loads (and output
    // accumulators it owns), and scores it computes per key tile.
    let per_unit = comptime!(tile_elems.div_ceil(TILED_UNITS));
    let scores_per_unit = comptime!(tile_scores.div_ceil(TILED_UNITS));

    let mut q_tile = SharedMemory::<f32>::new(tile_elems);
    let mut kv_tile = SharedMemory::<f32>::new(comptime!(tile * (head_dim + 1)));
    let mut scores = SharedMemory::<f32>::new(comptime!(tile * (tile + 1)));
    let mut row_max = SharedMemory::<f32>::new(tile);
    let mut row_sum = SharedMemory::<f32>::new(tile);
    let mut row_rescale = SharedMemory::<f32>::new(tile);
    let mut part_max = SharedMemory::<f32>::new(TILED_UNITS);
    let mut part_sum = SharedMemory::<f32>::new(TILED_UNITS);

    let mut slope = 0.0f32;
    if alibi {
        slope = slopes[head];
    }

    // Rows past `seq` load a copy of the last row and are never written.
    let mut acc = Array::<f32>::new(per_unit);
    let mut dots = Array::<f32>::new(scores_per_unit);
    for i in 0..per_unit {
        let e = unit + i * TILED_UNITS;
        if e < tile_elems {
            let row = min(first_query + e / head_dim, seq - 1);
            q_tile[e] = load::<F>(q[q_base + row * head_dim + e % head_dim], round_bf16) * scale;
        }
        acc[i] = 0.0f32;
    }
    if unit < tile {
        row_max[unit] = f32::new(NEG_LARGE);
        row_sum[unit] = 0.0f32;
    }

    let mut key_end = seq;
    if causal {
        key_end = min(first_query + tile, seq);
    }
    // This unit's share of a row's softmax: row `unit / row_units`, keys
    // `first_col ..` of each tile.
    let row_units = comptime!(TILED_UNITS / tile);
    let cols = comptime!(tile / row_units);
    let row = unit / row_units;
    let first_unit = row * row_units;
    let first_col = (unit % row_units) * cols;
    let row_query = first_query + row;
    let at = row * s_stride + first_col;

    let mut first_key = 0usize;
    while first_key < key_end {
        // The previous tile's reads of `kv_tile` and `scores` are done (and,
        // on the first tile, the query tile and the row statistics are
        // written).
        sync_cube();
        for i in 0..per_unit {
            let e = unit + i * TILED_UNITS;
            if e < tile_elems {
                let c = e / head_dim;
                let key = min(first_key + c, seq - 1);
                kv_tile[c * kv_stride + e % head_dim] =
                    load::<F>(k[kv_base + key * head_dim + e % head_dim], round_bf16);
            }
        }
        sync_cube();

        // Masked scores are `NEG_LARGE`. Key 0 (in the first tile) is
        // visible to every row below `seq`, so each such row's running
        // maximum is a real score after the first tile.
        // Every tile size divides the units and its score count is a
        // multiple of them, so a unit's scores all have key `unit % tile`,
        // whose values it reads once per column for all of them.
        let key_col = unit % tile;
        #[unroll]
        for i in 0..scores_per_unit {
            dots[i] = 0.0f32;
        }
        for d in 0..head_dim {
            let kc = kv_tile[key_col * kv_stride + d];
            #[unroll]
            for i in 0..scores_per_unit {
                let r = (unit + i * TILED_UNITS) / tile;
                dots[i] += q_tile[r * head_dim + d] * kc;
            }
        }
        #[unroll]
        for i in 0..scores_per_unit {
            let e = unit + i * TILED_UNITS;
            if e < tile_scores {
                let r = e / tile;
                let c = e % tile;
                let mut dot = dots[i];
                let query = first_query + r;
                let key = first_key + c;
                if alibi {
                    dot += alibi_bias(slope, query, key);
                }
                scores[r * s_stride + c] =
                    select(visible(query, key, seq, causal), dot, f32::new(NEG_LARGE));
            }
        }
        sync_cube();

        // The value tile replaces the key tile (every score is computed).
        for i in 0..per_unit {
            let e = unit + i * TILED_UNITS;
            if e < tile_elems {
                let c = e / head_dim;
                let key = min(first_key + c, seq - 1);
                kv_tile[c * kv_stride + e % head_dim] =
                    load::<F>(v[kv_base + key * head_dim + e % head_dim], round_bf16);
            }
        }
        let old_max = row_max[row];
        let mut top = old_max;
        #[unroll]
        for c in 0..cols {
            top = max(top, scores[at + c]);
        }
        part_max[unit] = top;
        sync_cube();

        // Every unit of the row read `row_max` above, before this write.
        let mut new_max = part_max[first_unit];
        #[unroll]
        for i in 1..row_units {
            new_max = max(new_max, part_max[first_unit + i]);
        }
        let mut sum = 0.0f32;
        #[unroll]
        for c in 0..cols {
            let p = select(
                visible(row_query, first_key + first_col + c, seq, causal),
                f32::exp(scores[at + c] - new_max),
                0.0f32,
            );
            scores[at + c] = p;
            sum += p;
        }
        part_sum[unit] = sum;
        if unit == first_unit {
            row_max[row] = new_max;
            row_rescale[row] = f32::exp(old_max - new_max);
        }
        sync_cube();

        if unit == first_unit {
            let mut total = row_sum[row] * row_rescale[row];
            #[unroll]
            for i in 0..row_units {
                total += part_sum[first_unit + i];
            }
            row_sum[row] = total;
        }
        if comptime!(TILED_UNITS.is_multiple_of(head_dim)) {
            // Every accumulator of a unit is in column `unit % head_dim`:
            // each value row is read once for all of them.
            let d = unit % head_dim;
            #[unroll]
            for i in 0..per_unit {
                let e = unit + i * TILED_UNITS;
                if e < tile_elems {
                    acc[i] *= row_rescale[e / head_dim];
                }
            }
            for c in 0..tile {
                let x = kv_tile[c * kv_stride + d];
                #[unroll]
                for i in 0..per_unit {
                    let e = unit + i * TILED_UNITS;
                    if e < tile_elems {
                        acc[i] += scores[(e / head_dim) * s_stride + c] * x;
                    }
                }
            }
        } else {
            for i in 0..per_unit {
                let e = unit + i * TILED_UNITS;
                if e < tile_elems {
                    let r = e / head_dim;
                    let d = e % head_dim;
                    let mut value = acc[i] * row_rescale[r];
                    for c in 0..tile {
                        value += scores[r * s_stride + c] * kv_tile[c * kv_stride + d];
                    }
                    acc[i] = value;
                }
            }
        }
        first_key += tile;
    }

    // The last tile's running sums are written.
    sync_cube();
    for i in 0..per_unit {
        let e = unit + i * TILED_UNITS;
        if e < tile_elems {
            let r = e / head_dim;
            let query = first_query + r;
            if query < seq {
                out[q_base + query * head_dim + e % head_dim] =
                    store::<F>(acc[i] / row_sum[r], round_bf16);
            }
        }
    }
    if unit < tile {
        let query = first_query + unit;
        if query < seq {
            lse[bh * seq + query] = row_max[unit] + f32::ln(row_sum[unit]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{TILED_UNITS, TILE_SIZES};

    #[test]
    fn every_unit_scores_one_key_of_each_tile() {
        // The score loop of the kernel relies on it, and the softmax on
        // each row's keys splitting evenly over its `128 / tile` units.
        for tile in TILE_SIZES {
            assert!(TILED_UNITS.is_multiple_of(tile), "{tile}");
            assert!((tile * tile).is_multiple_of(TILED_UNITS), "{tile}");
            assert!(tile.is_multiple_of(TILED_UNITS / tile), "{tile}");
        }
    }
}
