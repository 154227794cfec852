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
//! # In one process ([`simulate_ring`])
//!
//! The same steps with the transfers replaced by indexing: every rank's
//! forward, then every rank's backward, in one process; the tests check
//! it against the one-rank attention.
//!
//! # In training ([`CpOps`], [`ring_mean`])
//!
//! [`CpOps::ring_attention`] makes the ring one node of the autodiff
//! graph: its forward keeps `q`, `k`, `v`, the output and the log-sum-exp
//! (host buffers), its backward runs [`ring_backward`]. The decoder
//! (`ferrotron-models`' `Decoder::with_context_parallel`) splits the ids
//! and targets by [`ChunkLayout::split`]'s layout, takes RoPE, learned
//! positions and ALiBi from [`ChunkLayout::positions`], and sums the loss
//! over the ring ([`ring_mean`]). The gradients are reduced, and ZeRO
//! shards, over DP x CP
//! ([`ProcessGroups::dp_cp`](crate::groups::ProcessGroups::dp_cp)); the
//! trainer weights each rank's loss by `cp`, as Megatron-Core does, since
//! that group averages. The job layer's key is `parallelism.cp` (`--cp`).
//!
//! With pipeline parallelism each stage runs its own ring and sends its
//! rank's chunks' hidden states (`seq / cp` rows) to the same CP rank of
//! the next stage; the planner prices the ring in `plan::ring`.
//!
//! # Mixed precision
//!
//! Under bf16 or fp16 compute the ring runs on the compute dtype's
//! values in f32, as the one-rank attention does (its kernels take f32
//! and round the output and the gradients once): `q`, `k`, `v` are 16-bit
//! tensors, so the K/V blocks the ring passes are exactly what a 16-bit
//! transfer would carry; the partial outputs and log-sum-exps merge in
//! f32 ([`merge`]); the output is rounded once to the compute dtype. In
//! the backward the `dk`, `dv` partial sums travel in f32 and `dq`, `dk`,
//! `dv` are rounded once at the end, as the one-rank backward rounds its
//! f32 gradients. fp16's loss scale is in the loss weight every ring rank
//! applies; the overflow check is the global gradient norm, summed over
//! DP x CP (see `Trainer::with_loss_scaling`).
//!
//! # On device tensors ([`RingBuf`], [`RingTransport`], [`DeviceRing`])
//!
//! The steps are generic over the buffer ([`RingBuf`]: [`HeadBuf`] on the
//! host, an f32 `Tensor<B, 4>` on the device, whose slices, sums and
//! merge are Burn operations) and over the transport ([`RingTransport`]:
//! any communicator for host buffers, as above; [`DeviceRing`] for
//! tensors, one grouped send/receive of the device collectives
//! (`TensorCollectives::exchange`) per step, not overlapped with the
//! step). [`RingAttention::with_device`] makes [`CpOps::ring_attention`]
//! run this way; each block's kernel is then the model's kernel on the
//! device's tensors where it has one ([`RingAttention::with_device_kernel`],
//! an [`AnyBlockKernel`]: the fused CubeCL attention on the GPU backends),
//! else the host kernel through [`OnHost`]. The job does so under an NCCL
//! transport (`--comm nccl`, and `auto` on the fused kernels of cuda and
//! rocm).
//!
//! # Not done yet
//!
//! - overlapping [`DeviceRing`]'s transfer with the step;
//! - the CPU block's bias `[heads or 1, len_q, len_k]` is built per step (a
//!   mask from positions inside the kernel would avoid it);
//! - the all-to-all (Ulysses) kind.

mod attention;
mod backward;
mod block;
mod buf;
mod device;
mod device_kernel;
mod forward;
mod loss;
mod ops;
pub mod pairing;
pub mod simulate;
pub mod split;
mod transport;

pub use attention::RingAttention;
pub use backward::{ring_backward, Kept, RingBackward};
pub use block::{merge, Block, BlockAttention, HeadBuf, WholeRows};
pub use buf::RingBuf;
pub use device::{DeviceRing, OnHost};
pub use device_kernel::{AnyBlockKernel, BlockKernels, DeviceBlockKernel};
pub use forward::{ring_forward, RingForward};
pub use loss::ring_mean;
pub use ops::CpOps;
pub use pairing::Pairing;
pub use simulate::{simulate_ring, simulate_ring_on};
pub use split::{ChunkLayout, SplitError};
pub use transport::RingTransport;

#[cfg(test)]
mod tests;
