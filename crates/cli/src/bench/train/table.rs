//! The text table of `bench train` results.

use std::fmt::Write as _;

use ferrotron_parallel::recompute::Recompute;

use super::record::{Record, Skipped};

/// One row per record; `vs first` divides tokens/s by that of the first
/// row with the same shape, batch and seq (the first file of `--compare`).
pub fn render(records: &[Record], skipped: &[Skipped]) -> String {
    let header = [
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
        "vs first",
    ];
    let rows: Vec<[String; 12]> = records
        .iter()
        .map(|r| {
            let first = records
                .iter()
                .find(|f| f.shape == r.shape && f.batch == r.batch && f.seq == r.seq)
                .unwrap_or(r);
            [
                r.framework.clone(),
                r.backend.clone(),
                r.precision.clone(),
                match r.threads {
                    Some(t) => format!("{} ({t} threads)", r.device),
                    None => r.device.clone(),
                },
                match (r.recompute, r.head.as_deref()) {
                    (Recompute::None, Some("logits")) => {
                        format!("{}, whole logits", r.shape.label())
                    }
                    (Recompute::None, _) => r.shape.label(),
                    (other, _) => format!("{}, recompute {other}", r.shape.label()),
                },
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
                format!("{:.2}", r.tokens_per_s / first.tokens_per_s),
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
