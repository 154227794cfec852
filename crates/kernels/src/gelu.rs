//! Fused GELU with the tanh approximation (GPT-2's `gelu_new`, BLOOM's
//! gelu), `y = 0.5 x (1 + tanh(z))` with `z = sqrt(2/pi) (x + 0.044715 x^3)`,
//! computed as the identical `y = x * sigmoid(2 z)`, and its backward
//! `dy/dx = s + x s (1 - s) 2 sqrt(2/pi) (1 + 3 * 0.044715 x^2)` with
//! `s = sigmoid(2 z)`. Element-wise over a contiguous tensor (in a GPT MLP,
//! `[tokens, ffn_dim]`). Storage f32, f16 or bf16 ([`FloatDtype`]),
//! arithmetic f32, each output rounded once to the storage type; one read
//! and one write per element forward, two reads and one write backward,
//! where Burn's operations make about ten passes each way.

use crate::check::{self, ShapeError};
use crate::dtype::{load_vector, store_vector, with_storage, FloatDtype};
use crate::elementwise::geometry;
use cubecl::prelude::*;
use cubecl::server::Handle;

/// `2 sqrt(2 / pi)`.
const TWO_SQRT_2_OVER_PI: f32 = 1.595_769;

/// GELU's cubic coefficient.
const CUBIC: f32 = 0.044715;

/// The derivative's `3 * 0.044715`.
const THREE_CUBIC: f32 = 3.0 * CUBIC;

/// `sigmoid(2 z)` of `x` (see the module documentation). For `|x|` past
/// about 10 the exponential overflows to infinity or underflows to zero and
/// the result is exactly 0 or 1, never NaN.
#[cube]
fn gate<N: Size>(x: Vector<f32, N>) -> Vector<f32, N> {
    let two_z = Vector::new(TWO_SQRT_2_OVER_PI) * (x + Vector::new(CUBIC) * x * x * x);
    let one = Vector::new(1.0f32);
    one / (one + Vector::exp(Vector::new(0.0f32) - two_z))
}

#[cube(launch_unchecked)]
fn gelu_tanh_forward_kernel<F: Float, N: Size>(
    x: &Array<Vector<F, N>>,
    y: &mut Array<Vector<F, N>>,
    #[comptime] round_bf16: bool,
) {
    if ABSOLUTE_POS < y.len() {
        let v = load_vector::<F, N>(x[ABSOLUTE_POS], round_bf16);
        y[ABSOLUTE_POS] = store_vector::<F, N>(v * gate::<N>(v), round_bf16);
    }
}

#[cube(launch_unchecked)]
fn gelu_tanh_backward_kernel<F: Float, N: Size>(
    x: &Array<Vector<F, N>>,
    d_y: &Array<Vector<F, N>>,
    d_x: &mut Array<Vector<F, N>>,
    #[comptime] round_bf16: bool,
) {
    if ABSOLUTE_POS < d_x.len() {
        let v = load_vector::<F, N>(x[ABSOLUTE_POS], round_bf16);
        let dy = load_vector::<F, N>(d_y[ABSOLUTE_POS], round_bf16);
        let s = gate::<N>(v);
        let one = Vector::new(1.0f32);
        let d_two_z = Vector::new(TWO_SQRT_2_OVER_PI) * (one + Vector::new(THREE_CUBIC) * v * v);
        d_x[ABSOLUTE_POS] =
            store_vector::<F, N>(dy * (s + v * s * (one - s) * d_two_z), round_bf16);
    }
}

/// Writes `y[i] = gelu_tanh(x[i])` for `i < len`.
///
/// `x` and `y` hold `len` elements of `dtype` (any shape, contiguous); the
/// arithmetic is f32 and `y` is rounded once to `dtype`. `y` must not
/// alias `x`.
pub fn gelu_tanh_forward<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    x: &Handle,
    y: &Handle,
    len: usize,
) -> Result<(), ShapeError> {
    const OP: &str = "gelu_tanh_forward";
    check::dtype(OP, client, dtype)?;
    check::nonzero(OP, "len", len)?;
    let size = dtype.size_bytes();
    check::elems(OP, "x", x, len, size)?;
    check::elems(OP, "y", y, len, size)?;
    let at = geometry(client, len);
    with_storage!(dtype, F, round_bf16, {
        // SAFETY: both buffers hold `len` elements of `F` (checked above);
        // the array length is given in scalars, so the kernel sees
        // `len / vector` vectors and guards its index against that.
        unsafe {
            gelu_tanh_forward_kernel::launch_unchecked::<F, R>(
                client,
                at.cube_count,
                at.cube_dim,
                at.vector,
                ArrayArg::from_raw_parts(x.clone(), len),
                ArrayArg::from_raw_parts(y.clone(), len),
                round_bf16,
            );
        }
    });
    Ok(())
}

/// Backward of [`gelu_tanh_forward`]: given the output gradient `d_y`,
/// writes `d_x[i] = d_y[i] * gelu_tanh'(x[i])` for `i < len`.
///
/// The three buffers hold `len` elements of `dtype`; the arithmetic is
/// f32, `d_x` rounded once to `dtype`. `d_x` must not alias the inputs.
pub fn gelu_tanh_backward<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    x: &Handle,
    d_y: &Handle,
    d_x: &Handle,
    len: usize,
) -> Result<(), ShapeError> {
    const OP: &str = "gelu_tanh_backward";
    check::dtype(OP, client, dtype)?;
    check::nonzero(OP, "len", len)?;
    let size = dtype.size_bytes();
    check::elems(OP, "x", x, len, size)?;
    check::elems(OP, "d_y", d_y, len, size)?;
    check::elems(OP, "d_x", d_x, len, size)?;
    let at = geometry(client, len);
    with_storage!(dtype, F, round_bf16, {
        // SAFETY: as in `gelu_tanh_forward`, every buffer holds `len`
        // elements of `F` and the kernel guards its vector index.
        unsafe {
            gelu_tanh_backward_kernel::launch_unchecked::<F, R>(
                client,
                at.cube_count,
                at.cube_dim,
                at.vector,
                ArrayArg::from_raw_parts(x.clone(), len),
                ArrayArg::from_raw_parts(d_y.clone(), len),
                ArrayArg::from_raw_parts(d_x.clone(), len),
                round_bf16,
            );
        }
    });
    Ok(())
}
