//! Training settings: defaults, then `--config FILE.toml`, then flags.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use ferrotron_engine::precision::Precision;
use ferrotron_models::Kernels;
use ferrotron_parallel::recompute::Recompute;
use ferrotron_parallel::zero::ZeroStage;

use crate::comm::CommChoice;
use crate::error::usage;
use crate::pipeline_check::PpSchedule;

/// Every setting of a training run. Defaults are the out-of-the-box run: the
/// small GPT on the embedded corpus, about 3 minutes on 2 CPU cores.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSettings {
    /// Model preset name.
    pub model: String,
    /// Vocabulary of the tokenizer and the model; the preset's when unset.
    pub vocab_size: Option<usize>,
    /// Longest sequence of a new model, tokens (the position table of a
    /// learned-position model; Megatron's `--max-position-embeddings`); the
    /// preset's when unset.
    pub max_seq_len: Option<usize>,
    /// Optimizer steps.
    pub steps: usize,
    /// Sequences per micro-batch.
    pub micro_batch: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Micro-batches accumulated per optimizer step.
    pub grad_accum: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Final learning rate of the cosine decay.
    pub min_lr: f64,
    /// Linear warm-up steps; unset = min([`DEFAULT_WARMUP_STEPS`], steps).
    /// A run records the number it used.
    pub warmup_steps: Option<usize>,
    /// AdamW decoupled weight decay (matrices and embeddings only).
    pub weight_decay: f64,
    /// AdamW beta1.
    pub beta1: f64,
    /// AdamW beta2.
    pub beta2: f64,
    /// AdamW epsilon.
    pub eps: f64,
    /// Global gradient-norm clip (0 disables).
    pub grad_clip: f64,
    /// Seed of initialisation and data order.
    pub seed: u64,
    /// Compute backend (see `ferrotron train --help`).
    pub backend: String,
    /// Run directory (default `runs/<model>-<unix time>`).
    pub out: Option<PathBuf>,
    /// Text corpus (UTF-8, plain or .gz); the embedded Shakespeare when unset.
    pub corpus: Option<PathBuf>,
    /// Token shard set written by `ferrotron data prepare` (instead of a
    /// corpus); memory-mapped.
    pub data: Option<PathBuf>,
    /// Fraction of the token stream held out for validation.
    pub val_fraction: f64,
    /// Validate (and checkpoint) every this many steps.
    pub eval_every: usize,
    /// Validation batches per evaluation.
    pub eval_batches: usize,
    /// Tokens of text sampled at the end of training (0 = none).
    pub sample_tokens: usize,
    /// Prompt of the end-of-training sample.
    pub sample_prompt: String,
    /// Device peak for MFU, TFLOP/s; overrides `device_type`.
    pub peak_tflops: Option<f64>,
    /// Device type whose data-sheet peak is used for MFU (a100, h100, ...).
    pub device_type: Option<String>,
    /// Start from this Hugging Face model directory (its config, weights and
    /// tokenizer) instead of a preset.
    pub hf_dir: Option<PathBuf>,
    /// Also write the trained model as a Hugging Face directory here at the end.
    pub hf_out: Option<PathBuf>,
    /// Timeout of every communicator operation of a multi-rank run, seconds
    /// (`--comm-timeout`); on timeout the error names the missing ranks and
    /// the job is aborted.
    pub comm_timeout_s: f64,
    /// Transport of the process groups of a multi-rank run (`--comm`).
    pub comm: CommChoice,
    /// Data-parallel degree; unset = world size / (tp x pp).
    pub dp: Option<usize>,
    /// Tensor-parallel degree (Megatron-LM: heads, MLP units and the
    /// vocabulary split over `tp` ranks).
    pub tp: usize,
    /// Under TP the vocabulary is padded to a multiple of this times `tp`
    /// (Megatron-LM's `--make-vocab-size-divisible-by`).
    pub make_vocab_size_divisible_by: usize,
    /// Sequence parallelism over the TP group (Korthikanti et al. 2022).
    pub sp: bool,
    /// Pipeline-parallel degree (stages).
    pub pp: usize,
    /// Schedule of the micro-batches over the stages (`--pp-schedule`).
    pub pp_schedule: PpSchedule,
    /// Model chunks per stage of the interleaved schedule (`--pp-virtual`).
    pub pp_virtual: usize,
    /// Blocks per (virtual) stage, in order (`--pp-layers`); unset = as even as possible.
    pub pp_layers: Option<Vec<usize>>,
    /// Gradient all-reduce bucket size for data parallelism, MiB (also
    /// the size of ZeRO-1/2's communication units).
    pub bucket_mb: f64,
    /// ZeRO stage over the DP ranks (0 = off).
    pub zero: ZeroStage,
    /// What backward recomputes (`--recompute`); unset = `none`, or `full`
    /// under ZeRO-3 (see [`TrainSettings::recompute`]).
    pub recompute: Option<Recompute>,
    /// Implementation of the model's hot operations (`--kernels`): fused
    /// CubeCL kernels or the reference Burn ops; unset = fused where the
    /// backend has them (cuda, rocm), reference on the CPU backends.
    pub kernels: Option<Kernels>,
    /// The dtype the model computes in (`--precision`); unset = fp32 on
    /// the CPU backends, bf16 on cuda and rocm.
    pub precision: Option<Precision>,
    /// The precision DP gradients are reduced in (`--reduce-dtype`): fp32
    /// or bf16.
    pub reduce_dtype: Precision,
    /// fp16 only: the dynamic loss scale of the first step (`--loss-scale-init`).
    pub loss_scale_init: f64,
    /// fp16 only: clean steps after which the loss scale doubles
    /// (`--loss-scale-window`).
    pub loss_scale_window: usize,
    /// Write a complete checkpoint (model, optimizer, sampler, step) every
    /// this many steps and after the last; unset = `eval_every`, 0 = never.
    pub save_every: Option<usize>,
    /// Complete checkpoints kept (the newest).
    pub keep_checkpoints: usize,
    /// What a non-finite loss or gradient norm does: stop, or skip the step.
    pub on_nonfinite: OnNonFinite,
    /// With `skip`: stop after this many skipped steps in a row.
    pub max_skipped: usize,
    /// Goldfish loss: drop about one training target in this many (`>= 2`)
    /// from the loss; unset = off.
    pub goldfish_k: Option<usize>,
    /// Goldfish loss: tokens hashed before each target (the paper's `h`).
    pub goldfish_context: usize,
}

/// Warm-up steps when `warmup_steps` is not set (and the run is at least
/// this long).
pub const DEFAULT_WARMUP_STEPS: usize = 20;

/// `--on-nonfinite`: the step's update is never applied; `stop` ends the
/// run (exit 1) naming the step, `skip` goes on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OnNonFinite {
    /// End the run.
    #[default]
    Stop,
    /// Skip the step and go on (up to `--max-skipped` in a row).
    Skip,
}

impl Default for TrainSettings {
    fn default() -> Self {
        Self {
            model: "gpt-mini".into(),
            vocab_size: None,
            max_seq_len: None,
            steps: 250,
            micro_batch: 8,
            seq_len: 128,
            grad_accum: 1,
            lr: 2e-3,
            min_lr: 1e-4,
            warmup_steps: None,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            grad_clip: 1.0,
            seed: 1337,
            backend: "flex".into(),
            out: None,
            corpus: None,
            data: None,
            val_fraction: 0.1,
            eval_every: 50,
            eval_batches: 8,
            sample_tokens: 120,
            sample_prompt: "ROMEO:".into(),
            peak_tflops: None,
            device_type: None,
            hf_dir: None,
            hf_out: None,
            comm_timeout_s: ferrotron_parallel::comm::DEFAULT_TIMEOUT.as_secs_f64(),
            comm: CommChoice::Auto,
            dp: None,
            tp: 1,
            make_vocab_size_divisible_by: ferrotron_parallel::tensor::DEFAULT_VOCAB_DIVISIBLE_BY,
            sp: false,
            pp: 1,
            pp_schedule: PpSchedule::OneFOneB,
            pp_virtual: 1,
            pp_layers: None,
            bucket_mb: ferrotron_parallel::ddp::DEFAULT_BUCKET_MB,
            zero: ZeroStage::Off,
            recompute: None,
            kernels: None,
            precision: None,
            reduce_dtype: Precision::Fp32,
            loss_scale_init: ferrotron_parallel::train::loss_scale::DEFAULT_INIT_SCALE,
            loss_scale_window: ferrotron_parallel::train::loss_scale::DEFAULT_WINDOW,
            save_every: None,
            keep_checkpoints: 2,
            on_nonfinite: OnNonFinite::Stop,
            max_skipped: 5,
            goldfish_k: None,
            goldfish_context: ferrotron_engine::data::DEFAULT_GOLDFISH_CONTEXT,
        }
    }
}

impl TrainSettings {
    /// Reads settings from a TOML file; unknown keys are an error naming the key.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| usage(format!("--config {}: {e}", path.display())))?;
        toml::from_str(&text).map_err(|e| {
            usage(format!(
                "--config {}: {}",
                path.display(),
                e.message().trim()
            ))
        })
    }

    /// Checks every size and rate; the error names the flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        for (flag, v) in [
            ("--lr", self.lr),
            ("--min-lr", self.min_lr),
            ("--weight-decay", self.weight_decay),
            ("--beta1", self.beta1),
            ("--beta2", self.beta2),
            ("--eps", self.eps),
            ("--grad-clip", self.grad_clip),
            ("--val-fraction", self.val_fraction),
            ("--comm-timeout", self.comm_timeout_s),
            ("--bucket-mb", self.bucket_mb),
            ("--peak-tflops", self.peak_tflops.unwrap_or(1.0)),
            ("--loss-scale-init", self.loss_scale_init),
        ] {
            if !v.is_finite() {
                return Err(usage(format!("{flag} must be a finite number, got {v}")));
            }
        }
        if let Some(w) = self.warmup_steps.filter(|&w| w > self.steps) {
            return Err(usage(format!(
                "--warmup-steps {w} exceeds --steps {}",
                self.steps
            )));
        }
        if self.data.is_some() && self.corpus.is_some() {
            return Err(usage(
                "--data with --corpus: train on the shard set or on the text file, not both",
            ));
        }
        if self.min_lr > self.lr {
            return Err(usage(format!(
                "--min-lr {} exceeds --lr {}",
                self.min_lr, self.lr
            )));
        }
        for (flag, v) in [
            ("--steps", self.steps),
            ("--micro-batch", self.micro_batch),
            ("--seq-len", self.seq_len),
            ("--grad-accum", self.grad_accum),
            ("--eval-every", self.eval_every),
            ("--eval-batches", self.eval_batches),
            ("--dp", self.dp.unwrap_or(1)),
            ("--max-seq-len", self.max_seq_len.unwrap_or(1)),
            ("--tp", self.tp),
            (
                "--make-vocab-size-divisible-by",
                self.make_vocab_size_divisible_by,
            ),
            ("--pp", self.pp),
            ("--pp-virtual", self.pp_virtual),
            ("--keep-checkpoints", self.keep_checkpoints),
            ("--max-skipped", self.max_skipped),
            ("--goldfish-context", self.goldfish_context),
            ("--loss-scale-window", self.loss_scale_window),
        ] {
            if v == 0 {
                return Err(usage(format!("{flag} must be positive, got 0")));
            }
        }
        for (flag, v) in [
            ("--lr", self.lr),
            ("--eps", self.eps),
            ("--bucket-mb", self.bucket_mb),
            ("--loss-scale-init", self.loss_scale_init),
        ] {
            if v.is_nan() || v <= 0.0 {
                return Err(usage(format!("{flag} must be positive, got {v}")));
            }
        }
        for (flag, v) in [
            ("--min-lr", self.min_lr),
            ("--weight-decay", self.weight_decay),
            ("--grad-clip", self.grad_clip),
        ] {
            if v.is_nan() || v < 0.0 {
                return Err(usage(format!("{flag} must be non-negative, got {v}")));
            }
        }
        for (flag, v) in [("--beta1", self.beta1), ("--beta2", self.beta2)] {
            if !(0.0..1.0).contains(&v) {
                return Err(usage(format!("{flag} must be in [0, 1), got {v}")));
            }
        }
        if !(0.0..1.0).contains(&self.val_fraction) || self.val_fraction == 0.0 {
            return Err(usage(format!(
                "--val-fraction must be in (0, 1), got {}",
                self.val_fraction
            )));
        }
        if !Duration::try_from_secs_f64(self.comm_timeout_s).is_ok_and(|t| !t.is_zero()) {
            return Err(usage(format!(
                "--comm-timeout must be a positive number of seconds, got {}",
                self.comm_timeout_s
            )));
        }
        if let Some(v) = self.vocab_size {
            let min = ferrotron_engine::data::MIN_VOCAB_SIZE;
            if v < min {
                return Err(usage(format!(
                    "--vocab-size must be at least {min} (256 bytes + <|endoftext|>), got {v}"
                )));
            }
        }
        if let Some(k) = self.goldfish_k {
            if k < 2 {
                return Err(usage(format!(
                    "--goldfish-k must be at least 2 (one token in K is dropped from the loss), got {k}"
                )));
            }
        }
        if self.reduce_dtype == Precision::Fp16 {
            return Err(usage(
                "--reduce-dtype fp16: gradients are reduced in fp32 or bf16 (fp16's range cannot hold loss-scaled sums)",
            ));
        }
        if let Some(p) = self.peak_tflops {
            if p.is_nan() || p <= 0.0 {
                return Err(usage(format!("--peak-tflops must be positive, got {p}")));
            }
        }
        self.recompute()?;
        Ok(())
    }

    /// What backward recomputes: `--recompute`, or when unset `none`, and
    /// `full` under ZeRO-3 (which frees each block's parameters after its
    /// forward, so it always recomputes the block in backward). Refuses
    /// `none` and `selective` with `--zero 3`, and `full` with `--pp` above
    /// 1 (the pipeline keeps each micro-batch's graph from its forward to
    /// its backward; selective runs there).
    pub fn recompute(&self) -> anyhow::Result<Recompute> {
        match (self.recompute, self.zero) {
            (Some(r @ (Recompute::None | Recompute::Selective)), ZeroStage::Three) => {
                Err(usage(format!(
                    "--recompute {r} with --zero 3: ZeRO-3 frees each block's parameters after its forward and recomputes the block in backward, which is --recompute full; leave --recompute unset or give full"
                )))
            }
            (Some(Recompute::Full), _) if self.pp > 1 => Err(usage(format!(
                "--recompute full with --pp {}: the pipeline keeps each micro-batch's autodiff graph from its forward to its backward; use --recompute none or selective",
                self.pp
            ))),
            (Some(r), _) => Ok(r),
            (None, ZeroStage::Three) => Ok(Recompute::Full),
            (None, _) => Ok(Recompute::None),
        }
    }

    /// Linear warm-up steps: `warmup_steps`, or
    /// min([`DEFAULT_WARMUP_STEPS`], `steps`) when unset, so a short run
    /// warms up over its whole length instead of being refused.
    pub fn warmup(&self) -> usize {
        self.warmup_steps
            .unwrap_or(DEFAULT_WARMUP_STEPS.min(self.steps))
    }

    /// Steps between complete checkpoints (0: none).
    pub fn save_every(&self) -> usize {
        self.save_every.unwrap_or(self.eval_every)
    }

    /// The goldfish loss's mask, when `goldfish_k` is set (valid after
    /// [`TrainSettings::validate`]).
    pub fn goldfish(&self) -> Option<ferrotron_engine::data::Goldfish> {
        self.goldfish_k.map(|k| {
            ferrotron_engine::data::Goldfish::new(k, self.goldfish_context)
                .expect("validated by TrainSettings::validate")
        })
    }

    /// The communicator timeout (valid after [`TrainSettings::validate`]).
    pub fn comm_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.comm_timeout_s)
    }
}
