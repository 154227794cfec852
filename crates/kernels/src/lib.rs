//! Ferrotron's CubeCL kernels: one `#[cube]` source per fused op, generic
//! over the CubeCL runtime, so the same code compiles for CUDA, HIP/ROCm and
//! wgpu. Tests launch them on the wgpu runtime over Mesa's lavapipe.
//!
//! Each kernel reads and writes f32, f16 or bf16 ([`FloatDtype`]) and
//! computes in f32 (see [`dtype`]).

pub mod adamw;
pub mod attention;
pub mod bias;
mod check;
mod column_sums;
pub mod cross_entropy;
#[cfg(feature = "cuda-source")]
pub mod cuda_source;
pub mod dtype;
mod elementwise;
pub mod embedding;
pub mod gelu;
pub mod kernel_cache;
pub mod norm;
mod reduce;
pub mod rope;
pub mod swiglu;
#[cfg(feature = "wgpu")]
pub mod wgpu_setup;

pub use check::ShapeError;
pub use dtype::FloatDtype;
