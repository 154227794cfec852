//! FlashAttention with its own backward (FlashAttention-2 algorithm), as
//! CubeCL kernels.
//!
//! - Forward ([`attention_forward`]): an online softmax over the keys;
//!   writes the output and the per-row log-sum-exp, never the `[seq, seq]`
//!   scores. Two kernels, chosen in one place ([`AttentionKernel::choose`]):
//!   the tiled kernel (FlashAttention-2 tiles: a cube handles a block of
//!   query rows against key/value tiles staged in shared memory) wherever
//!   its shared memory fits the device, else the row kernel (one query row
//!   per unit, keys read from global memory, no shared memory). A third,
//!   the fragment kernel (the tiled algorithm with both products in
//!   16x16x16 fragments: on the matrix units with 16-bit operands where
//!   the device has them, or on plain units), runs when a caller asks for
//!   it ([`attention_forward_with`], or `matrix_units` in the options). A
//!   fourth, the register kernel (FlashAttention-2 as its CUDA kernel
//!   runs: scores, probabilities and output in each plane's registers,
//!   both products on the 16 x 8 x 16 `mma` instruction where the device
//!   has it, or on plain units), runs when named.
//! - Backward ([`attention_backward`]): `delta = rowsum(dO * O)`, then dK/dV
//!   (iterating over query rows) and dQ (iterating over key rows), both
//!   recomputing the probabilities from the log-sum-exp; two passes instead
//!   of atomics, so results are deterministic. Two pairs of kernels, chosen
//!   in one place ([`AttentionBackwardKernel::choose`]) by the forward's
//!   rule: the tiled pair (FlashAttention-2 Algorithm 2: a dK/dV cube holds
//!   a tile of key/value rows in shared memory and walks query tiles staged
//!   in shared memory from the causal start, summing the query heads of a
//!   GQA group; a dQ cube holds a tile of query rows and walks key/value
//!   tiles) wherever its shared memory fits the device, else the row pair
//!   (one key or query row per unit, the other side read from global
//!   memory). Both on plain unit arithmetic (no matrix units). A third
//!   pair, the fragment kernels (the tiled algorithm with every product in
//!   16x16x16 fragments: on the matrix units with 16-bit operands where
//!   the device has them, or on plain units with f32 operands), runs when
//!   a caller names it ([`attention_backward_with`]). A fourth, the
//!   register kernels (the register forward's scheme), runs when named.
//!
//! Supported: causal masking, grouped-query attention (`n_kv_heads` divides
//! `n_heads`, K/V never repeated in memory), ALiBi slopes, any sequence
//! length (ragged last tiles), head dimensions up to 256; `q`, `k`, `v`, the
//! output and the gradients in f32, f16 or bf16 ([`crate::FloatDtype`]),
//! every score, softmax statistic and sum in f32, the log-sum-exp kept in
//! f32.

mod backward_choice;
mod backward_kv;
mod backward_q;
mod choice;
mod cube_tile;
mod delta;
mod forward;
mod fragment;
mod fragment_backward_kv;
mod fragment_backward_q;
mod fragment_forward;
mod launch;
mod launch_backward;
mod mma;
mod mma_backward_kv;
mod mma_backward_q;
mod mma_forward;
mod shape;
mod stage;
mod tiled_backward_kv;
mod tiled_backward_q;
mod tiled_forward;
mod tiles;

pub use backward_choice::{AttentionBackwardKernel, MMA_BACKWARD_TILES};
pub use choice::{AttentionKernel, MMA_TILES};
pub use fragment::FRAGMENT_TILES;
pub use launch::{
    attention_forward, attention_forward_typed, attention_forward_with, AttentionForward,
};
pub use launch_backward::{
    attention_backward, attention_backward_from_delta, attention_backward_typed,
    attention_backward_with, AttentionGradients,
};
pub use shape::{
    AttentionError, AttentionInputs, AttentionOptions, AttentionShape, MatrixUnits, SCALE_RANGE,
};
pub use tiled_backward_kv::BACKWARD_TILES;
pub use tiled_forward::TILE_SIZES;
pub use tiles::MAX_HEAD_DIM;
