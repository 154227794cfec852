//! Ferrotron's CubeCL kernels: one `#[cube]` source per fused op, generic
//! over the CubeCL runtime, so the same code compiles for CUDA, HIP/ROCm and
//! wgpu. Tests launch them on the wgpu runtime over Mesa's lavapipe.

pub mod attention;
mod check;
pub mod cross_entropy;
pub mod norm;
mod reduce;
pub mod rope;
pub mod swiglu;
#[cfg(feature = "wgpu")]
pub mod wgpu_setup;

pub use check::ShapeError;
