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

    /// Opens the file at `path` of a run resumed after optimizer step
    /// `step`, creating it if needed. The records of later steps (written
    /// before the run stopped, and about to be measured again) and lines
    /// that are not JSON (a write torn by a crash) are dropped first, the
    /// file replaced atomically, so that each step appears once.
    pub fn resume(path: &Path, step: usize) -> std::io::Result<Self> {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let kept = records_up_to(&text, step);
                if kept.len() != text.len() {
                    crate::checkpoint::write_atomic(path, kept.as_bytes())
                        .map_err(std::io::Error::other)?;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
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

/// The lines of `text` (a `metrics.jsonl`) that are JSON objects whose
/// `step` is at most `step` (or that have none), each ending in a newline;
/// without the start-up records (`build`, `checkpoint_load`) of earlier
/// attempts to resume from the same step, which this one writes again.
fn records_up_to(text: &str, step: usize) -> String {
    let mut kept = String::with_capacity(text.len());
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let at = v.get("step").and_then(|s| s.as_u64()).unwrap_or(0);
        let phase = v.get("memory_phase").and_then(|p| p.as_str());
        let resumed_here = at == step as u64 && matches!(phase, Some("build" | "checkpoint_load"));
        if at <= step as u64 && !resumed_here {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_file_keeps_the_steps_up_to_the_checkpoint_once() {
        let dir = std::env::temp_dir().join(format!("ferrotron-jsonl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("metrics.jsonl");
        let written = [
            r#"{"memory_phase":"build","rank":0,"step":0}"#,
            r#"{"step":1,"loss":4.5}"#,
            r#"{"step":2,"loss":4.4}"#,
            r#"{"step":2,"val_loss":4.6}"#,
            r#"{"memory_phase":"checkpoint_save","rank":0,"step":2}"#,
            r#"{"step":3,"loss":4.3}"#,
            r#"{"step":3,"val_loss":4.5}"#,
        ];
        // An earlier attempt to resume from step 2 recorded its start-up,
        // then a crash tore its last record.
        let attempt = [
            r#"{"memory_phase":"build","rank":0,"step":2}"#,
            r#"{"memory_phase":"checkpoint_load","rank":0,"step":2}"#,
        ];
        let text = written.join("\n") + "\n" + &attempt.join("\n") + "\n{\"step\":4,\"lo";
        std::fs::write(&path, text).unwrap();
        let mut w = MetricsWriter::resume(&path, 2).unwrap();
        w.write(&ValRecord {
            step: 3,
            val_loss: 4.25,
        })
        .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let want = written[..5].join("\n") + "\n" + r#"{"step":3,"val_loss":4.25}"# + "\n";
        assert_eq!(text, want);
        // A run resumed with no file yet starts one.
        std::fs::remove_file(&path).unwrap();
        MetricsWriter::resume(&path, 2).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
