//! `ferrotron bench comm`: one rank's collectives on device buffers
//! (`comm::nccl::device`: NCCL on CUDA, RCCL on ROCm, a library on host
//! memory such as the test double on flex) against the host copy path the
//! trainer takes today (device to host, the collective on host `f32`,
//! host to device), on the same random values.
//!
//! Per operation (all-reduce and reduce-scatter in f32 and with bf16 on
//! the wire, all-gather in f32, and a grouped send and receive of two
//! messages to itself in f32 and bf16, the pipeline's exchange) it checks that both paths give the same
//! values bit for bit, and times each: `--warmup` untimed runs, then the
//! median of `--reps`, each ended by a device sync. One rank: NCCL copies
//! on the device, so the times compare the device path's overhead (binding
//! the device, waiting on it and on Ferrotron's stream) with the two
//! copies across PCIe it saves. A difference fails the command (exit 1).

mod measure;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use ferrotron_engine::backend::BackendKind;
use ferrotron_engine::checkpoint::write_atomic;
use ferrotron_parallel::comm::nccl::NcclLibrary;
use serde::Serialize;

use self::measure::Row;
use crate::error::usage;

/// `ferrotron bench comm` flags.
#[derive(Args, Debug)]
pub struct CommBenchArgs {
    /// The backend whose device buffers the collectives run on: cuda, rocm (with those
    /// cargo features) or flex (host memory; needs the `mpi` feature and
    /// FERROTRON_NCCL_LIBRARY naming a library on host memory, such as the test double).
    /// Default: cuda, else rocm, else flex, whichever is compiled in.
    #[arg(long)]
    pub backend: Option<String>,
    /// f32 values per collective (an all-gather returns as many per rank).
    #[arg(long, default_value_t = 1 << 24)]
    pub elems: usize,
    /// Untimed runs of each path before the timed ones.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Timed runs of each path; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Also write the rows as JSON to FILE (atomically).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// What `--json` writes.
#[derive(Serialize)]
struct Report {
    what: &'static str,
    backend: String,
    library: String,
    elems: usize,
    reps: usize,
    rows: Vec<Row>,
}

/// The backend `--backend` names, or the default.
fn backend(a: &CommBenchArgs) -> anyhow::Result<BackendKind> {
    let kind = match &a.backend {
        Some(name) => name.parse().map_err(|e| usage(format!("--backend: {e}")))?,
        None => [BackendKind::Cuda, BackendKind::Rocm]
            .into_iter()
            .find(|k| k.is_compiled())
            .unwrap_or(BackendKind::Flex),
    };
    if !matches!(
        kind,
        BackendKind::Cuda | BackendKind::Rocm | BackendKind::Flex
    ) {
        return Err(usage(format!(
            "--backend {kind}: bench comm runs on cuda, rocm or flex (host memory)"
        )));
    }
    Ok(kind)
}

/// Runs `bench comm`.
pub fn run(a: CommBenchArgs) -> anyhow::Result<()> {
    if a.elems == 0 || a.reps == 0 {
        return Err(usage("bench comm: --elems and --reps must be at least 1"));
    }
    if let Some(path) = &a.json {
        super::output::check_output("--json", path, &[])?;
    }
    let kind = backend(&a)?;
    kind.check_runtime()?;
    let lib = Arc::new(NcclLibrary::load().context("bench comm: loading NCCL / RCCL")?);
    let library = lib.path().to_string();
    let rows = measure::on_backend(kind, lib, &a)?;
    println!(
        "bench comm on {kind} ({library}), {} values, median of {}:",
        a.elems, a.reps
    );
    println!(
        "  {:<16} {:<6} {:>12} {:>12} {:>12}  equal",
        "op", "wire", "wire MiB", "device s", "host copy s"
    );
    for r in &rows {
        println!(
            "  {:<16} {:<6} {:>12.2} {:>12.6} {:>12.6}  {}",
            r.op,
            r.wire,
            r.wire_bytes as f64 / (1 << 20) as f64,
            r.device_s,
            r.host_copy_s,
            r.equal
        );
    }
    let unequal: Vec<String> = rows
        .iter()
        .filter(|r| !r.equal)
        .map(|r| format!("{} ({})", r.op, r.wire))
        .collect();
    if let Some(path) = &a.json {
        let report = Report {
            what: "ferrotron bench comm: one rank's collectives on device buffers against the host copy path",
            backend: kind.to_string(),
            library,
            elems: a.elems,
            reps: a.reps,
            rows,
        };
        write_atomic(path, serde_json::to_string_pretty(&report)?.as_bytes())?;
    }
    anyhow::ensure!(
        unequal.is_empty(),
        "bench comm: the device path differs from the host path in {}",
        unequal.join(", ")
    );
    Ok(())
}
