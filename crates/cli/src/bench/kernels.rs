//! `ferrotron bench kernels`: times and peak memory of every fused op
//! against its reference, over the shape sweep.

use std::time::Duration;

use anyhow::{ensure, Result};

use super::cases::{sweep, Case};
use super::report::{self, Measured, Row};
use super::{fused, reference};
use crate::args::KernelsBenchArgs;

/// One forward + backward: wall time and peak bytes.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Wall time of forward + backward.
    pub elapsed: Duration,
    /// Peak bytes, as each path defines it (see `fused::run`, `reference::run`).
    pub peak_bytes: u64,
}

/// Runs the sweep, prints the table and writes the JSON if asked.
pub fn run(args: KernelsBenchArgs) -> Result<()> {
    ensure!(args.reps >= 1, "--reps must be at least 1");
    let cases: Vec<Case> = sweep(args.quick, args.min_seq, args.max_seq)
        .into_iter()
        .filter(|c| args.only.as_deref().is_none_or(|k| k == c.kernel()))
        .collect();
    ensure!(
        !cases.is_empty(),
        "--only {:?} with --min-seq {} --max-seq {}: no shape of the sweep is left (kernels: \
         attention, swiglu, rms_norm, layer_norm, rope, cross_entropy)",
        args.only.as_deref().unwrap_or("(all)"),
        args.min_seq,
        args.max_seq
    );
    let client = fused::client()?;
    let available = available_bytes();
    let mut rows = Vec::new();
    let measure = |once: &mut dyn FnMut() -> Result<Sample>| measure(args.warmup, args.reps, once);
    for case in cases {
        eprintln!("bench: {} {case}", case.kernel());
        let fused = measure(&mut || fused::run(&client, &case))?;
        let (reference, note) = match skip_reason(&case, available) {
            Some(reason) => (None, Some(reason)),
            None => (Some(measure(&mut || Ok(reference::run(&case)))?), None),
        };
        rows.push(Row::new(&case, fused, reference, note));
    }
    print!("{}", report::table(&rows, args.reps));
    if let Some(path) = &args.json {
        report::write_json(path, &rows, args.reps)?;
    }
    Ok(())
}

/// `warmup` untimed runs, then `reps` runs: median time, largest peak.
fn measure(
    warmup: usize,
    reps: usize,
    once: &mut dyn FnMut() -> Result<Sample>,
) -> Result<Measured> {
    for _ in 0..warmup {
        once()?;
    }
    let samples = (0..reps).map(|_| once()).collect::<Result<Vec<_>>>()?;
    let mut ms: Vec<f64> = samples
        .iter()
        .map(|s| s.elapsed.as_secs_f64() * 1e3)
        .collect();
    ms.sort_by(f64::total_cmp);
    Ok(Measured {
        ms: ms[ms.len() / 2],
        peak_bytes: samples.iter().map(|s| s.peak_bytes).max().unwrap_or(0),
    })
}

/// Why the reference of `case` is not run: its `[batch, heads, seq, seq]`
/// tensors would not fit in three quarters of the available memory.
fn skip_reason(case: &Case, available: Option<u64>) -> Option<String> {
    let need = case.reference_bytes_estimate();
    let available = available?;
    (need > available / 4 * 3).then(|| {
        format!(
            "reference skipped: needs ~{:.1} GiB of score tensors, {:.1} GiB available",
            need as f64 / GIB,
            available as f64 / GIB
        )
    })
}

const GIB: f64 = (1u64 << 30) as f64;

/// `MemAvailable` of /proc/meminfo in bytes; `None` where it cannot be read.
fn available_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
