//! Sizes and the per-score helpers shared by the forward and backward
//! attention kernels.

use cubecl::prelude::*;

/// Units per cube: each unit owns one query row (forward, dQ) or one key row
/// (dK/dV), so this is also the number of rows a cube handles.
pub(crate) const ROWS_PER_CUBE: usize = 64;

/// Largest supported head dimension. Each unit keeps up to four rows of
/// `head_dim` values in local memory.
pub const MAX_HEAD_DIM: usize = 256;

/// Keys (or queries) a unit handles per step of its inner loop, with their
/// scores kept in registers.
pub(crate) const KEYS_PER_STEP: usize = 16;

/// Large negative score of masked keys and start value of running maxima
/// (finite, because WGSL has no infinity literal).
pub(crate) const NEG_LARGE: f32 = -1.0e30;

/// Whether key `key` takes part in the softmax of query `query`: both lie
/// inside the sequence and, with `causal`, the key is not after the query.
#[cube]
pub(crate) fn visible(query: usize, key: usize, seq: usize, #[comptime] causal: bool) -> bool {
    let mut inside = query < seq && key < seq;
    if causal {
        inside = inside && key <= query;
    }
    inside
}

/// Whether every pair of queries `first_query ..+ queries` and keys
/// `first_key ..+ keys` is [`visible`]: all inside the sequence and, with
/// `causal`, the last key not after the first query. The register kernels
/// skip the per-pair mask on such a block of a tile.
#[cube]
pub(crate) fn all_visible(
    first_query: usize,
    queries: usize,
    first_key: usize,
    keys: usize,
    seq: usize,
    #[comptime] causal: bool,
) -> bool {
    let mut inside = first_query + queries <= seq && first_key + keys <= seq;
    if causal {
        inside = inside && first_key + keys <= first_query + 1;
    }
    inside
}

/// `exp(x)` through the device's fast exponential where it has one: on
/// CUDA and HIP `__expf`, one `ex2.approx` of `x * log2(e)` (relative
/// error about `2^-21` plus `|x| * 2^-24`), instead of the accurate `expf`
/// (about 9 instructions on `sm_90a`); elsewhere `exp`. For the kernels
/// whose probabilities are rounded to a 16-bit type after it; `x` is
/// finite (masked scores are [`NEG_LARGE`], whose exponential is 0).
#[cube(fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf)]
pub(crate) fn fast_exp(x: f32) -> f32 {
    f32::exp(x)
}

/// The ALiBi bias `slope * (key - query)` added to the score of `(query, key)`.
#[cube]
pub(crate) fn alibi_bias(slope: f32, query: usize, key: usize) -> f32 {
    slope * (f32::cast_from(key as u32) - f32::cast_from(query as u32))
}

/// The score of pair `(query, key)` from its dot product `qk`: `scale *
/// qk`, plus the ALiBi bias with `alibi` (unmasked: the kernels mask with
/// [`visible`]).
#[cube]
pub(crate) fn pair_score(
    qk: f32,
    scale: f32,
    slope: f32,
    query: usize,
    key: usize,
    #[comptime] alibi: bool,
) -> f32 {
    let mut score = qk * scale;
    if alibi {
        score += alibi_bias(slope, query, key);
    }
    score
}

/// The register backward's step for the pair (`query`, `key`) of score
/// `s` (unscaled, as the product left it) and `dp = d_out . v`: `p =
/// exp(scale * s + bias - lse)` and `ds = p * (dp - delta)`, as `(p, ds)`;
/// with `masked`, both 0 where the pair is not [`visible`].
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn pair_gradient(
    s: f32,
    dp: f32,
    lse: f32,
    delta: f32,
    scale: f32,
    slope: f32,
    query: usize,
    key: usize,
    seq: usize,
    #[comptime] causal: bool,
    #[comptime] alibi: bool,
    #[comptime] masked: bool,
) -> Vector<f32, Const<2>> {
    let score = pair_score(s, scale, slope, query, key, alibi);
    let mut p = fast_exp(score - lse);
    let mut ds = p * (dp - delta);
    if masked {
        let seen = visible(query, key, seq, causal);
        p = select(seen, p, 0.0f32);
        ds = select(seen, ds, 0.0f32);
    }
    let mut out = Vector::<f32, Const<2>>::empty();
    out[0] = p;
    out[1] = ds;
    out
}
