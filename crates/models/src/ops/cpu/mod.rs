//! Ferrotron's fused operations for the CPU (Burn's flex backend): plain
//! Rust over the tensors' host buffers, vectorised for the CPU found at
//! run time, where a chain of Burn tensor operations would allocate and
//! pass over memory once per operation.

mod activation;
pub(super) mod buffers;
pub(super) mod gemm;
mod linear_cross_entropy;
pub(super) mod math;
mod norm;
mod rope;

pub use activation::{gelu_tanh, gelu_tanh_backward, swiglu, swiglu_backward};
pub use buffers::{all_f32, dense};
pub use linear_cross_entropy::linear_cross_entropy_blocks;
pub use norm::{layer_norm, norm_backward, rms_norm, RowStats};
pub use rope::{rope, rope_backward};
