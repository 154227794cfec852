//! The two passes that sum a gradient over rows into one value per column:
//! the norms' parameter gradients (`d_weight`, LayerNorm's `d_bias`:
//! `[hidden]`, each a sum over the `rows` of a `[rows, hidden]` product)
//! and a linear layer's bias gradient (`crate::bias`).
//!
//! One unit per column looping over every row gives only `hidden / 256`
//! cubes (3 for GPT-2 small), so the rows are cut into chunks as well:
//! 1. the op's partials kernel: cube `(tile, chunk)` is
//!    [`PARAM_TILE_COLS`] x [`PARAM_ROW_LANES`] units; unit `(x, y)` sums
//!    column `tile * PARAM_TILE_COLS + x` over the rows `y, y + 8, ...` of
//!    the chunk (neighbouring units read neighbouring columns), the 8 lanes
//!    are added through a fixed shared-memory tree ([`lane_sum`]) and the
//!    chunk's sum goes to an f32 workspace `partials: [chunks, hidden]`;
//! 2. [`param_grad_finish_kernel`]: one unit per column adds the chunks in
//!    chunk order and rounds once to the storage dtype.
//!
//! Both orders are fixed by the shapes alone (no atomics), so every run
//! gives the same bits.

use cubecl::prelude::*;
use cubecl::server::Handle;

/// Columns per cube of a partials kernel (one warp wide on NVIDIA).
pub(crate) const PARAM_TILE_COLS: u32 = 32;

/// Row lanes per cube of a partials kernel: a power of two, as
/// [`lane_sum`] requires.
pub(crate) const PARAM_ROW_LANES: u32 = 8;

/// The number of cubes a partials launch aims at: a few per multiprocessor
/// of a large GPU (132 on an H100).
const PARAM_TARGET_CUBES: usize = 512;

/// The fewest rows in a chunk but the last (8 per row lane), so a small
/// input is not cut into chunks that cost more to add up than to sum.
const PARAM_MIN_CHUNK_ROWS: usize = 64;

/// Units per cube of [`param_grad_finish_kernel`].
const FINISH_CUBE_DIM: u32 = 256;

/// How the rows are cut: `chunks` chunks of `chunk_rows` consecutive rows
/// (the last one may hold fewer), over `col_tiles` tiles of
/// [`PARAM_TILE_COLS`] columns.
///
/// The rule: `chunks = min(ceil(512 / col_tiles), floor(rows / 64))`, at
/// least 1, so a launch has about 512 cubes when the rows allow it, and
/// otherwise chunks of at least 64 rows (one chunk when `rows < 128`);
/// then `chunk_rows = ceil(rows / chunks)` and
/// `chunks = ceil(rows / chunk_rows)` (no empty chunk). GPT-2 small's
/// `[8192, 768]`: 24 tiles, 22 chunks of 373 rows, 528 cubes; a 1B Llama's
/// `[8192, 2048]`: 64 tiles, 8 chunks of 1024 rows, 512 cubes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ParamChunks {
    pub col_tiles: usize,
    pub chunks: usize,
    pub chunk_rows: usize,
}

impl ParamChunks {
    /// The cut for `x: [rows, hidden]`; `rows` and `hidden` at least 1.
    pub fn new(rows: usize, hidden: usize) -> Self {
        let col_tiles = hidden.div_ceil(PARAM_TILE_COLS as usize);
        let wanted = PARAM_TARGET_CUBES.div_ceil(col_tiles);
        let chunks = wanted.min(rows / PARAM_MIN_CHUNK_ROWS).max(1);
        let chunk_rows = rows.div_ceil(chunks);
        Self {
            col_tiles,
            chunks: rows.div_ceil(chunk_rows),
            chunk_rows,
        }
    }

    /// The grid of a partials kernel: `(col_tiles, chunks)`.
    pub fn cube_count(&self) -> CubeCount {
        CubeCount::Static(self.col_tiles as u32, self.chunks as u32, 1)
    }

    /// The cube of a partials kernel: columns along x, row lanes along y.
    pub fn cube_dim(&self) -> CubeDim {
        CubeDim::new_2d(PARAM_TILE_COLS, PARAM_ROW_LANES)
    }

    /// A new f32 workspace `partials: [chunks, hidden]`, uninitialised
    /// (the partials kernel writes every element).
    pub fn workspace<R: Runtime>(&self, client: &ComputeClient<R>, hidden: usize) -> Handle {
        client.empty(self.chunks * hidden * size_of::<f32>())
    }
}

/// Where one unit of a partials kernel works: the chunk (`CUBE_POS_Y`), the
/// column it sums (`CUBE_POS_X * CUBE_DIM_X + UNIT_POS_X`, possibly past
/// the last one) and the chunk's rows `start..end`, of which it takes
/// `start + UNIT_POS_Y`, then every `CUBE_DIM_Y`-th.
#[derive(CubeType)]
pub(crate) struct ChunkColumn {
    pub chunk: usize,
    pub col: usize,
    pub start: usize,
    pub end: usize,
}

/// The [`ChunkColumn`] of this unit for `rows` rows in chunks of
/// `chunk_rows`.
#[cube]
pub(crate) fn chunk_column(rows: u32, chunk_rows: u32) -> ChunkColumn {
    let chunk = CUBE_POS_Y as usize;
    let start = chunk * chunk_rows as usize;
    ChunkColumn {
        chunk,
        col: CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS_X as usize,
        start,
        end: min(start + chunk_rows as usize, rows as usize),
    }
}

/// Sums `value` over the row lanes (`UNIT_POS_Y`) of the units that share
/// `UNIT_POS_X`, through a fixed tree; the lane-0 unit of each column gets
/// the total (the others get a partial sum).
///
/// `scratch` must hold at least `CUBE_DIM` elements and `CUBE_DIM_Y` must
/// be a power of two. Every unit of the cube must call this (it
/// synchronises).
#[cube]
pub(crate) fn lane_sum(scratch: &mut SharedMemory<f32>, value: f32) -> f32 {
    let width = CUBE_DIM_X as usize;
    let at = UNIT_POS_Y as usize * width + UNIT_POS_X as usize;
    scratch[at] = value;
    sync_cube();
    let mut stride = (CUBE_DIM_Y / 2) as usize;
    while stride > 0 {
        if (UNIT_POS_Y as usize) < stride {
            scratch[at] = scratch[at] + scratch[at + stride * width];
        }
        sync_cube();
        stride /= 2;
    }
    let total = scratch[at];
    sync_cube();
    total
}

/// `out[col] = sum over c in 0..chunks, in order, of partials[c * hidden +
/// col]`, rounded once to `F` (to bf16 first with `round_bf16`).
#[cube(launch_unchecked)]
fn param_grad_finish_kernel<F: Float>(
    partials: &Array<f32>,
    out: &mut Array<F>,
    chunks: u32,
    hidden: u32,
    #[comptime] round_bf16: bool,
) {
    let col = ABSOLUTE_POS;
    let hidden = hidden as usize;
    if col < hidden {
        let mut acc = 0.0f32;
        for chunk in 0..chunks as usize {
            acc += partials[chunk * hidden + col];
        }
        out[col] = crate::dtype::store::<F>(acc, round_bf16);
    }
}

/// Launches the second pass: `out: [hidden]` of `F` from
/// `partials: [cut.chunks, hidden]` (f32).
///
/// # Safety
/// `partials` must hold `cut.chunks * hidden` f32 and `out` `hidden`
/// elements of `F`.
pub(crate) unsafe fn finish<F: Float + CubeElement, R: Runtime>(
    client: &ComputeClient<R>,
    cut: &ParamChunks,
    partials: &Handle,
    out: &Handle,
    hidden: usize,
    round_bf16: bool,
) {
    let dim = CubeDim::new_1d(FINISH_CUBE_DIM);
    // SAFETY: sizes as the caller promises; the kernel guards columns.
    unsafe {
        param_grad_finish_kernel::launch_unchecked::<F, R>(
            client,
            cubecl::calculate_cube_count_elemwise(client, hidden, dim),
            dim,
            ArrayArg::from_raw_parts(partials.clone(), cut.chunks * hidden),
            ArrayArg::from_raw_parts(out.clone(), hidden),
            cut.chunks as u32,
            hidden as u32,
            round_bf16,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::ParamChunks;

    fn cut(rows: usize, hidden: usize) -> (usize, usize, usize) {
        let c = ParamChunks::new(rows, hidden);
        (c.col_tiles, c.chunks, c.chunk_rows)
    }

    #[test]
    fn chunks_aim_at_a_few_hundred_cubes_on_large_inputs() {
        assert_eq!(cut(8192, 768), (24, 22, 373));
        assert_eq!(cut(8192, 2048), (64, 8, 1024));
        // More tiles than the target: one chunk per tile column.
        assert_eq!(cut(8192, 32768), (1024, 1, 8192));
    }

    #[test]
    fn small_inputs_keep_chunks_of_64_rows_or_more_and_none_empty() {
        assert_eq!(cut(1, 3), (1, 1, 1));
        assert_eq!(cut(127, 45), (2, 1, 127));
        assert_eq!(cut(203, 45), (2, 3, 68));
        assert_eq!(cut(129, 4096), (128, 2, 65));
        for rows in 1..600 {
            for hidden in [1, 31, 33, 768, 5000] {
                let c = ParamChunks::new(rows, hidden);
                let tag = format!("[{rows}, {hidden}]");
                assert!((c.chunks - 1) * c.chunk_rows < rows, "{tag}: empty chunk");
                assert!(c.chunks * c.chunk_rows >= rows, "{tag}: rows left out");
                assert!(c.chunk_rows >= rows.min(64), "{tag}: chunk too short");
            }
        }
    }
}
