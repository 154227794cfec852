//! What Ferrotron's CPU operations on Burn's flex backend share: plain
//! Rust over the tensors' host buffers, vectorised for the CPU found at
//! run time, where a chain of Burn tensor operations would allocate and
//! pass over memory once per operation. Each operation's kernel lies in
//! its own folder (`ops/<op>/cpu_kernel.rs`: attention, GELU, SwiGLU, the
//! norms, RoPE, the chunked head), with flex's autodiff node beside it
//! (`ops/<op>/cpu.rs`); here are the buffers' helpers (`buffers`), the
//! threaded GEMM (`gemm`) and the vectorised row math (`math`).

pub(super) mod buffers;
pub(super) mod gemm;
pub(super) mod math;

pub use buffers::{all_f32, dense};
