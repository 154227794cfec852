//! The models crate's integration tests, one test binary (each binary
//! links the whole of Burn, so the files are modules of one).

mod common;

/// Counts each thread's heap, for the memory tests of `sharded_init`,
/// `hf_slice` and `hf_stream`.
#[global_allocator]
static ALLOCATOR: common::thread_heap::ThreadCounting = common::thread_heap::ThreadCounting;

mod cpu_elementwise;
mod decoder_behaviour;
mod fused_adamw;
mod fused_kernels;
mod hf_parity;
mod hf_slice;
mod hf_stream;
mod layer_references;
mod linear_cross_entropy;
mod linear_cross_entropy_cube;
mod mixed_precision;
mod recompute;
mod ring_attention;
mod sharded_init;
mod zero3_pieces;
mod zero_one_rank;
