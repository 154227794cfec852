//! The command-line tests of `ferrotron`, one test binary (each binary
//! links the whole of Burn, so the files are modules of one).

mod common;
#[path = "common/mpirun.rs"]
mod mpirun;

mod bench_kernels;
mod bench_train;
mod cli;
mod data_parallel;
mod data_shards;
mod docs;
mod export_stream;
mod goldfish;
mod gpu_check;
mod hf;
mod memory;
mod mixed_precision;
mod nccl_training;
mod overlap;
mod pipeline_parallel;
mod plan;
mod plan_memory;
mod recompute;
mod resume;
mod sigkill_ranks;
mod tensor_parallel;
mod wgpu_training;
