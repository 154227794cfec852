//! Context parallelism (CP): each sequence split over a ring of `cp`
//! ranks, attention computed by passing K/V blocks around the ring (ring
//! attention, as Megatron-Core's `--context-parallel-size` with the p2p
//! kind, and picotron's `context_parallel/`).
//!
//! # The split ([`split`])
//!
//! The sequence is cut into `2 * cp` chunks; rank `r` holds chunks `r` and
//! `2cp - 1 - r` ([`ChunkLayout`]), so under the causal mask every rank
//! does the same work. Token ids, targets, the goldfish mask and the
//! positions follow the chunks ([`ChunkLayout::split`], undone by
//! [`ChunkLayout::unsplit`]); positions stay global, so RoPE's angles,
//! learned positions, ALiBi's distances and the causal mask are those of
//! the whole sequence.
//!
//! # Forward ([`ring_forward`])
//!
//! Step `t` of `cp`: rank `r` holds the K/V of rank `(r - t) mod cp`
//! ([`pairing::source`]; step 0 its own) and attends to them with the
//! query rows and key rows that [`Pairing`] keeps (the whole diagonal
//! block under the causal mask; off the diagonal one query chunk or one
//! key chunk, unmasked; chunk pairs entirely in the future are never
//! formed). The block's output and log-sum-exp come from the model's
//! fused attention ([`BlockAttention`]) and are folded into the running
//! output by [`merge`] (the online softmax). Meanwhile the K/V go to rank
//! `r + 1` ([`Communicator::exchange`](crate::comm::Communicator::exchange)
//! on a helper thread, overlapping the step). With grouped-query
//! attention only the `kv_heads` travel. Each rank keeps its output and
//! log-sum-exp for the backward.
//!
//! # Backward ([`ring_backward`])
//!
//! The same steps and pairs. With the whole attention's log-sum-exp and
//! `delta = rowsum(d_out * out)`, one block's probabilities and softmax
//! gradient need nothing from the other blocks (FlashAttention-2's
//! backward), so each step gives its `dq` share (kept) and its `dk`, `dv`
//! shares of the block held. Those travel with the K/V: at step `t` a rank
//! adds its share to the sum the previous rank sent for the same block,
//! and after the last step one more transfer brings every rank the `dk`,
//! `dv` of its own keys. Traffic per rank: K/V `cp - 1` times forward and
//! backward, `dk`, `dv` `cp` times.
//!
//! # Not done yet
//!
//! This is the numerical core, tested against the one-rank attention with
//! the CPU attention core as the block kernel (`ferrotron-models`'
//! `HostBlockAttention`). Still to come:
//!
//! - the decoder's attention as one autodiff node over the ring (forward
//!   keeps `q`, `k`, `v`, the output and the log-sum-exp; backward runs
//!   [`ring_backward`]) on the CP group
//!   ([`ProcessGroups::cp`](crate::groups::ProcessGroups::cp)); the
//!   inputs (ids, targets, goldfish mask) split by [`ChunkLayout::split`];
//!   RoPE, learned positions and ALiBi from [`ChunkLayout::positions`];
//!   the loss and its token count summed over the CP group;
//! - gradients reduced, and ZeRO sharded, over DP x CP (a group of the
//!   ranks with the same PP and TP index);
//! - the user-facing degree (`parallelism.cp`, `--cp`) and its checks
//!   ([`SplitError`], [`MeshError`](crate::mesh::MeshError)), the planner's
//!   CP model;
//! - the CubeCL kernels' `(output, lse)` form with global positions; the
//!   CPU block's bias `[heads or 1, len_q, len_k]` is built per step (a
//!   mask from positions inside the kernel would avoid it);
//! - the all-to-all (Ulysses) kind.

mod backward;
mod block;
mod forward;
pub mod pairing;
pub mod split;
mod transport;

pub use backward::{ring_backward, Kept, RingBackward};
pub use block::{merge, Block, BlockAttention, HeadBuf, WholeRows};
pub use forward::{ring_forward, RingForward};
pub use pairing::Pairing;
pub use split::{ChunkLayout, SplitError};

#[cfg(test)]
mod tests;
