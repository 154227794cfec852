//! `ferrotron bench kernels`: times and peak memory of every fused op
//! against its reference, over the shape sweep, on every backend asked for.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{ensure, Result};
use ferrotron_kernels::attention::MAX_HEAD_DIM;

use super::cases::{sweep, Case, CMMA_KERNEL, MMA_KERNEL};
use super::report::{self, Measured, Row};
use super::target;
use super::torch::TorchAttention;
use crate::args::KernelsBenchArgs;
use crate::error::usage;

/// One forward + backward: wall time and peak bytes.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Wall time of forward + backward.
    pub elapsed: Duration,
    /// Wall time of the forward alone, where the path times it (the fused
    /// attention kernels).
    pub forward: Option<Duration>,
    /// Peak bytes, as each path defines it (see `fused::run`, `reference::run`).
    pub peak_bytes: u64,
}

/// Runs the sweep on every target, prints the table and writes the JSON if
/// asked.
pub fn run(args: KernelsBenchArgs) -> Result<()> {
    if args.reps == 0 {
        return Err(usage("--reps must be at least 1"));
    }
    if let Some(path) = &args.json {
        super::output::check_output("--json", path, &[])?;
    }
    if !args.head_dim.is_multiple_of(2) || !(2..=MAX_HEAD_DIM).contains(&args.head_dim) {
        return Err(usage(format!(
            "--head-dim {}: must be even and between 2 and {MAX_HEAD_DIM} (RoPE rotates pairs; \
             the attention kernels hold at most {MAX_HEAD_DIM} values per head)",
            args.head_dim
        )));
    }
    // The matrix-unit kernels only when asked for by name (README, "Kernels on a
    // GPU": a sweep stalled after it on an H100).
    let matrix_units = matches!(args.only.as_deref(), Some(CMMA_KERNEL | MMA_KERNEL));
    if args.mma_tiles && args.only.as_deref() != Some(MMA_KERNEL) {
        return Err(usage(format!(
            "--mma-tiles: only with --only {MMA_KERNEL} (the register kernels' tile pairs)"
        )));
    }
    let cases: Vec<Case> = sweep(
        args.quick,
        args.min_seq,
        args.max_seq,
        args.head_dim,
        matrix_units,
        args.mma_tiles,
    )
    .into_iter()
    .filter(|c| {
        args.only
            .as_deref()
            .is_none_or(|k| k == c.kernel() || k == c.op())
    })
    .collect();
    ensure!(
        !cases.is_empty(),
        "--only {:?} with --min-seq {} --max-seq {}: no shape of the sweep is left (kernels: \
         attention, attention_tiled, attention_cmma_bf16, attention_mma_bf16, swiglu, rms_norm, layer_norm, rope, cross_entropy)",
        args.only.as_deref().unwrap_or("(all)"),
        args.min_seq,
        args.max_seq
    );
    let torch = args
        .torch
        .as_deref()
        .map(TorchAttention::read)
        .transpose()?;
    if let (Some(t), Some(path)) = (&torch, &args.torch) {
        eprintln!(
            "bench: {}: PyTorch's attention ({}) in {}, beside the rows of that type",
            path.display(),
            t.backend,
            t.dtype
        );
    }
    let targets = target::open(args.backends.as_deref())?;
    ensure!(
        !targets.is_empty(),
        "no backend could be opened (compiled: {})",
        target::COMPILED.join(", ")
    );
    let measure = |once: &mut dyn FnMut() -> Result<Sample>| measure(args.warmup, args.reps, once);
    let mut rows = Vec::new();
    // The reference of each (backend, op, shape) measured so far: both
    // attention kernels share one.
    let mut references: HashMap<(&str, &str, String), Measured> = HashMap::new();
    for case in cases {
        let mut cpu_reference_ms = None;
        for target in &targets {
            eprintln!("bench: {} {case} on {}", case.kernel(), target.name());
            let (fused, fused_note) = match (target.has_fused(), target.fused_skip(&case)) {
                (true, None) => (Some(measure(&mut || target.fused(&case))?), None),
                (_, note) => (None, note),
            };
            let key = (target.name(), case.op(), case.to_string());
            let reference_skip = if args.no_reference {
                Some("reference not run (--no-reference)".to_string())
            } else {
                target.reference_skip(&case)
            };
            let (reference, reference_note) = match (reference_skip, references.get(&key)) {
                (Some(reason), _) => (None, Some(reason)),
                (None, Some(&measured)) => (Some(measured), None),
                (None, None) => {
                    let measured = measure(&mut || target.reference(&case))?;
                    references.insert(key, measured);
                    (Some(measured), None)
                }
            };
            let notes: Vec<String> = [case.tiles_note(), fused_note, reference_note]
                .into_iter()
                .flatten()
                .collect();
            let note = (!notes.is_empty()).then(|| notes.join("; "));
            if target.name() == "flex" {
                cpu_reference_ms = reference.map(|r| r.ms);
            }
            let torch_times = torch
                .as_ref()
                .and_then(|t| t.times(&case.to_string(), case.attention_dtype()?));
            rows.push(Row::new(
                &case,
                target.name(),
                fused,
                reference,
                cpu_reference_ms,
                torch_times,
                note,
            ));
        }
    }
    print!("{}", report::table(&rows, args.warmup, args.reps));
    if let Some(path) = &args.json {
        report::write_json(path, &rows, args.warmup, args.reps)?;
    }
    Ok(())
}

/// `warmup` untimed runs, then `reps` runs: median time (and median
/// forward and backward times, where every run timed its forward), largest
/// peak.
fn measure(
    warmup: usize,
    reps: usize,
    once: &mut dyn FnMut() -> Result<Sample>,
) -> Result<Measured> {
    for _ in 0..warmup {
        once()?;
    }
    let samples = (0..reps).map(|_| once()).collect::<Result<Vec<_>>>()?;
    let median = |mut ms: Vec<f64>| {
        ms.sort_by(f64::total_cmp);
        ms[ms.len() / 2]
    };
    let forward: Option<Vec<f64>> = samples
        .iter()
        .map(|s| s.forward.map(|f| f.as_secs_f64() * 1e3))
        .collect();
    let backward: Option<Vec<f64>> = samples
        .iter()
        .map(|s| {
            s.forward
                .map(|f| s.elapsed.saturating_sub(f).as_secs_f64() * 1e3)
        })
        .collect();
    Ok(Measured {
        ms: median(
            samples
                .iter()
                .map(|s| s.elapsed.as_secs_f64() * 1e3)
                .collect(),
        ),
        forward_ms: forward.map(median),
        backward_ms: backward.map(median),
        peak_bytes: samples.iter().map(|s| s.peak_bytes).max().unwrap_or(0),
    })
}
