//! Ferrotron's fused operations for the CPU (Burn's flex backend): plain
//! Rust over the tensors' host buffers, vectorised for the CPU found at
//! run time, where a chain of Burn tensor operations would allocate and
//! pass over memory once per operation.

mod activation;
mod attention;
mod buffers;
mod gemm;
mod linear_cross_entropy;
mod math;
mod norm;
mod rope;

pub use activation::{gelu_tanh, gelu_tanh_backward, swiglu, swiglu_backward};
pub use attention::{
    attention_backward, attention_backward_lse, attention_forward, attention_forward_lse,
};
pub use buffers::{all_f32, dense};
pub use linear_cross_entropy::linear_cross_entropy_blocks;
pub use norm::{layer_norm, norm_backward, rms_norm, RowStats};
pub use rope::{rope, rope_backward};
