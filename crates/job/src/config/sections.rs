//! The table of every job setting: section, key, type, default, flag.

use std::path::PathBuf;

use ferrotron_engine::precision::Precision;
use ferrotron_models::Kernels;
use ferrotron_parallel::recompute::Recompute;
use ferrotron_parallel::zero::ZeroStage;

use super::choices::{AttentionKernelChoice, CommChoice, Offload, OnNonFinite, PpSchedule};
use super::table::job_sections;
use super::{Change, Key};

job_sections! {
    /// `[model]`: which model is trained.
    [model] ModelSection {
        /// Model preset: gpt-mini, llama-mini, bloom-mini, gpt2, gpt2-medium, gpt2-large,
        /// gpt2-xl, gpt3-13b, llama2-7b, llama3-8b, llama3-70b, llama3.1-8b, llama3.1-70b,
        /// llama3.2-1b, llama3.2-3b, bloom-560m, bloom-7b1, bloom-176b.
        name: String = "gpt-mini".into(), flag model: String;
        /// Vocabulary size of the tokenizer and the model (default: the preset's, or the
        /// shard set's tokenizer's).
        vocab_size: Option<usize> = None, flag vocab_size: usize;
        /// Longest sequence of a new model from a preset, tokens (its position table; default: the
        /// preset's max_seq_len). Megatron's --max-position-embeddings.
        max_seq_len: Option<usize> = None, flag max_seq_len: usize;
        /// Start from a Hugging Face model directory (config, weights, tokenizer) instead of a
        /// preset.
        hf_dir: Option<PathBuf> = None, flag hf_dir: PathBuf;
    }

    /// `[data]`: what the model trains on.
    [data] DataSection {
        /// UTF-8 text corpus, plain or .gz (default: the embedded Shakespeare).
        corpus: Option<PathBuf> = None, flag corpus: PathBuf;
        /// Token shard set written by `ferrotron data prepare` (instead of a corpus),
        /// memory-mapped; the model's vocabulary is its tokenizer's unless vocab_size is given.
        #[arg(value_name = "DIR")]
        shards: Option<PathBuf> = None, flag data: PathBuf;
        /// Fraction of the tokens held out for validation, in (0, 1).
        val_fraction: f64 = 0.1, flag val_fraction: f64;
        /// Goldfish loss (Hans et al. 2024): drop about one target token in K (K >= 2) from the
        /// training loss, chosen by hashing the goldfish_context tokens before it, so the same
        /// text always drops the same tokens (default: off). Validation is not masked.
        #[arg(value_name = "K")]
        goldfish_k: Option<usize> = None, flag goldfish_k: usize;
        /// Goldfish loss: tokens hashed before each target (the paper's h), read from the token
        /// stream, also before a sequence's first token.
        #[arg(value_name = "H")]
        goldfish_context: usize = ferrotron_engine::data::DEFAULT_GOLDFISH_CONTEXT, flag goldfish_context: usize;
    }

    /// `[optimizer]`: AdamW, its learning-rate schedule and what a bad step does.
    [optimizer] OptimizerSection {
        /// Peak learning rate.
        lr: f64 = 2e-3, flag lr: f64;
        /// Final learning rate of the cosine decay.
        min_lr: f64 = 1e-4, flag min_lr: f64;
        /// Linear warm-up steps (default: 20, or the step count when shorter); more than the
        /// step count is refused.
        warmup_steps: Option<usize> = None, flag warmup_steps: usize;
        /// AdamW decoupled weight decay (matrices and embeddings; not norms and biases).
        weight_decay: f64 = 0.1, flag weight_decay: f64;
        /// AdamW beta1, in [0, 1).
        beta1: f64 = 0.9, flag beta1: f64;
        /// AdamW beta2, in [0, 1).
        beta2: f64 = 0.95, flag beta2: f64;
        /// AdamW epsilon.
        eps: f64 = 1e-8, flag eps: f64;
        /// Clip the global gradient norm to this value (0 disables).
        grad_clip: f64 = 1.0, flag grad_clip: f64;
        /// A non-finite loss or gradient norm: stop (default) or skip the step; the update is
        /// never applied.
        #[arg(value_enum)]
        on_nonfinite: OnNonFinite = OnNonFinite::Stop, flag on_nonfinite: OnNonFinite;
        /// With on_nonfinite = skip: most steps skipped in a row; the next non-finite step stops
        /// the run (fp16 loss-scale overflows do not count).
        max_skipped: usize = 5, flag max_skipped: usize;
    }

    /// `[schedule]`: how long the job trains and on what batches.
    [schedule] ScheduleSection {
        /// Optimizer steps.
        steps: usize = 250, flag steps: usize;
        /// Sequences per micro-batch.
        micro_batch: usize = 8, flag micro_batch: usize;
        /// Tokens per sequence.
        seq_len: usize = 128, flag seq_len: usize;
        /// Micro-batches accumulated per optimizer step (a pipeline's micro-batches).
        grad_accum: usize = 1, flag grad_accum: usize;
        /// Seed of initialisation and data order.
        seed: u64 = 1337, flag seed: u64;
        /// Validate (and by default checkpoint) every N steps.
        eval_every: usize = 50, flag eval_every: usize;
        /// Validation batches per evaluation.
        eval_batches: usize = 8, flag eval_batches: usize;
    }

    /// `[parallelism]`: the mesh (dp x pp x cp x tp ranks), ZeRO,
    /// recomputation and the transport of the collectives.
    [parallelism] ParallelismSection {
        /// Data-parallel degree (default: the world size / (tp x cp x pp)); dp x cp x tp x pp
        /// must equal the world size.
        dp: Option<usize> = None, flag dp: usize;
        /// Tensor-parallel degree (Megatron-LM): attention heads, key/value heads, MLP units and
        /// the vocabulary are split over tp ranks; tp must divide the heads, KV heads and ffn size.
        tp: usize = 1, flag tp: usize;
        /// Sequence parallelism (needs tp > 1): norms and the residual stream split along the
        /// sequence over the TP group; the sequence length must divide by tp.
        #[arg(num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
        sp: bool = false, flag sp: bool;
        /// Context-parallel degree: each sequence is cut into 2 x cp chunks, rank r of the ring
        /// holding chunks r and 2cp-1-r, and attention passes keys and values around the ring
        /// (ring attention); seq_len must be a multiple of 2 x cp. Composes with tp (and sp), dp,
        /// ZeRO and pp (each stage's ring passes its rank's chunks to the same ring rank of the
        /// next stage), in any precision.
        cp: usize = 1, flag cp: usize;
        /// Pipeline-parallel degree: the blocks split into pp contiguous stages (embedding on the
        /// first, final norm, head and loss on the last); a step's micro-batches are its
        /// grad_accum micro-batches.
        pp: usize = 1, flag pp: usize;
        /// Pipeline schedule: gpipe, 1f1b (default) or interleaved (with pp_virtual).
        #[arg(value_enum)]
        pp_schedule: PpSchedule = PpSchedule::OneFOneB, flag pp_schedule: PpSchedule;
        /// Model chunks per stage for the interleaved schedule (at least 2).
        #[arg(value_name = "V")]
        pp_virtual: usize = 1, flag pp_virtual: usize;
        /// Blocks per stage (per virtual stage when interleaved), e.g. 3,3 (a list in the file);
        /// default: as even as possible.
        #[arg(value_delimiter = ',', value_name = "N,N,...")]
        pp_layers: Option<Vec<usize>> = None, flag pp_layers: Vec<usize>;
        /// ZeRO stage: 0 off, 1 shard optimizer state, 2 + gradients, 3 + parameters (FSDP).
        zero: ZeroStage = ZeroStage::Off, flag zero: ZeroStage;
        /// Activation recomputation in backward: none, selective (the attention core: scores,
        /// softmax, weighted values) or full (each block from its input); default none, full
        /// under ZeRO-3 (which always recomputes blocks, so none and selective are refused
        /// there). full is refused with pp > 1.
        #[arg(value_name = "none|selective|full")]
        recompute: Option<Recompute> = None, flag recompute: Recompute;
        /// Gradient all-reduce bucket size for data parallelism (and ZeRO-1/2's units), MiB.
        bucket_mb: f64 = ferrotron_parallel::ddp::DEFAULT_BUCKET_MB, flag bucket_mb: f64;
        /// Overlap the DP gradient reduction with backward: each bucket's all-reduce (ZeRO-1/2/3:
        /// each unit's reduce-scatter) starts on a communication thread once its gradients are
        /// complete, ZeRO-3 gathers the next block ahead, and ZeRO-1/2 all-gather a unit's updated
        /// chunks while the next unit is updated; bit-identical results. Honoured when tp, cp and
        /// pp are 1. --overlap-grad-reduce false turns it off.
        #[arg(num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
        overlap_grad_reduce: bool = true, flag overlap_grad_reduce: bool;
        /// ZeRO-3 under overlap_grad_reduce: blocks whose parameter all-gathers start ahead, while
        /// the current block computes, forward and backward (default 1; 0 gathers each block as it
        /// runs). At most N + 1 blocks are gathered at once. Needs zero = 3, and above 0
        /// overlap_grad_reduce (as Megatron-LM's --overlap-param-gather).
        #[arg(value_name = "N")]
        zero3_prefetch: Option<usize> = None, flag zero3_prefetch: usize;
        /// Optimizer offload: none (default) or optimizer, which keeps AdamW's moments of each
        /// rank's ZeRO shard in host memory and updates them on the CPU (under ZeRO-3 the f32
        /// parameter pieces too), as DeepSpeed's offload_optimizer: the device saves 8 bytes per
        /// shard parameter (12 under ZeRO-3) for host memory, PCIe copies and CPU time. Needs
        /// zero >= 1 and a GPU backend (cuda, rocm, wgpu); see docs/parallelism.md.
        #[arg(value_enum)]
        offload: Offload = Offload::None, flag offload: Offload;
        /// Under tp, pad the vocabulary to a multiple of this times tp (Megatron-LM's flag; the
        /// padding is never predicted and is dropped from checkpoints).
        #[arg(value_name = "N")]
        make_vocab_size_divisible_by: usize = ferrotron_parallel::tensor::DEFAULT_VOCAB_DIVISIBLE_BY, flag make_vocab_size_divisible_by: usize;
        /// Multi-rank runs: transport of every process group. auto (default) is nccl on cuda and
        /// rocm when a library loads (with cp > 1, only on the fused kernels), else mpi;
        /// nccl runs NCCL/RCCL through the run-time binding, bootstrapped over MPI: on cuda and
        /// rocm through the GPU's memory, on CPU backends with FERROTRON_NCCL_LIBRARY naming a
        /// library that works on host memory (the test double).
        #[arg(value_enum)]
        comm: CommChoice = CommChoice::Auto, flag comm: CommChoice;
        /// Multi-rank runs: seconds every communicator operation may take; a rank that waits
        /// longer fails naming the ranks that never arrived, and the job is aborted.
        #[arg(value_name = "SECONDS")]
        comm_timeout_s: f64 = ferrotron_parallel::comm::DEFAULT_TIMEOUT.as_secs_f64(), flag comm_timeout: f64;
        /// Before training, refuse a run whose memory per rank (training state, activations and
        /// step buffers, by the planner's model) times the ranks on this host exceeds the host's
        /// available memory (CPU backends; GPU backends get a note). --no-memory-check skips it.
        #[arg(num_args = 0, default_missing_value = "false")]
        memory_check: bool = true, flag no_memory_check: bool;
    }

    /// `[precision]`: the compute dtype and the reduction dtype.
    [precision] PrecisionSection {
        /// Compute precision: fp32, bf16 or fp16 (master weights, gradients and AdamW state stay
        /// fp32; fp16 adds dynamic loss scaling); default bf16 on cuda, fp32 elsewhere (on rocm with
        /// a notice: bf16 has not run on an AMD GPU).
        compute: Option<Precision> = None, flag precision: Precision;
        /// Precision of the DP gradient reduction (all-reduce, ZeRO reduce-scatter): fp32 or bf16.
        #[arg(value_name = "DTYPE")]
        reduce_dtype: Precision = Precision::Fp32, flag reduce_dtype: Precision;
        /// fp16: loss scale of the first step (default 65536 = 2^16).
        #[arg(value_name = "SCALE")]
        loss_scale_init: f64 = ferrotron_parallel::train::loss_scale::DEFAULT_INIT_SCALE, flag loss_scale_init: f64;
        /// fp16: clean steps after which the loss scale doubles.
        #[arg(value_name = "STEPS")]
        loss_scale_window: usize = ferrotron_parallel::train::loss_scale::DEFAULT_WINDOW, flag loss_scale_window: usize;
    }

    /// `[checkpoint]`: the run directory, checkpoints and the export.
    [checkpoint] CheckpointSection {
        /// Run directory (default runs/<model>-<unix time>; required with more than one rank);
        /// must be new or empty.
        out: Option<PathBuf> = None, flag out: PathBuf;
        /// Write a complete checkpoint (model, optimizer, sampler, step) every N steps and after
        /// the last (default: eval_every; 0 = never).
        save_every: Option<usize> = None, flag save_every: usize;
        /// Complete checkpoints kept in RUN/checkpoints (the newest).
        keep_checkpoints: usize = 2, flag keep_checkpoints: usize;
        /// Write checkpoints in the background: the step copies its shards to host memory
        /// and training goes on while a thread writes them; the next save, a stop and the
        /// end of the run wait for it. See docs/checkpoints.md.
        #[arg(num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
        async_checkpoint: bool = false, flag async_checkpoint: bool;
        /// At the end, also write the model as a Hugging Face directory (must be new or empty).
        hf_out: Option<PathBuf> = None, flag hf_out: PathBuf;
        /// A file every rank looks for after each step: once it exists, the run stops as on
        /// SIGTERM (checkpoint, exit 75) and rank 0 removes it. For launchers that kill the
        /// ranks soon after a signal (mpirun); see docs/checkpoints.md.
        #[arg(value_name = "PATH")]
        stop_file: Option<PathBuf> = None, flag stop_file: PathBuf;
    }

    /// `[metrics]`: MFU's peak and the end-of-run sample.
    [metrics] MetricsSection {
        /// Device peak in TFLOP/s for MFU (overrides device_type).
        peak_tflops: Option<f64> = None, flag peak_tflops: f64;
        /// Device type whose data-sheet peak for the run's precision is used for MFU: a100-40gb, a100-80gb, h100-80gb, h200, mi250x-gcd, mi300x.
        device_type: Option<String> = None, flag device_type: String;
        /// Tokens sampled at the end of training (0 = none).
        sample_tokens: usize = 120, flag sample_tokens: usize;
        /// Prompt of the end-of-training sample.
        sample_prompt: String = "ROMEO:".into(), flag sample_prompt: String;
    }

    /// `[backend]`: where the job computes.
    [backend] BackendSection {
        /// Compute backend among those compiled in: flex (default), ndarray, wgpu, cuda, rocm.
        name: String = "flex".into(), flag backend: String;
        /// Hot operations: fused (CubeCL kernels; cuda, rocm, wgpu) or reference (plain Burn ops,
        /// the head through the whole logits); default fused where the backend has them, else
        /// Ferrotron's CPU operations on flex.
        kernels: Option<Kernels> = None, flag kernels: Kernels;
        /// The fused attention's kernels: auto (FlashAttention-2 tiles on plain units),
        /// matrix-units (fragment forward and backward on tensor cores, in 16 bits at head
        /// dimensions that are multiples of 16 up to 128; elsewhere as auto) or registers (the
        /// register forward and backward on the mma instruction, NVIDIA from sm_80, under the
        /// same conditions). Needs fused kernels.
        attention_kernel: AttentionKernelChoice = AttentionKernelChoice::Auto,
            flag attention_kernel: AttentionKernelChoice;
    }
}
