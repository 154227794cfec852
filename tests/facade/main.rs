//! The facade crate's tests, one binary (each test binary links all of
//! Burn): the library used from another crate (`training`), and the
//! multi-rank equivalence tests of data, tensor, pipeline and context
//! parallelism and ZeRO (in f32, in bf16 under DP, and over 100 bf16
//! steps under cp2 x tp2 + SP), of the overlapped
//! gradient reduction, of NCCL as the transport and of the goldfish loss
//! under DP, TP and PP, of a Hugging Face directory trained under
//! tp2 x pp2, and of sharded checkpoints resumed in other
//! layouts (`reshard`), which build each job's `JobConfig` in code and run
//! it through `Job` on one rank and under `mpirun` (`equivalence` holds
//! what they share).

mod bf16_curve;
mod context_parallel;
mod data_parallel;
mod equivalence;
mod goldfish;
mod hf_dir;
mod mixed_precision;
mod nccl;
mod overlap;
mod pipeline_parallel;
mod reshard;
mod tensor_parallel;
mod training;
