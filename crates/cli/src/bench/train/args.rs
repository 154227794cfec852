//! `ferrotron bench train` flags.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use ferrotron_engine::precision::Precision;
use ferrotron_job::config::AttentionKernelChoice;
use ferrotron_models::Kernels;
use ferrotron_parallel::recompute::Recompute;

/// A model family for the shape flags: the switches of Ferrotron's presets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FamilyArg {
    /// GPT-2: learned positions, LayerNorm, GELU-tanh MLP, biases, tied head.
    Gpt,
    /// Llama: RoPE (theta 10000), RMSNorm, SwiGLU, grouped-query attention, no biases,
    /// untied head.
    Llama,
    /// BLOOM: ALiBi, LayerNorm (also after the embedding), GELU MLP, biases, tied head.
    Bloom,
}

/// `ferrotron bench train` flags.
#[derive(Args, Debug, Default)]
pub struct TrainBenchArgs {
    /// Model preset (see `ferrotron train --model`); shape flags override its fields.
    #[arg(long, value_name = "NAME")]
    pub preset: Option<String>,
    /// A Hugging Face model directory whose config.json gives the shape (weights are not
    /// read: the benchmark initialises the model at random).
    #[arg(long, value_name = "DIR")]
    pub hf_dir: Option<PathBuf>,
    /// A family whose switches the shape flags fill in (no weights needed).
    #[arg(long, value_enum)]
    pub family: Option<FamilyArg>,
    /// Transformer blocks.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Width of the residual stream.
    #[arg(long)]
    pub hidden: Option<usize>,
    /// Query heads.
    #[arg(long)]
    pub heads: Option<usize>,
    /// Key/value heads (default: --heads for a multi-head base, else the base's).
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// Inner width of the MLP (default: 4 x --hidden for GELU families, else the base's).
    #[arg(long)]
    pub ffn: Option<usize>,
    /// Vocabulary size.
    #[arg(long)]
    pub vocab: Option<usize>,
    /// Activation recomputation in backward: none, selective (the attention core) or full
    /// (each block from its input), as `ferrotron train --recompute`.
    #[arg(long, default_value_t = Recompute::None, value_name = "none|selective|full")]
    pub recompute: Recompute,
    /// Hot operations, as `ferrotron train --kernels`: fused or reference (plain Burn ops,
    /// the head through the whole logits); default what the backend resolves (on CPUs the
    /// head and loss in row blocks).
    #[arg(long, value_name = "fused|reference")]
    pub kernels: Option<Kernels>,
    /// The fused attention's kernels, as `ferrotron train --attention-kernel`: auto (tiles on
    /// plain units), matrix-units (fragment kernels on tensor cores) or registers (register
    /// kernels on the mma instruction, NVIDIA from sm_80), where the device runs them.
    #[arg(long, value_enum, default_value_t = AttentionKernelChoice::Auto)]
    pub attention_kernel: AttentionKernelChoice,
    /// Compute precision, as `ferrotron train --precision`: fp32, bf16 or fp16 (f32
    /// master weights, gradients and AdamW state; fp16 with dynamic loss scaling); default
    /// bf16 on cuda, fp32 elsewhere (on rocm with a notice: bf16 has not run on an AMD GPU).
    #[arg(long)]
    pub precision: Option<Precision>,
    /// Sequences per step.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 256)]
    pub seq: usize,
    /// Untimed steps first (allocator and caches warm; GPU kernels compiled).
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Timed steps; the median step time is reported.
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    /// Backends to run, comma-separated: flex, ndarray, wgpu, cuda, rocm (default: every compiled
    /// one whose device opens).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub backends: Option<Vec<String>>,
    /// Device peak for MFU, TFLOP/s (default: measured f32 GEMM rate on CPUs, the data
    /// sheet's peak of --device-type on GPUs for the run's precision).
    #[arg(long)]
    pub peak_tflops: Option<f64>,
    /// GPU type whose data-sheet peak MFU uses (fp32 vector units in fp32, matrix units in
    /// bf16/fp16): a100-40gb, a100-80gb, h100-80gb, h200, mi250x-gcd, mi300x.
    #[arg(long)]
    pub device_type: Option<String>,
    /// Seed of the initialisation and of the random token ids.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write the results as JSON to FILE (schema in README, "Benchmarks").
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Merge these result files (of `bench train --json` or scripts/bench_torch.py) into
    /// one table instead of running.
    #[arg(long, num_args = 1.., value_name = "FILES")]
    pub compare: Vec<PathBuf>,
    /// Write a bar chart of tokens/s as SVG to FILE.
    #[arg(long, value_name = "FILE")]
    pub chart: Option<PathBuf>,
}
