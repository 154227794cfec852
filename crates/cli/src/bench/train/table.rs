//! The text table of `bench train` results.

use std::fmt::Write as _;

use ferrotron_parallel::recompute::Recompute;

use super::record::{Record, Skipped};

/// One row per record, numbered; `vs` divides tokens/s by that of the
/// first row of the same workload (architecture, batch and seq; the
/// parameter count is not compared, as a learned position table's size
/// differs between frameworks) and names that row, so that a ratio across
/// machines or precisions says what it divides by.
pub fn render(records: &[Record], skipped: &[Skipped]) -> String {
    let header = [
        "#",
        "framework",
        "backend",
        "precision",
        "device",
        "model",
        "batch x seq",
        "tokens/s",
        "TFLOP/s",
        "MFU",
        "peak MiB",
        "step act. MiB",
        "vs",
    ];
    let rows: Vec<[String; 13]> = records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let first = records
                .iter()
                .position(|f| same_workload(f, r))
                .unwrap_or(i);
            [
                format!("{}", i + 1),
                r.framework.clone(),
                r.backend.clone(),
                r.precision.clone(),
                match r.threads {
                    Some(t) => format!("{} ({t} threads)", r.device),
                    None => r.device.clone(),
                },
                model_label(r),
                format!("{} x {}", r.batch, r.seq),
                format!("{:.0}", r.tokens_per_s),
                format!("{:.4}", r.tflops),
                r.mfu.map_or("-".into(), |m| format!("{:.1}%", 100.0 * m)),
                r.peak_memory_bytes.map_or("-".into(), |b| {
                    format!("{:.0}", b as f64 / (1 << 20) as f64)
                }),
                r.peak_activation_bytes.map_or("-".into(), |b| {
                    format!("{:.1}", b as f64 / (1 << 20) as f64)
                }),
                format!(
                    "{:.2} of #{}",
                    r.tokens_per_s / records[first].tokens_per_s,
                    first + 1
                ),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", padded.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
    let notes = records
        .iter()
        .map(|r| {
            format!(
                "{} on {}: MFU against {}; memory: {}",
                r.framework, r.backend, r.peak_source, r.memory_source
            )
        })
        .chain(
            skipped
                .iter()
                .map(|s| format!("skipped {}: {}", s.backend, s.reason)),
        );
    let mut seen = Vec::new();
    for note in notes {
        if !seen.contains(&note) {
            let _ = writeln!(out, "{note}");
            seen.push(note);
        }
    }
    out
}

/// Whether `a` and `b` measured the same workload: the architecture (not
/// its parameter count), the batch and the sequence length.
fn same_workload(a: &Record, b: &Record) -> bool {
    a.shape.label() == b.shape.label() && a.batch == b.batch && a.seq == b.seq
}

/// The model column: the shape, and what of the step differs from the
/// default (recomputation, the whole logits, the attention kernel).
pub fn model_label(r: &Record) -> String {
    let mut label = r.shape.label();
    if r.recompute != Recompute::None {
        label += &format!(", recompute {}", r.recompute);
    } else if r.head.as_deref() == Some("logits") {
        label += ", whole logits";
    }
    if let Some(kernel) = &r.attention_kernel {
        label += &format!(", attention {kernel}");
    }
    label
}
