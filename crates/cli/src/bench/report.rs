//! The benchmark's output: an aligned table and a JSON file.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use super::cases::Case;
use super::torch::TorchTimes;

/// Median time and peak memory of one path at one shape.
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    /// Median wall time of forward + backward, ms.
    pub ms: f64,
    /// Median wall time of the forward alone, ms, where the path times it.
    pub forward_ms: Option<f64>,
    /// Median wall time of the backward alone (each run's forward +
    /// backward minus its forward), ms, where the path times the forward.
    pub backward_ms: Option<f64>,
    /// Peak bytes (see the legend for what each path counts).
    pub peak_bytes: u64,
}

/// One table / JSON row: one kernel at one shape on one backend.
#[derive(Debug, Serialize)]
pub struct Row {
    /// Kernel name.
    pub kernel: &'static str,
    /// Shape, e.g. `[4, 8, 1024, 64]`.
    pub shape: String,
    /// Backend: `flex` (the default CPU backend; reference only), `wgpu`,
    /// `cuda` or `rocm`.
    pub backend: &'static str,
    /// Fused forward + backward, median ms (`None` on a CPU backend).
    pub fused_ms: Option<f64>,
    /// Reference forward + backward on the same backend, median ms (`None`
    /// when skipped).
    pub reference_ms: Option<f64>,
    /// `fused_ms / reference_ms`.
    pub time_ratio: Option<f64>,
    /// Fused forward alone, median ms (attention only).
    pub fused_forward_ms: Option<f64>,
    /// Fused backward alone, median ms (attention only).
    pub fused_backward_ms: Option<f64>,
    /// Fused forward + backward, TFLOP/s by the FlashAttention-2 count
    /// (attention only; see `Case::flops`).
    pub fused_tflops: Option<f64>,
    /// Fused forward alone, TFLOP/s (attention only; `Case::forward_flops`).
    pub fused_forward_tflops: Option<f64>,
    /// Fused backward alone, TFLOP/s (attention only; `Case::backward_flops`).
    pub fused_backward_tflops: Option<f64>,
    /// `fused_ms` over the reference's ms on `flex` at the same shape (when
    /// both ran): the fused kernels against the default CPU backend.
    pub time_ratio_vs_flex: Option<f64>,
    /// PyTorch's attention forward + backward at the same shape and
    /// storage type, median ms (`bench kernels --torch FILE`).
    pub torch_ms: Option<f64>,
    /// PyTorch's forward alone, median ms.
    pub torch_forward_ms: Option<f64>,
    /// PyTorch's backward alone, median ms.
    pub torch_backward_ms: Option<f64>,
    /// `fused_ms / torch_ms`.
    pub time_ratio_vs_torch: Option<f64>,
    /// `fused_forward_ms / torch_forward_ms`.
    pub forward_ratio_vs_torch: Option<f64>,
    /// Fused peak memory, MiB.
    pub fused_peak_mib: Option<f64>,
    /// Reference peak memory, MiB.
    pub reference_peak_mib: Option<f64>,
    /// `fused_peak_mib / reference_peak_mib`.
    pub memory_ratio: Option<f64>,
    /// Why the reference was skipped, if it was.
    pub note: Option<String>,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

impl Row {
    /// The row of `case` on `backend`; `reference` is `None` when skipped
    /// for `note`; `flex_reference_ms` is the reference's time on `flex` at
    /// this shape, if it ran; `torch` PyTorch's at this shape and storage
    /// type, if given.
    pub fn new(
        case: &Case,
        backend: &'static str,
        fused: Option<Measured>,
        reference: Option<Measured>,
        flex_reference_ms: Option<f64>,
        torch: Option<TorchTimes>,
        note: Option<String>,
    ) -> Self {
        let ratio = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
        let tflops = |flops: Option<f64>, ms: Option<f64>| Some(flops? / (ms? * 1e-3) / 1e12);
        let fused_ms = fused.map(|f| f.ms);
        let fused_forward_ms = fused.and_then(|f| f.forward_ms);
        let fused_backward_ms = fused.and_then(|f| f.backward_ms);
        let reference_ms = reference.map(|r| r.ms);
        let fused_peak_mib = fused.map(|f| mib(f.peak_bytes));
        let reference_peak_mib = reference.map(|r| mib(r.peak_bytes));
        let torch_ms = torch.map(|t| t.ms);
        let torch_forward_ms = torch.map(|t| t.forward_ms);
        Row {
            kernel: case.kernel(),
            shape: case.to_string(),
            backend,
            fused_ms,
            reference_ms,
            time_ratio: ratio(fused_ms, reference_ms),
            fused_forward_ms,
            fused_backward_ms,
            fused_tflops: tflops(case.flops(), fused_ms),
            fused_forward_tflops: tflops(case.forward_flops(), fused_forward_ms),
            fused_backward_tflops: tflops(case.backward_flops(), fused_backward_ms),
            time_ratio_vs_flex: ratio(fused_ms, flex_reference_ms),
            torch_ms,
            torch_forward_ms,
            torch_backward_ms: torch.map(|t| t.backward_ms),
            time_ratio_vs_torch: ratio(fused_ms, torch_ms),
            forward_ratio_vs_torch: ratio(fused_forward_ms, torch_forward_ms),
            fused_peak_mib,
            reference_peak_mib,
            memory_ratio: ratio(fused_peak_mib, reference_peak_mib),
            note,
        }
    }
}

/// What the columns measure, printed above the table and stored in the JSON.
fn legend(warmup: usize, reps: usize) -> String {
    format!(
        "forward + backward, f32 (but attention_cmma_bf16 and attention_mma_bf16); time = median of {reps} timed run(s) after {warmup} \
         warm-up(s). fused = ferrotron-kernels on the backend's cubecl runtime, memory = \
         device bytes in use after the backward (inputs, outputs, saved tensors). ref = the \
         decoder's reference ops (plain Burn) on the same backend: on flex (the default CPU \
         backend) memory = peak Rust heap from the inputs to the end of the backward; on a \
         CubeCL backend memory = the larger of the device bytes in use after the forward and \
         after the backward (a lower bound of its peak). fused/flex = fused time over the \
         flex reference's time at the same shape. attention: causal; `attention` runs the row \
         forward and backward kernels (one row per unit), `attention_tiled` the tiled ones \
         (FlashAttention-2 tiles in shared memory; the backward's tiles as \
         AttentionBackwardKernel::choose picks them, the row backward where none fit), \
         `attention_cmma_bf16` the fragment forward and backward on matrix units (tensor cores) \
         with bf16 inputs, outputs and gradients (where the device has them; each at its \
         largest tiles that fit), `attention_mma_bf16` the register forward and backward \
         on the mma instruction (scores, probabilities and accumulators in registers), \
         all against the same f32 reference; fwd ms = the fused forward alone, bwd ms = each run's forward \
         + backward minus its forward (medians), each run after an untimed forward on the same \
         inputs; TFLOP/s by the \
         FlashAttention-2 count (forward 4 * batch * heads * seq^2 * head_dim / 2 under the \
         causal mask, backward 2.5 forwards). torch (with --torch FILE) = PyTorch's \
         F.scaled_dot_product_attention as scripts/bench_torch_attention.py timed it at the \
         same shape and storage type (FILE names its implementation), fused/torch = fused \
         time over torch's."
    )
}

/// The rows as an aligned text table, with the legend above it.
pub fn table(rows: &[Row], warmup: usize, reps: usize) -> String {
    let opt = |v: Option<f64>, digits: usize| match v {
        Some(v) => format!("{v:.digits$}"),
        None => "-".to_string(),
    };
    let header = [
        "kernel",
        "shape",
        "backend",
        "fused ms",
        "ref ms",
        "fused/ref",
        "fused/flex",
        "fwd ms",
        "fwd TFLOP/s",
        "bwd ms",
        "bwd TFLOP/s",
        "TFLOP/s",
        "torch ms",
        "fused/torch",
        "fused MiB",
        "ref MiB",
        "fused/ref",
    ];
    let mut cells = vec![header.map(String::from)];
    for r in rows {
        cells.push([
            r.kernel.to_string(),
            r.shape.clone(),
            r.backend.to_string(),
            opt(r.fused_ms, 1),
            opt(r.reference_ms, 1),
            opt(r.time_ratio, 2),
            opt(r.time_ratio_vs_flex, 2),
            opt(r.fused_forward_ms, 1),
            opt(r.fused_forward_tflops, 4),
            opt(r.fused_backward_ms, 1),
            opt(r.fused_backward_tflops, 4),
            opt(r.fused_tflops, 4),
            opt(r.torch_ms, 1),
            opt(r.time_ratio_vs_torch, 2),
            opt(r.fused_peak_mib, 1),
            opt(r.reference_peak_mib, 1),
            opt(r.memory_ratio, 2),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| cells.iter().map(|row| row[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = format!("{}\n", legend(warmup, reps));
    for row in &cells {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (cell, &w))| {
                if c < 3 {
                    format!("{cell:<w$}")
                } else {
                    format!("{cell:>w$}")
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    for r in rows {
        if let Some(note) = &r.note {
            out.push_str(&format!("{} {} {}: {note}\n", r.kernel, r.shape, r.backend));
        }
    }
    out
}

/// Writes `{ "legend", "warmup", "reps", "rows" }` to `path` through a
/// temporary file in the same directory and a rename, so readers never see
/// half a file.
pub fn write_json(path: &Path, rows: &[Row], warmup: usize, reps: usize) -> Result<()> {
    let doc = serde_json::json!({
        "legend": legend(warmup, reps),
        "warmup": warmup,
        "reps": reps,
        "rows": rows,
    });
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    std::fs::write(&tmp, serde_json::to_string_pretty(&doc)? + "\n")
        .with_context(|| format!("--json: cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| {
        format!(
            "--json: cannot rename {} to {}",
            tmp.display(),
            path.display()
        )
    })
}
