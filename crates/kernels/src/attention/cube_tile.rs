//! Where a cube of the fragment and register kernels stands: its unit's
//! lane and plane, the tile of query or key rows the cube owns, and where
//! its heads' rows begin in `q` and in `k`/`v`. Under grouped-query
//! attention each key/value head serves `group` consecutive query heads.
//! Every layout is `[batch, heads, seq, head_dim]`.

use cubecl::prelude::*;

/// A cube that owns a tile of query rows of one query head (the forward and
/// dQ kernels). Cube grid: `x` = tile of query rows, `y` = `batch * n_heads
/// + head`; cube dim `(units per plane, planes)`.
#[derive(CubeType, Clone, Copy)]
pub(crate) struct QueryTile {
    /// The unit's index in its plane.
    pub lane: usize,
    /// The plane's index in the cube.
    pub plane: usize,
    /// The unit's index in the cube.
    pub unit: usize,
    /// `batch * n_heads + head`.
    pub bh: usize,
    /// The query head.
    pub head: usize,
    /// The first of the cube's query rows.
    pub first_query: usize,
    /// Where the head's rows begin in `q` (and `out`, `d_out`, `dq`), in values.
    pub q_base: usize,
    /// Where its key/value head's rows begin in `k` and `v`, in values.
    pub kv_base: usize,
}

/// This cube's [`QueryTile`]: `rows` query rows per cube, planes of
/// `plane_units` units.
#[cube]
pub(crate) fn query_tile(
    seq: usize,
    n_heads: usize,
    group: usize,
    #[comptime] plane_units: usize,
    #[comptime] rows: usize,
    #[comptime] head_dim: usize,
) -> QueryTile {
    let lane = UNIT_POS_X as usize;
    let plane = UNIT_POS_Y as usize;
    let bh = CUBE_POS_Y as usize;
    let head = bh % n_heads;
    let kv_bh = (bh / n_heads) * (n_heads / group) + head / group;
    QueryTile {
        lane,
        plane,
        unit: plane * plane_units + lane,
        bh,
        head,
        first_query: CUBE_POS_X as usize * rows,
        q_base: bh * seq * head_dim,
        kv_base: kv_bh * seq * head_dim,
    }
}

/// A cube that owns a tile of key/value rows of one key/value head (the
/// dK/dV kernels), which sum over the head's `group` query heads. Cube
/// grid: `x` = tile of key rows, `y` = `batch * n_kv_heads + kv_head`;
/// cube dim `(units per plane, planes)`.
#[derive(CubeType, Clone, Copy)]
pub(crate) struct KeyTile {
    /// The unit's index in its plane.
    pub lane: usize,
    /// The plane's index in the cube.
    pub plane: usize,
    /// The unit's index in the cube.
    pub unit: usize,
    /// The batch entry.
    pub batch: usize,
    /// The key/value head; it serves query heads `kv_head * group ..`.
    pub kv_head: usize,
    /// The first of the cube's key rows.
    pub first_key: usize,
    /// Where the head's rows begin in `k` and `v` (and `dk`, `dv`), in values.
    pub kv_base: usize,
}

/// This cube's [`KeyTile`]: `rows` key rows per cube, planes of
/// `plane_units` units.
#[cube]
pub(crate) fn key_tile(
    seq: usize,
    n_heads: usize,
    group: usize,
    #[comptime] plane_units: usize,
    #[comptime] rows: usize,
    #[comptime] head_dim: usize,
) -> KeyTile {
    let lane = UNIT_POS_X as usize;
    let plane = UNIT_POS_Y as usize;
    let kv_bh = CUBE_POS_Y as usize;
    let n_kv_heads = n_heads / group;
    KeyTile {
        lane,
        plane,
        unit: plane * plane_units + lane,
        batch: kv_bh / n_kv_heads,
        kv_head: kv_bh % n_kv_heads,
        first_key: CUBE_POS_X as usize * rows,
        kv_base: kv_bh * seq * head_dim,
    }
}
