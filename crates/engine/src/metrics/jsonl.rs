//! `metrics.jsonl`: one JSON object per optimizer step and per validation.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{GradCommTimes, MemoryBytes, PipelineTimes};

/// What one optimizer step measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Optimizer step, 1-based.
    pub step: usize,
    /// Mean training cross-entropy of the step's global batch, nats/token.
    pub loss: f64,
    /// Learning rate used for the step.
    pub lr: f64,
    /// Global L2 norm of the gradients before clipping.
    pub grad_norm: f64,
    /// Tokens processed by the step divided by its wall time, tokens/s.
    pub tokens_per_s: f64,
    /// Achieved FLOP/s per device, recomputation included, in TFLOP/s (1e12 FLOP/s).
    pub tflops_per_device: f64,
    /// Model FLOPs utilisation (PaLM's MFU): the model's FLOPs of the
    /// step's tokens, recomputation not counted, per second over the device
    /// peak, 0..1.
    pub mfu: f64,
    /// Hardware FLOPs utilisation (PaLM's HFU): the FLOPs done, the forward
    /// work `--recompute` repeats included (`tflops_per_device` over the
    /// peak), 0..1; equal to `mfu` without recomputation.
    #[serde(default)]
    pub hfu: f64,
    /// Wall time of the step, seconds.
    pub step_time_s: f64,
    /// Training state held by the writing rank (rank 0), bytes by class
    /// (`param_bytes`, `grad_bytes`, `optimizer_bytes` in the JSON).
    #[serde(flatten)]
    pub memory: MemoryBytes,
    /// Peak activation memory of the step on rank 0, bytes: the highest
    /// heap in use during the step above the heap in use when it began,
    /// counted by [`super::CountingAllocator`] over every thread of the
    /// process. That is what forward keeps for backward (activations, the
    /// autodiff graph) plus the step's transient buffers alive at the
    /// moment of the peak (a micro-batch's gradients, communication
    /// buffers, the optimizer's temporaries); parameters, gradients and
    /// optimizer state held across steps are in the heap at the start and
    /// are not counted. Absent on GPU backends (their activations are not
    /// on the host heap) and when the allocator is not installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_activation_bytes: Option<u64>,
    /// Device memory of rank 0's GPU after the step, bytes in live
    /// allocations as CubeCL's memory pools count them (parameters,
    /// optimizer state and whatever the step left alive); absent on CPU
    /// backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_bytes_in_use: Option<u64>,
    /// Bytes CubeCL's memory pools hold on rank 0's GPU after the step.
    /// The pools grow to the largest demand so far and keep it, so this
    /// bounds the peak of every step so far from above (CubeCL 0.10 counts
    /// no peak); absent on CPU backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_bytes_reserved: Option<u64>,
    /// Energy the step used by rank 0's counter (RAPL: the CPU packages of
    /// its node; NVML or ROCm SMI: its GPU), joules; absent without a counter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy_j: Option<f64>,
    /// Tokens per joule of the devices the counter covers (RAPL: the step's
    /// tokens; one GPU: the step's tokens over the ranks); absent without a
    /// counter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_joule: Option<f64>,
    /// The loss or gradient norm was not finite and the update was not
    /// applied (`--on-nonfinite skip`).
    #[serde(default)]
    pub skipped: bool,
    /// Stage times and the measured bubble of a pipeline-parallel step
    /// (`--pp` > 1); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<PipelineTimes>,
    /// The gradient synchronisation's communication over the DP group and
    /// how much of it the compute thread waited for (`--overlap-grad-reduce`
    /// hides part of it behind backward); absent on one DP rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_comm: Option<GradCommTimes>,
    /// Under dynamic loss scaling (fp16): the scale the step's loss was
    /// multiplied by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f64>,
    /// Under dynamic loss scaling: steps skipped for overflow since the
    /// run began (a resumed run counts from its first start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped_steps: Option<usize>,
}

/// A validation measurement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ValRecord {
    /// Optimizer steps taken before the measurement (0 = before training).
    pub step: usize,
    /// Mean validation cross-entropy, nats/token.
    pub val_loss: f64,
}

/// A setting a resumed run changed under `--override`, recorded once, at
/// the first step that uses the new value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OverrideRecord {
    /// The first optimizer step (1-based) computed with the new value.
    pub step: usize,
    /// The key, `section.key` (`optimizer.lr`).
    #[serde(rename = "override")]
    pub key: String,
    /// Its value before (`null`: unset).
    pub was: serde_json::Value,
    /// Its value from `step` on.
    pub now: serde_json::Value,
}

/// Appends records to a `metrics.jsonl` file, flushing after each line.
pub struct MetricsWriter {
    out: BufWriter<File>,
}

impl MetricsWriter {
    /// Creates (or truncates) the file at `path`.
    pub fn create(path: &Path) -> std::io::Result<Self> {
        let f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(path)?;
        Ok(Self {
            out: BufWriter::new(f),
        })
    }

    /// Opens the file at `path` for appending (a resumed run), creating it
    /// if needed.
    pub fn append(path: &Path) -> std::io::Result<Self> {
        let f = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self {
            out: BufWriter::new(f),
        })
    }

    /// Writes one record as a line of JSON.
    pub fn write<T: Serialize>(&mut self, record: &T) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.out, record)?;
        self.out.write_all(b"\n")?;
        self.out.flush()
    }
}
