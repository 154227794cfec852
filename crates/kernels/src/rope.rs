//! Fused rotary position embedding (RoPE), Llama / Hugging Face convention
//! (`rotate_half`): within each head vector of length `head_dim`, element
//! `i` is paired with element `i + head_dim / 2`, for `i < head_dim / 2`,
//! and the pair is rotated by the angle `pos * inv_freq[i]` (radians, f32
//! product as in Hugging Face `transformers`), where
//! `pos = position_offset + s` for sequence index `s`. The caller supplies
//! the `head_dim / 2` inverse frequencies, so every RoPE scaling type
//! (default `theta^(-2 i / head_dim)`, linear, Llama 3) runs the same kernel:
//!
//! ```text
//! x[i]        <- x[i] * cos - x[i + half] * sin
//! x[i + half] <- x[i + half] * cos + x[i] * sin
//! ```
//!
//! The tensor (f32, f16 or bf16, [`FloatDtype`]) is rotated in place; the
//! angles and the rotation are computed in f32 and each element is rounded
//! once to the storage type. The backward is the rotation by the
//! negative angle, also in place on the incoming gradient.

use crate::check::{self, ShapeError};
use crate::dtype::{load, store, with_storage, FloatDtype};
use cubecl::prelude::*;
use cubecl::server::Handle;

/// Units per cube: one unit rotates one pair.
const CUBE_DIM: u32 = 256;

/// Shape of the tensor RoPE rotates: `[batch, heads, seq, head_dim]`,
/// row-major (query or key heads; call once per tensor for GQA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopeShape {
    /// Batch size.
    pub batch: usize,
    /// Number of heads in this tensor.
    pub heads: usize,
    /// Sequence length; the positions are `position_offset..position_offset + seq`.
    pub seq: usize,
    /// Head dimension; must be even.
    pub head_dim: usize,
}

impl RopeShape {
    fn elems(&self) -> usize {
        self.batch * self.heads * self.seq * self.head_dim
    }
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn rope_kernel<F: Float>(
    x: &mut Array<F>,
    inv_freq: &Array<f32>,
    pairs: u32,
    seq: u32,
    head_dim: u32,
    position_offset: u32,
    #[comptime] inverse: bool,
    #[comptime] round_bf16: bool,
) {
    let pair = ABSOLUTE_POS;
    if pair >= pairs as usize {
        terminate!();
    }
    let half = (head_dim / 2) as usize;
    let i = pair % half;
    let vector = pair / half; // index over [batch, heads, seq]
    let s = vector % seq as usize;
    let angle = f32::cast_from(s as u32 + position_offset) * inv_freq[i];
    let cos = angle.cos();
    let mut sin = angle.sin();
    if comptime!(inverse) {
        sin = 0.0f32 - sin;
    }
    let lo = vector * head_dim as usize + i;
    let hi = lo + half;
    let a = load::<F>(x[lo], round_bf16);
    let b = load::<F>(x[hi], round_bf16);
    x[lo] = store::<F>(a * cos - b * sin, round_bf16);
    x[hi] = store::<F>(b * cos + a * sin, round_bf16);
}

#[allow(clippy::too_many_arguments)]
fn launch<R: Runtime>(
    op: &'static str,
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    x: &Handle,
    inv_freq: &Handle,
    shape: RopeShape,
    position_offset: usize,
    inverse: bool,
) -> Result<(), ShapeError> {
    check::dtype(op, client, dtype)?;
    check::nonzero(op, "batch", shape.batch)?;
    check::nonzero(op, "heads", shape.heads)?;
    check::nonzero(op, "seq", shape.seq)?;
    check::nonzero(op, "head_dim", shape.head_dim)?;
    if !shape.head_dim.is_multiple_of(2) {
        return Err(ShapeError {
            op,
            message: format!("head_dim must be even, got {}", shape.head_dim),
        });
    }
    check::fits_u32(op, "batch * heads * seq * head_dim", shape.elems())?;
    check::fits_u32(op, "position_offset + seq", position_offset + shape.seq)?;
    check::elems(op, "x", x, shape.elems(), dtype.size_bytes())?;
    check::elems_4b(op, "inv_freq", inv_freq, shape.head_dim / 2)?;
    let pairs = shape.elems() / 2;
    let cube_dim = CubeDim::new_1d(CUBE_DIM);
    with_storage!(dtype, F, round_bf16, {
        // SAFETY: `x` holds `2 * pairs` elements of `F` and `inv_freq`
        // `head_dim / 2` f32 (checked above); the kernel guards
        // `pair < pairs`, touches only elements `< 2 * pairs` of `x` and
        // reads `inv_freq[pair % half]`.
        unsafe {
            rope_kernel::launch_unchecked::<F, R>(
                client,
                cubecl::calculate_cube_count_elemwise(client, pairs, cube_dim),
                cube_dim,
                ArrayArg::from_raw_parts(x.clone(), shape.elems()),
                ArrayArg::from_raw_parts(inv_freq.clone(), shape.head_dim / 2),
                pairs as u32,
                shape.seq as u32,
                shape.head_dim as u32,
                position_offset as u32,
                inverse,
                round_bf16,
            );
        }
    });
    Ok(())
}

/// RoPE on an f32 tensor: [`rope_forward_typed`] with [`FloatDtype::F32`].
pub fn rope_forward<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Handle,
    inv_freq: &Handle,
    shape: RopeShape,
    position_offset: usize,
) -> Result<(), ShapeError> {
    rope_forward_typed(client, FloatDtype::F32, x, inv_freq, shape, position_offset)
}

/// Rotates `x: [batch, heads, seq, head_dim]` (elements of `dtype`) in
/// place by RoPE, with positions `position_offset + s` (use the KV-cache
/// length as offset when decoding) and the per-pair inverse frequencies
/// `inv_freq: [head_dim / 2]` (always f32, radians per position: the angle
/// `pos * inv_freq` needs f32 at long positions). The rotation is computed
/// in f32 and each element rounded once to `dtype`.
pub fn rope_forward_typed<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    x: &Handle,
    inv_freq: &Handle,
    shape: RopeShape,
    position_offset: usize,
) -> Result<(), ShapeError> {
    launch(
        "rope_forward",
        client,
        dtype,
        x,
        inv_freq,
        shape,
        position_offset,
        false,
    )
}

/// Backward of [`rope_forward`] on an f32 gradient: [`rope_backward_typed`]
/// with [`FloatDtype::F32`].
pub fn rope_backward<R: Runtime>(
    client: &ComputeClient<R>,
    d_x: &Handle,
    inv_freq: &Handle,
    shape: RopeShape,
    position_offset: usize,
) -> Result<(), ShapeError> {
    rope_backward_typed(
        client,
        FloatDtype::F32,
        d_x,
        inv_freq,
        shape,
        position_offset,
    )
}

/// Backward of [`rope_forward_typed`]: rotates the gradient
/// `d_x: [batch, heads, seq, head_dim]` (elements of `dtype`) in place by
/// the negative angles, turning the gradient of the rotated tensor into that
/// of its input. `inv_freq` as in the forward (f32).
pub fn rope_backward_typed<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    d_x: &Handle,
    inv_freq: &Handle,
    shape: RopeShape,
    position_offset: usize,
) -> Result<(), ShapeError> {
    launch(
        "rope_backward",
        client,
        dtype,
        d_x,
        inv_freq,
        shape,
        position_offset,
        true,
    )
}
