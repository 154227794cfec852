//! The result file of `bench train --json`, also written by
//! `scripts/bench_torch.py`, so that `--compare` merges both.
//!
//! One object: `schema` ([`SCHEMA`]), `results` (one [`Record`] per
//! backend run) and `skipped` (backends not run, with the reason). Units
//! are in the field names; every figure carries its device and backend.

use std::path::Path;

use ferrotron_parallel::recompute::Recompute;
use serde::{Deserialize, Serialize};

use crate::error::usage;

/// The value of the `schema` field this build reads and writes.
pub const SCHEMA: &str = "ferrotron-bench-train/1";

/// A whole result file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultFile {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// One entry per backend that ran.
    pub results: Vec<Record>,
    /// Backends that did not run, and why.
    pub skipped: Vec<Skipped>,
}

/// A backend left out of a run.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Skipped {
    /// Backend name.
    pub backend: String,
    /// Why it did not run.
    pub reason: String,
}

/// The model shape of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shape {
    /// `gpt`, `llama`, `bloom`, or `custom` (switches of no one family).
    pub family: String,
    /// Transformer blocks.
    pub layers: usize,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Inner width of the MLP.
    pub ffn: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Whether the head reuses the token embedding.
    pub tied_head: bool,
    /// Parameters (a tied head counted once).
    pub params: u64,
}

impl Shape {
    /// `gpt l6 h384 a6/6 f1536 V50304 tied`: the shape in one word group.
    pub fn label(&self) -> String {
        format!(
            "{} l{} h{} a{}/{} f{} V{}{}",
            self.family,
            self.layers,
            self.hidden,
            self.heads,
            self.kv_heads,
            self.ffn,
            self.vocab,
            if self.tied_head { " tied" } else { "" }
        )
    }
}

/// One backend's measurement.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// What ran the step: `ferrotron 0.1.0`, `pytorch 2.5.1 eager`.
    pub framework: String,
    /// Source commit of the framework, where known.
    pub commit: Option<String>,
    /// Backend: `flex`, `ndarray`, `cuda`, `rocm` (Ferrotron); `cpu`, `cuda` (PyTorch).
    pub backend: String,
    /// The device: CPU model name or GPU name.
    pub device: String,
    /// CPU threads of the compute (`None` on GPUs).
    pub threads: Option<usize>,
    /// The model.
    pub shape: Shape,
    /// Compute precision: `fp32`, `bf16` or `fp16` (absent in older files:
    /// fp32).
    #[serde(default = "fp32")]
    pub precision: String,
    /// What backward recomputed (absent in older files: none).
    #[serde(default)]
    pub recompute: Recompute,
    /// How the head and the loss ran (Ferrotron): `chunked` (row blocks, see
    /// `ops::linear_cross_entropy`) or `logits` (the whole logits); absent
    /// in older files and PyTorch's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
    /// `matrix-units` when the run asked for the fused attention on the
    /// matrix units (`--attention-kernel`; they run where the device has
    /// them for the dtype and head dimension); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_kernel: Option<String>,
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Untimed steps before the timed ones.
    pub warmup: usize,
    /// Timed steps.
    pub steps: usize,
    /// Median wall time of one timed step, seconds.
    pub step_s_median: f64,
    /// `batch x seq / step_s_median`.
    pub tokens_per_s: f64,
    /// FLOPs of one token, forward + backward and the recomputation
    /// (`DecoderConfig::train_flops_per_token`, Megatron's count).
    pub flops_per_token: f64,
    /// `flops_per_token x tokens_per_s / 1e12`.
    pub tflops: f64,
    /// The device peak MFU divides by, TFLOP/s; `None` when unknown.
    pub peak_tflops: Option<f64>,
    /// Where the peak comes from.
    pub peak_source: String,
    /// Model FLOPs utilisation (PaLM's MFU): the FLOPs of the model
    /// without recomputation x tokens/s over `peak_tflops`; `None` when the
    /// peak is unknown.
    pub mfu: Option<f64>,
    /// Hardware FLOPs utilisation (PaLM's HFU): `tflops / peak_tflops`, the
    /// recomputation counted; equal to `mfu` without it. `None` when the
    /// peak is unknown, and in files that do not report it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hfu: Option<f64>,
    /// Peak memory, bytes, as `memory_source` defines it; `None` when not measured.
    pub peak_memory_bytes: Option<u64>,
    /// What `peak_memory_bytes` counts.
    pub memory_source: String,
    /// GPU backends: device bytes in live allocations after the last step
    /// (CubeCL's memory pools); absent on CPU backends and in older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_bytes_in_use: Option<u64>,
    /// The largest over the timed steps of the heap's peak during a step
    /// above the heap at its start (`peak_activation_bytes` of `ferrotron
    /// train`'s metrics), bytes; CPU backends only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_activation_bytes: Option<u64>,
    /// Loss of the last timed step, nats/token.
    pub last_loss: f64,
}

/// The precision of a record that does not name one.
fn fp32() -> String {
    "fp32".into()
}

impl ResultFile {
    /// Reads and checks a result file; every problem is a usage error
    /// naming `path` and the `flag` it came from.
    pub fn read(path: &Path, flag: &str) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| usage(format!("{flag} {}: {e}", path.display())))?;
        let file: ResultFile = serde_json::from_str(&text).map_err(|e| {
            usage(format!(
                "{flag} {}: not a bench train result: {e}",
                path.display()
            ))
        })?;
        if file.schema != SCHEMA {
            return Err(usage(format!(
                "{flag} {}: schema '{}', this build reads '{SCHEMA}'",
                path.display(),
                file.schema
            )));
        }
        Ok(file)
    }
}
