//! The models crate's integration tests, one test binary (each binary
//! links the whole of Burn, so the files are modules of one).

mod common;

mod cpu_elementwise;
mod decoder_behaviour;
mod fused_kernels;
mod hf_parity;
mod layer_references;
mod linear_cross_entropy;
mod mixed_precision;
mod recompute;
mod ring_attention;
mod zero_one_rank;
