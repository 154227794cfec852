//! Command-line arguments.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use ferrotron_engine::checkpoint::FloatDtype;
use ferrotron_job::JobFlags;
use ferrotron_models::hf::shards::parse_size;

/// Ferrotron: train GPT-2, Llama and BLOOM style language models.
#[derive(Parser, Debug)]
#[command(name = "ferrotron", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train a model (with no flags: a small GPT on the embedded corpus, about a minute on 2 CPU cores).
    Train(Box<TrainArgs>),
    /// Sample text (or token ids) from a trained run or a Hugging Face model directory.
    Generate(GenerateArgs),
    /// Mean next-token loss (and logits) of a model on given token ids.
    Eval(EvalArgs),
    /// Write a run (or a Hugging Face directory) as a Hugging Face model directory.
    Export(ExportArgs),
    /// Rank the parallel layouts (dp, tp, sp, cp, pp and interleaving, ZeRO, offload, micro-batch, recompute) of a model on N GPUs by estimated memory and step time.
    Plan(Box<PlanArgs>),
    /// Benchmarks (`bench train`: training-step throughput per backend; `bench kernels`:
    /// fused CubeCL kernels vs the Burn reference; `bench comm`: NCCL/RCCL collectives on
    /// device buffers vs the host copy path).
    Bench(BenchArgs),
    /// Token shards (`data prepare`: tokenize text into token shards for `train --data`;
    /// `data verify`: every shard against its index).
    Data(DataArgs),
    /// Sharded checkpoints (`checkpoint inspect`: the index; `checkpoint verify`: every block's
    /// checksum).
    Checkpoint(CheckpointArgs),
}

/// `ferrotron checkpoint` subcommands.
#[derive(Args, Debug)]
pub struct CheckpointArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: CheckpointCommand,
}

/// The checkpoint commands; each takes a run directory (its latest
/// checkpoint), its checkpoints/ directory or a checkpoints/step-N directory.
#[derive(Subcommand, Debug)]
pub enum CheckpointCommand {
    /// Print a checkpoint's index: the layout it was written from, every tensor with its
    /// shape, blocks and bytes, and the files.
    Inspect(CheckpointPath),
    /// Read every block of a checkpoint and check it against the XXH3-64 in its index.json;
    /// exit 2 naming the first tensor and file that differ.
    Verify(CheckpointPath),
}

/// The checkpoint a `checkpoint` command reads.
#[derive(Args, Debug)]
pub struct CheckpointPath {
    /// A run directory, its checkpoints/ directory, or a checkpoints/step-N directory.
    #[arg(value_name = "PATH")]
    pub path: PathBuf,
}

/// `ferrotron data` subcommands.
#[derive(Args, Debug)]
pub struct DataArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: DataCommand,
}

/// The data commands.
#[derive(Subcommand, Debug)]
pub enum DataCommand {
    /// Tokenize text files into a token shard set (shards, tokenizer.json, index.json) that
    /// `ferrotron train --data DIR` memory-maps.
    Prepare(PrepareArgs),
    /// Check every shard of a token shard set against its index.json (checksum, size,
    /// header, ids below the vocabulary); exit 2 naming the first shard that differs.
    Verify(VerifyArgs),
}

/// `ferrotron data verify` arguments.
#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// The shard set directory (made by `ferrotron data prepare`).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

/// `ferrotron data prepare` flags.
#[derive(Args, Debug)]
pub struct PrepareArgs {
    /// Input files or quoted glob patterns, in order: UTF-8 text, plain or .gz (one document
    /// per file), or JSON lines (one document per line) with --text-field.
    #[arg(long, required = true, num_args = 1.., value_name = "FILES_OR_GLOBS")]
    pub input: Vec<String>,
    /// The inputs are JSON lines; each line's document is this string field.
    #[arg(long, value_name = "FIELD")]
    pub text_field: Option<String>,
    /// A Hugging Face tokenizer.json to tokenize with (or train one with --vocab-size).
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Train a byte-level BPE of this many tokens on the inputs (as `train` does on its corpus).
    #[arg(long)]
    pub vocab_size: Option<usize>,
    /// The shard set directory to create (must be new or empty).
    #[arg(long)]
    pub out: PathBuf,
    /// Most tokens per shard file.
    #[arg(long, default_value_t = 100_000_000)]
    pub shard_tokens: u64,
}

/// `ferrotron plan` flags.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Model preset (see `ferrotron train --model`).
    #[arg(long)]
    pub model: Option<String>,
    /// A Hugging Face model directory whose config.json gives the shape.
    #[arg(long, value_name = "DIR")]
    pub hf_dir: Option<PathBuf>,
    /// Width of the residual stream (overrides the preset or config).
    #[arg(long)]
    pub hidden: Option<usize>,
    /// Transformer blocks.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Query heads.
    #[arg(long)]
    pub heads: Option<usize>,
    /// Key/value heads (grouped-query attention).
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// Inner width of the MLP.
    #[arg(long)]
    pub ffn: Option<usize>,
    /// Vocabulary size.
    #[arg(long)]
    pub vocab: Option<usize>,
    /// GPUs in all.
    #[arg(long)]
    pub gpus: usize,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    pub gpus_per_node: usize,
    /// GPU type: a100-40gb, a100-80gb, h100-80gb, h200, mi250x-gcd, mi300x or cpu.
    #[arg(long, default_value = "h100-80gb")]
    pub gpu: String,
    /// Override the GPU's memory, GiB.
    #[arg(long)]
    pub gpu_mem_gib: Option<f64>,
    /// Override the GPU's peak for the precision, TFLOP/s.
    #[arg(long)]
    pub peak_tflops: Option<f64>,
    /// Override the GPU's board power, W (energy estimate).
    #[arg(long)]
    pub tdp_w: Option<f64>,
    /// Link within a node: nvlink3, nvlink4, infinity-fabric-mi250x, infinity-fabric (default: the GPU's usual one).
    #[arg(long)]
    pub intra: Option<String>,
    /// Link between nodes: ib-hdr, ib-ndr, slingshot-11 (default: the GPU's usual one).
    #[arg(long)]
    pub inter: Option<String>,
    /// Override the intra-node bandwidth per GPU, GB/s (one direction).
    #[arg(long)]
    pub intra_gbps: Option<f64>,
    /// Override the intra-node latency, microseconds.
    #[arg(long)]
    pub intra_us: Option<f64>,
    /// Override the inter-node bandwidth per GPU, GB/s (one direction).
    #[arg(long)]
    pub inter_gbps: Option<f64>,
    /// Override the inter-node latency, microseconds.
    #[arg(long)]
    pub inter_us: Option<f64>,
    /// Sequences per optimizer step.
    #[arg(long)]
    pub global_batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 2048)]
    pub seq_len: usize,
    /// bf16, fp16 (mixed, fp32 master weights) or fp32 (default: bf16; fp32 on cpu).
    #[arg(long)]
    pub precision: Option<String>,
    /// Fraction of the peak that compute reaches.
    #[arg(long, default_value_t = 0.5)]
    pub efficiency: f64,
    /// Memory per GPU set aside for the framework, runtime and fragmentation, GiB.
    #[arg(long, default_value_t = 2.0)]
    pub reserve_gib: f64,
    /// Gradient bucket (and ZeRO-1/2 unit) size, MiB of f32.
    #[arg(long, default_value_t = 25.0)]
    pub bucket_mb: f64,
    /// Count dropout masks (Megatron's GPT; Ferrotron's models have no dropout).
    #[arg(long)]
    pub dropout: bool,
    /// Count an fp32 copy of the gradients under bf16/fp16 (Megatron-LM's optimizer:
    /// 20 bytes per parameter rather than the ZeRO paper's 16).
    #[arg(long)]
    pub fp32_main_grads: bool,
    /// Largest micro-batch tried, sequences.
    #[arg(long, default_value_t = 16)]
    pub max_micro_batch: usize,
    /// ZeRO stages tried, comma-separated.
    #[arg(long, default_value = "0,1,2,3")]
    pub zero: String,
    /// Recomputation tried, comma-separated: none, sel (or selective), full.
    #[arg(long, default_value = "none,sel,full")]
    pub recompute: String,
    /// Do not try sequence parallelism.
    #[arg(long)]
    pub no_sp: bool,
    /// Do not try context parallelism (a ring of cp ranks per sequence).
    #[arg(long)]
    pub no_cp: bool,
    /// How activations are counted: korthikanti (Korthikanti et al. 2022: fused kernels,
    /// Megatron-LM, Ferrotron on GPUs) or ferrotron-cpu (what Burn's autodiff keeps on
    /// Ferrotron's default CPU path, counted primitive by primitive and node by node).
    #[arg(long, default_value = "korthikanti")]
    pub activations: String,
    /// Price the DP collectives overlapped with compute where `ferrotron train` overlaps them
    /// (its default; dp only: tp = cp = pp = 1): only the part compute cannot hide counts in the
    /// step. --overlap-grad-reduce false counts all of it, as a run with the overlap off.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub overlap_grad_reduce: Option<bool>,
    /// ZeRO-3 with overlap: blocks whose all-gathers start ahead (train's --zero3-prefetch).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub zero3_prefetch: usize,
    /// Rows of the ranked table.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Rejected choices shown.
    #[arg(long, default_value_t = 5)]
    pub rejected: usize,
    /// Only layouts `ferrotron train` runs today (f32; see the `today` column).
    #[arg(long)]
    pub runnable: bool,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Print the memory and time breakdown of one choice (a label from the table).
    #[arg(long, value_name = "CHOICE")]
    pub explain: Option<String>,
    /// Also write the best layout that `ferrotron train` runs today as a job file
    /// (`ferrotron train --config FILE`), with the model, batch, precision and backend.
    #[arg(long, value_name = "FILE")]
    pub emit_config: Option<std::path::PathBuf>,
}

/// `ferrotron bench` subcommands.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// What to benchmark.
    #[command(subcommand)]
    pub command: BenchCommand,
}

/// The benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Time and peak memory of each fused kernel vs its Burn reference, forward +
    /// backward, over a sweep of shapes, on every compiled backend (needs the
    /// `kernels-bench` feature).
    Kernels(KernelsBenchArgs),
    /// Training-step throughput (forward + backward + clipping + AdamW) of one model shape
    /// on every compiled backend with a device: tokens/s, TFLOP/s, MFU, peak memory; or,
    /// with --compare, a merged table and chart of result files.
    Train(Box<crate::bench::train::TrainBenchArgs>),
    /// One rank's NCCL / RCCL collectives on device buffers (all-reduce and reduce-scatter in
    /// f32 and bf16 on the wire, all-gather in f32, the pipeline's grouped send/receive in f32
    /// and bf16) against the host copy path: equal values, and the time of each.
    Comm(crate::bench::comm::CommBenchArgs),
}

/// `ferrotron bench kernels` flags.
#[derive(Args, Debug)]
#[cfg_attr(not(feature = "kernels-bench"), allow(dead_code))]
pub struct KernelsBenchArgs {
    /// Tiny shapes (a smoke test of a few seconds).
    #[arg(long)]
    pub quick: bool,
    /// Longest attention sequence, tokens, of the sweep 256, 512, 1024, 2048, 4096, 8192.
    /// The default stops at 1024: on a 2-core CPU (lavapipe) one fused run takes ~1 min at
    /// 2048 and ~4 min at 4096.
    #[arg(long, default_value_t = 1024)]
    pub max_seq: usize,
    /// Shortest attention sequence, tokens, of the sweep (with --max-seq, picks a part of it).
    #[arg(long, default_value_t = 256)]
    pub min_seq: usize,
    /// Values per head of the attention and RoPE shapes: even, at most 256 (64 or 128 in
    /// most models).
    #[arg(long, default_value_t = 64)]
    pub head_dim: usize,
    /// Only this kernel: attention (the row and the tiled forward kernel),
    /// attention_tiled, attention_cmma_bf16 (the fragment kernels on matrix units, run only when named),
    /// attention_mma_bf16 (the register forward and backward on the mma instruction, run
    /// only when named), swiglu, rms_norm, layer_norm, rope or cross_entropy.
    #[arg(long, value_name = "KERNEL")]
    pub only: Option<String>,
    /// With --only attention_mma_bf16: also each tile pair of the register forward (the
    /// backward at its largest tiles) and of the register backward (the forward at its
    /// largest), one row each, the note naming the kernel; where a pair does not fit the
    /// device's shared memory, its row says so.
    #[arg(long)]
    pub mma_tiles: bool,
    /// Time the fused kernels alone: the reference ops do not run and their columns stay
    /// empty. On a GPU the reference's first run at each shape compiles and autotunes
    /// Burn's matmuls, which takes minutes (about 40 s per shape on an H200).
    #[arg(long)]
    pub no_reference: bool,
    /// Untimed runs per path and shape before the timed ones (shader compilation, caches).
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Timed runs per path and shape after the warm-up; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// PyTorch's attention times (the JSON of scripts/bench_torch_attention.py): the
    /// attention rows of the same shape and storage type gain them and the ratio.
    #[arg(long, value_name = "FILE")]
    pub torch: Option<PathBuf>,
    /// Also write the rows as JSON to FILE (atomically).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Backends to measure, comma-separated: flex (the CPU reference), wgpu, cuda, rocm
    /// (the last two with the cargo features of the same name). Default: every compiled
    /// one whose device opens.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub backends: Option<Vec<String>>,
}

/// `ferrotron train` flags: where the job starts from (`--config`,
/// `--resume`), `--print-config`, and one flag per key of the job
/// configuration, which overrides the same key of the file.
#[derive(Args, Debug, Default)]
pub struct TrainArgs {
    /// TOML job file: sections [model], [data], [optimizer], [schedule], [parallelism],
    /// [precision], [checkpoint], [metrics], [backend] (see docs/training.md); flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Continue a run from its latest checkpoint (a run directory) or from a
    /// RUN/checkpoints/step-N directory, with the run's own settings; the layout (at the same
    /// global batch), cadences and outputs other than the run directory may change, the model,
    /// data, seq_len and seed never, what the remaining steps compute only under --override.
    #[arg(long, value_name = "RUN_DIR")]
    pub resume: Option<PathBuf>,
    /// With --resume: let the key section.key (e.g. optimizer.lr, schedule.steps) change
    /// although it changes how the run continues; repeat for several keys. Recorded in
    /// metrics.jsonl at the first step it applies to.
    #[arg(long = "override", value_name = "KEY")]
    pub overrides: Vec<String>,
    /// Print the job configuration (defaults, then --config or the resumed run's, then the
    /// flags) as TOML and exit; `--config` reads it back as the same job.
    #[arg(long)]
    pub print_config: bool,
    /// The job's settings.
    #[command(flatten)]
    pub job: JobFlags,
}

/// `ferrotron generate` flags.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Run directory written by `ferrotron train`.
    #[arg(long)]
    pub run: Option<PathBuf>,
    /// Hugging Face model directory (config.json, safetensors, optional tokenizer.json).
    #[arg(long)]
    pub hf_dir: Option<PathBuf>,
    /// Text to continue (needs a tokenizer).
    #[arg(long, default_value = "ROMEO:")]
    pub prompt: String,
    /// Token ids to continue, comma-separated (e.g. 1,2,3); prints the new ids as a JSON array.
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// Pick the most likely token at every step (same as --temperature 0).
    #[arg(long)]
    pub greedy: bool,
    /// Most tokens to generate; fewer when the model emits an end-of-sequence token.
    #[arg(long, default_value_t = 200)]
    pub max_new_tokens: usize,
    /// Keep generating past end-of-sequence tokens (those of generation_config.json,
    /// config.json or the tokenizer's <|endoftext|>), up to --max-new-tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Softmax temperature (0 = greedy).
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f64,
    /// Sample among the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Compute backend (default: the run's, flex for --hf-dir).
    #[arg(long)]
    pub backend: Option<String>,
}

/// `ferrotron eval` flags.
#[derive(Args, Debug)]
pub struct EvalArgs {
    /// Run directory written by `ferrotron train`.
    #[arg(long)]
    pub run: Option<PathBuf>,
    /// Hugging Face model directory.
    #[arg(long)]
    pub hf_dir: Option<PathBuf>,
    /// JSON file {"input_ids": [[...], ...]}: a batch of equal-length rows.
    #[arg(long)]
    pub tokens: PathBuf,
    /// Write the float32 logits [batch, seq, vocab] as tensor `logits` of this safetensors file.
    #[arg(long)]
    pub logits_out: Option<PathBuf>,
    /// Compute backend (default: the run's, flex for --hf-dir).
    #[arg(long)]
    pub backend: Option<String>,
}

/// `ferrotron export` flags.
#[derive(Args, Debug)]
pub struct ExportArgs {
    /// Run directory written by `ferrotron train`.
    #[arg(long)]
    pub run: Option<PathBuf>,
    /// Hugging Face model directory (re-exported in our canonical form).
    #[arg(long)]
    pub hf_dir: Option<PathBuf>,
    /// Output directory; must be new or empty.
    #[arg(long)]
    pub out: PathBuf,
    /// Storage dtype of the weights: f32, bf16 or f16 (default: the dtype the model was
    /// loaded in; f32 for Ferrotron runs).
    #[arg(long)]
    pub dtype: Option<FloatDtype>,
    /// Largest weights file: bytes or a size such as 5GB, 500MB, 2GiB. Larger models are
    /// split into model-00001-of-0000N.safetensors plus model.safetensors.index.json.
    #[arg(long, default_value = "5GB", value_parser = parse_size)]
    pub max_shard_size: u64,
}
