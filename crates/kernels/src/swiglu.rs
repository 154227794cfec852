//! Fused SwiGLU: `out = silu(gate) * up`, with `silu(g) = g * sigmoid(g)`,
//! and its backward. Elementwise over two tensors of the same shape (in a
//! Llama MLP, `[tokens, ffn_dim]`), f32, contiguous; the layout beyond that
//! does not matter. Loads and stores are vectorized by 4 or 2 elements when
//! the length allows.

use crate::check::{self, ShapeError};
use cubecl::prelude::*;
use cubecl::server::Handle;

/// Units per cube of the elementwise kernels.
const CUBE_DIM: u32 = 256;

#[cube]
fn sigmoid<F: Float, N: Size>(g: Vector<F, N>) -> Vector<F, N> {
    let one = Vector::new(F::new(1.0));
    one / (one + Vector::exp(Vector::new(F::new(0.0)) - g))
}

#[cube(launch_unchecked)]
fn swiglu_forward_kernel<F: Float, N: Size>(
    gate: &Array<Vector<F, N>>,
    up: &Array<Vector<F, N>>,
    out: &mut Array<Vector<F, N>>,
) {
    if ABSOLUTE_POS < out.len() {
        let g = gate[ABSOLUTE_POS];
        out[ABSOLUTE_POS] = g * sigmoid::<F, N>(g) * up[ABSOLUTE_POS];
    }
}

#[cube(launch_unchecked)]
fn swiglu_backward_kernel<F: Float, N: Size>(
    gate: &Array<Vector<F, N>>,
    up: &Array<Vector<F, N>>,
    d_out: &Array<Vector<F, N>>,
    d_gate: &mut Array<Vector<F, N>>,
    d_up: &mut Array<Vector<F, N>>,
) {
    if ABSOLUTE_POS < d_gate.len() {
        let g = gate[ABSOLUTE_POS];
        let u = up[ABSOLUTE_POS];
        let dy = d_out[ABSOLUTE_POS];
        let s = sigmoid::<F, N>(g);
        let one = Vector::new(F::new(1.0));
        // d silu(g) / dg = s * (1 + g * (1 - s))
        d_gate[ABSOLUTE_POS] = dy * u * s * (one + g * (one - s));
        d_up[ABSOLUTE_POS] = dy * g * s;
    }
}

/// Largest vector width (4, 2 or 1 f32) that divides `len`.
fn vector_size(len: usize) -> usize {
    [4, 2, 1]
        .into_iter()
        .find(|v| len.is_multiple_of(*v))
        .unwrap_or(1)
}

/// Computes `out[i] = silu(gate[i]) * up[i]` for `i < len`.
///
/// `gate`, `up` and `out` are f32 buffers of `len` elements (any shape,
/// contiguous; typically `[tokens, ffn_dim]`). `out` must not alias the
/// inputs.
pub fn swiglu_forward<R: Runtime>(
    client: &ComputeClient<R>,
    gate: &Handle,
    up: &Handle,
    out: &Handle,
    len: usize,
) -> Result<(), ShapeError> {
    const OP: &str = "swiglu_forward";
    check::nonzero(OP, "len", len)?;
    check::elems_4b(OP, "gate", gate, len)?;
    check::elems_4b(OP, "up", up, len)?;
    check::elems_4b(OP, "out", out, len)?;
    let vec = vector_size(len);
    let units = len / vec;
    let cube_dim = CubeDim::new_1d(CUBE_DIM);
    // SAFETY: the three buffers hold `len` f32 (checked above); the array
    // length is given in scalars, so the kernel sees `units` vectors of `vec`
    // and guards `ABSOLUTE_POS < units`.
    unsafe {
        swiglu_forward_kernel::launch_unchecked::<f32, R>(
            client,
            cubecl::calculate_cube_count_elemwise(client, units, cube_dim),
            cube_dim,
            vec,
            ArrayArg::from_raw_parts(gate.clone(), len),
            ArrayArg::from_raw_parts(up.clone(), len),
            ArrayArg::from_raw_parts(out.clone(), len),
        );
    }
    Ok(())
}

/// Backward of [`swiglu_forward`]: given `d_out`, writes
/// `d_gate[i] = d_out[i] * up[i] * s * (1 + gate[i] * (1 - s))` and
/// `d_up[i] = d_out[i] * silu(gate[i])`, where `s = sigmoid(gate[i])`.
///
/// All five buffers are f32 with `len` elements; `d_gate` and `d_up` must
/// not alias each other or the inputs.
pub fn swiglu_backward<R: Runtime>(
    client: &ComputeClient<R>,
    gate: &Handle,
    up: &Handle,
    d_out: &Handle,
    d_gate: &Handle,
    d_up: &Handle,
    len: usize,
) -> Result<(), ShapeError> {
    const OP: &str = "swiglu_backward";
    check::nonzero(OP, "len", len)?;
    check::elems_4b(OP, "gate", gate, len)?;
    check::elems_4b(OP, "up", up, len)?;
    check::elems_4b(OP, "d_out", d_out, len)?;
    check::elems_4b(OP, "d_gate", d_gate, len)?;
    check::elems_4b(OP, "d_up", d_up, len)?;
    let vec = vector_size(len);
    let units = len / vec;
    let cube_dim = CubeDim::new_1d(CUBE_DIM);
    // SAFETY: as in `swiglu_forward`, every buffer holds `len` f32 and the
    // kernel guards its vector index.
    unsafe {
        swiglu_backward_kernel::launch_unchecked::<f32, R>(
            client,
            cubecl::calculate_cube_count_elemwise(client, units, cube_dim),
            cube_dim,
            vec,
            ArrayArg::from_raw_parts(gate.clone(), len),
            ArrayArg::from_raw_parts(up.clone(), len),
            ArrayArg::from_raw_parts(d_out.clone(), len),
            ArrayArg::from_raw_parts(d_gate.clone(), len),
            ArrayArg::from_raw_parts(d_up.clone(), len),
        );
    }
    Ok(())
}
