//! Fused SwiGLU: `out = silu(gate) * up`, with `silu(g) = g * sigmoid(g)`,
//! and its backward. Elementwise over two tensors of the same shape (in a
//! Llama MLP, `[tokens, ffn_dim]`), contiguous; the layout beyond that
//! does not matter. Storage f32, f16 or bf16 ([`FloatDtype`]), arithmetic
//! f32, each output rounded once to the storage type. Loads and stores are
//! vectorized by 4 or 2 elements when the length allows.

use crate::check::{self, ShapeError};
use crate::dtype::{load_vector, store_vector, with_storage, FloatDtype};
use crate::elementwise::geometry;
use cubecl::prelude::*;
use cubecl::server::Handle;

#[cube]
fn sigmoid<N: Size>(g: Vector<f32, N>) -> Vector<f32, N> {
    let one = Vector::new(1.0f32);
    one / (one + Vector::exp(Vector::new(0.0f32) - g))
}

#[cube(launch_unchecked)]
fn swiglu_forward_kernel<F: Float, N: Size>(
    gate: &Array<Vector<F, N>>,
    up: &Array<Vector<F, N>>,
    out: &mut Array<Vector<F, N>>,
    #[comptime] round_bf16: bool,
) {
    if ABSOLUTE_POS < out.len() {
        let g = load_vector::<F, N>(gate[ABSOLUTE_POS], round_bf16);
        out[ABSOLUTE_POS] = store_vector::<F, N>(
            g * sigmoid::<N>(g) * load_vector::<F, N>(up[ABSOLUTE_POS], round_bf16),
            round_bf16,
        );
    }
}

#[cube(launch_unchecked)]
fn swiglu_backward_kernel<F: Float, N: Size>(
    gate: &Array<Vector<F, N>>,
    up: &Array<Vector<F, N>>,
    d_out: &Array<Vector<F, N>>,
    d_gate: &mut Array<Vector<F, N>>,
    d_up: &mut Array<Vector<F, N>>,
    #[comptime] round_bf16: bool,
) {
    if ABSOLUTE_POS < d_gate.len() {
        let g = load_vector::<F, N>(gate[ABSOLUTE_POS], round_bf16);
        let u = load_vector::<F, N>(up[ABSOLUTE_POS], round_bf16);
        let dy = load_vector::<F, N>(d_out[ABSOLUTE_POS], round_bf16);
        let s = sigmoid::<N>(g);
        let one = Vector::new(1.0f32);
        // d silu(g) / dg = s * (1 + g * (1 - s))
        d_gate[ABSOLUTE_POS] = store_vector::<F, N>(dy * u * s * (one + g * (one - s)), round_bf16);
        d_up[ABSOLUTE_POS] = store_vector::<F, N>(dy * g * s, round_bf16);
    }
}

/// Computes `out[i] = silu(gate[i]) * up[i]` for `i < len`, on f32
/// buffers: [`swiglu_forward_typed`] with [`FloatDtype::F32`].
pub fn swiglu_forward<R: Runtime>(
    client: &ComputeClient<R>,
    gate: &Handle,
    up: &Handle,
    out: &Handle,
    len: usize,
) -> Result<(), ShapeError> {
    swiglu_forward_typed(client, FloatDtype::F32, gate, up, out, len)
}

/// Computes `out[i] = silu(gate[i]) * up[i]` for `i < len`.
///
/// `gate`, `up` and `out` hold `len` elements of `dtype` (any shape,
/// contiguous; typically `[tokens, ffn_dim]`); the arithmetic is f32 and
/// `out` is rounded once to `dtype`. `out` must not alias the inputs.
pub fn swiglu_forward_typed<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    gate: &Handle,
    up: &Handle,
    out: &Handle,
    len: usize,
) -> Result<(), ShapeError> {
    const OP: &str = "swiglu_forward";
    check::dtype(OP, client, dtype)?;
    check::nonzero(OP, "len", len)?;
    let size = dtype.size_bytes();
    check::elems(OP, "gate", gate, len, size)?;
    check::elems(OP, "up", up, len, size)?;
    check::elems(OP, "out", out, len, size)?;
    let at = geometry(client, len);
    with_storage!(dtype, F, round_bf16, {
        // SAFETY: the three buffers hold `len` elements of `F` (checked
        // above); the array length is given in scalars, so the kernel sees
        // `len / vector` vectors and guards its index against that.
        unsafe {
            swiglu_forward_kernel::launch_unchecked::<F, R>(
                client,
                at.cube_count,
                at.cube_dim,
                at.vector,
                ArrayArg::from_raw_parts(gate.clone(), len),
                ArrayArg::from_raw_parts(up.clone(), len),
                ArrayArg::from_raw_parts(out.clone(), len),
                round_bf16,
            );
        }
    });
    Ok(())
}

/// Backward of [`swiglu_forward`] on f32 buffers: [`swiglu_backward_typed`]
/// with [`FloatDtype::F32`].
pub fn swiglu_backward<R: Runtime>(
    client: &ComputeClient<R>,
    gate: &Handle,
    up: &Handle,
    d_out: &Handle,
    d_gate: &Handle,
    d_up: &Handle,
    len: usize,
) -> Result<(), ShapeError> {
    swiglu_backward_typed(client, FloatDtype::F32, gate, up, d_out, d_gate, d_up, len)
}

/// Backward of [`swiglu_forward_typed`]: given `d_out`, writes
/// `d_gate[i] = d_out[i] * up[i] * s * (1 + gate[i] * (1 - s))` and
/// `d_up[i] = d_out[i] * silu(gate[i])`, where `s = sigmoid(gate[i])`.
///
/// All five buffers hold `len` elements of `dtype`; the arithmetic is f32,
/// each gradient rounded once to `dtype`. `d_gate` and `d_up` must not
/// alias each other or the inputs.
#[allow(clippy::too_many_arguments)]
pub fn swiglu_backward_typed<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    gate: &Handle,
    up: &Handle,
    d_out: &Handle,
    d_gate: &Handle,
    d_up: &Handle,
    len: usize,
) -> Result<(), ShapeError> {
    const OP: &str = "swiglu_backward";
    check::dtype(OP, client, dtype)?;
    check::nonzero(OP, "len", len)?;
    let size = dtype.size_bytes();
    check::elems(OP, "gate", gate, len, size)?;
    check::elems(OP, "up", up, len, size)?;
    check::elems(OP, "d_out", d_out, len, size)?;
    check::elems(OP, "d_gate", d_gate, len, size)?;
    check::elems(OP, "d_up", d_up, len, size)?;
    let at = geometry(client, len);
    with_storage!(dtype, F, round_bf16, {
        // SAFETY: as in `swiglu_forward_typed`, every buffer holds `len`
        // elements of `F` and the kernel guards its vector index.
        unsafe {
            swiglu_backward_kernel::launch_unchecked::<F, R>(
                client,
                at.cube_count,
                at.cube_dim,
                at.vector,
                ArrayArg::from_raw_parts(gate.clone(), len),
                ArrayArg::from_raw_parts(up.clone(), len),
                ArrayArg::from_raw_parts(d_out.clone(), len),
                ArrayArg::from_raw_parts(d_gate.clone(), len),
                ArrayArg::from_raw_parts(d_up.clone(), len),
                round_bf16,
            );
        }
    });
    Ok(())
}
