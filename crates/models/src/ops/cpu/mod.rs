//! Ferrotron's fused operations for the CPU (Burn's flex backend): plain
//! Rust over the tensors' host buffers, vectorised for the CPU found at
//! run time, where a chain of Burn tensor operations would allocate and
//! pass over memory once per operation.

mod attention;
mod gemm;
mod linear_cross_entropy;
mod math;

pub use attention::{attention_backward, attention_forward};
pub use linear_cross_entropy::linear_cross_entropy_blocks;
