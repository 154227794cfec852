//! The benchmark's output: an aligned table and a JSON file.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use super::cases::Case;

/// Median time and peak memory of one path at one shape.
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    /// Median wall time of forward + backward, ms.
    pub ms: f64,
    /// Peak bytes (device bytes in use for the fused path, heap for the reference).
    pub peak_bytes: u64,
}

/// One table / JSON row.
#[derive(Debug, Serialize)]
pub struct Row {
    /// Kernel name.
    pub kernel: &'static str,
    /// Shape, e.g. `[4, 8, 1024, 64]`.
    pub shape: String,
    /// Fused forward + backward, median ms.
    pub fused_ms: f64,
    /// Reference forward + backward, median ms (`None` when skipped).
    pub reference_ms: Option<f64>,
    /// `fused_ms / reference_ms`.
    pub time_ratio: Option<f64>,
    /// Fused device bytes in use after forward + backward, MiB.
    pub fused_peak_mib: f64,
    /// Reference peak heap during forward + backward, MiB.
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
    /// The row of `case`; `reference` is `None` when skipped for `note`.
    pub fn new(
        case: &Case,
        fused: Measured,
        reference: Option<Measured>,
        note: Option<String>,
    ) -> Self {
        let fused_peak_mib = mib(fused.peak_bytes);
        let reference_peak_mib = reference.map(|r| mib(r.peak_bytes));
        Row {
            kernel: case.kernel(),
            shape: case.to_string(),
            fused_ms: fused.ms,
            reference_ms: reference.map(|r| r.ms),
            time_ratio: reference.map(|r| fused.ms / r.ms),
            fused_peak_mib,
            reference_peak_mib,
            memory_ratio: reference_peak_mib.map(|r| fused_peak_mib / r),
            note,
        }
    }
}

/// What the columns measure, printed above the table and stored in the JSON.
fn legend(reps: usize) -> String {
    format!(
        "forward + backward, f32; time = median of {reps} timed run(s) after 1 warm-up. \
         fused = ferrotron-kernels on cubecl wgpu (default adapter), memory = device bytes \
         in use after the backward (inputs, outputs, saved tensors). reference = Burn \
         Autodiff<Flex> on the CPU, memory = peak Rust heap from the inputs to the end of \
         the backward."
    )
}

/// The rows as an aligned text table, with the legend above it.
pub fn table(rows: &[Row], reps: usize) -> String {
    let opt = |v: Option<f64>, digits: usize| match v {
        Some(v) => format!("{v:.digits$}"),
        None => "-".to_string(),
    };
    let mut cells = vec![[
        "kernel",
        "shape",
        "fused ms",
        "ref ms",
        "fused/ref",
        "fused MiB",
        "ref MiB",
        "fused/ref",
    ]
    .map(String::from)];
    for r in rows {
        cells.push([
            r.kernel.to_string(),
            r.shape.clone(),
            format!("{:.1}", r.fused_ms),
            opt(r.reference_ms, 1),
            opt(r.time_ratio, 2),
            format!("{:.1}", r.fused_peak_mib),
            opt(r.reference_peak_mib, 1),
            opt(r.memory_ratio, 2),
        ]);
    }
    let widths: Vec<usize> = (0..8)
        .map(|c| cells.iter().map(|row| row[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = format!("{}\n", legend(reps));
    for row in &cells {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (cell, &w))| {
                if c < 2 {
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
            out.push_str(&format!("{} {}: {note}\n", r.kernel, r.shape));
        }
    }
    out
}

/// Writes `{ "legend", "reps", "rows" }` to `path` through a temporary file
/// in the same directory and a rename, so readers never see half a file.
pub fn write_json(path: &Path, rows: &[Row], reps: usize) -> Result<()> {
    let doc = serde_json::json!({ "legend": legend(reps), "reps": reps, "rows": rows });
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
