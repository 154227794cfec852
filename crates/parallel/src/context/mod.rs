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
//! This is the numerical core, tested against the one-rank attention
//! (CPU kernel in `ferrotron-models`). Still to come: the decoder calling
//! it as one autodiff node (the CP group from [`ProcessGroups::cp`]
//! (crate::groups::ProcessGroups::cp), split inputs, the loss summed over
//! the CP group), the user-facing `cp` degree and its checks, ZeRO's
//! group over DP x CP, the CubeCL kernels' `(output, lse)` form, the
//! all-to-all (Ulysses) kind, and the planner's CP model.

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
