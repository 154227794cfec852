//! FlashAttention with its own backward (FlashAttention-2 algorithm), as
//! CubeCL kernels.
//!
//! - Forward ([`attention_forward`]): per query row, an online softmax over
//!   the keys, a step of several keys at a time; writes the output and the
//!   per-row log-sum-exp, never the `[seq, seq]` scores.
//! - Backward ([`attention_backward`]): `delta = rowsum(dO * O)`, then dK/dV
//!   per key row (iterating over query rows) and dQ per query row
//!   (iterating over key rows), both recomputing the probabilities from the
//!   log-sum-exp. Two passes instead of atomics, so results are
//!   deterministic.
//!
//! Supported: causal masking, grouped-query attention (`n_kv_heads` divides
//! `n_heads`, K/V never repeated in memory), ALiBi slopes, any sequence
//! length (ragged last tiles), head dimensions up to 256; `q`, `k`, `v`, the
//! output and the gradients in f32, f16 or bf16 ([`crate::FloatDtype`]),
//! every score, softmax statistic and sum in f32, the log-sum-exp kept in
//! f32.

mod backward_kv;
mod backward_q;
mod delta;
mod forward;
mod launch;
mod shape;
mod tiles;

pub use launch::{
    attention_backward, attention_backward_typed, attention_forward, attention_forward_typed,
    AttentionForward, AttentionGradients,
};
pub use shape::{AttentionError, AttentionInputs, AttentionOptions, AttentionShape};
