//! AdamW's one-pass update on the CubeCL backends: the kernel of
//! `ferrotron_kernels::adamw` on the backend's own buffers, what
//! `KernelBackend::fused_adamw` gives the optimizer
//! (`ferrotron_engine::optim::FusedAdamW`). The parameter and both moments
//! are written in place (copied first where another tensor shares their
//! buffer), so a step launches one kernel per parameter where Burn's
//! tensor operations launch about a dozen.

use burn::tensor::{Tensor, TensorMetadata, TensorPrimitive};
use burn_cubecl::element::BoolElement;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use ferrotron_engine::optim::AdamWCoefficients;
use ferrotron_kernels::adamw::{adamw_update, AdamWScalars};

use super::cube::{contiguous, launched, owned};

/// The CubeCL backend the update serves (the one of `ops::cube`).
type Cube<R, BT> = CubeBackend<R, f32, i32, BT>;

/// The updated `[p, m, v]` of the rank-1 f32 parameter `p` with gradient
/// `g` and moments `m`, `v` (all of one length), by one kernel launch;
/// the values of `AdamW::update_flat`'s tensor operations for the same
/// inputs.
pub(super) fn update<R: CubeRuntime, BT: BoolElement>(
    p: Tensor<Cube<R, BT>, 1>,
    g: Tensor<Cube<R, BT>, 1>,
    m: Tensor<Cube<R, BT>, 1>,
    v: Tensor<Cube<R, BT>, 1>,
    c: AdamWCoefficients,
) -> [Tensor<Cube<R, BT>, 1>; 3] {
    let [p, m, v] = [p, m, v].map(|t| owned(cube(t)));
    let g = contiguous(cube(g));
    let len = p.shape().num_elements();
    let scalars =
        AdamWScalars::from_f64(c.beta1, c.beta2, c.bias2_sqrt, c.eps, c.step_size, c.decay);
    launched(
        "adamw",
        adamw_update(
            &p.client, &p.handle, &g.handle, &m.handle, &v.handle, len, scalars,
        ),
    );
    [p, m, v].map(|t| Tensor::from_primitive(TensorPrimitive::Float(t)))
}

/// The buffer of a tensor of the CubeCL backend.
fn cube<R: CubeRuntime, BT: BoolElement>(t: Tensor<Cube<R, BT>, 1>) -> CubeTensor<R> {
    t.into_primitive().tensor()
}
