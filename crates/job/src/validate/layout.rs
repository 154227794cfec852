//! Checks of the backend, the mesh and the layout against the model:
//! precision, tensor and pipeline parallelism, kernels, memory.

use ferrotron_engine::backend::{BackendKind, ALL_BACKENDS};
use ferrotron_engine::metrics::{self, DeviceSpec};
use ferrotron_engine::precision::Precision;
use ferrotron_models::ops::choose_kernels;
use ferrotron_models::tensor_parallel::check_tp;
use ferrotron_models::{DecoderConfig, Kernels, MatrixUnits};
use ferrotron_parallel::comm::nccl::LIBRARY_ENV;
use ferrotron_parallel::launch::ranks_on_node;
use ferrotron_parallel::mesh::Mesh;
use ferrotron_parallel::pipeline::{stage_actions, PipeShape, ScheduleKind, StageLayout};
use ferrotron_parallel::recompute::Recompute;
use ferrotron_parallel::zero::ZeroStage;

use super::{Here, Problems, World};
use crate::backend::check_ready;
use crate::comm::{self, Transport};
use crate::config::{AttentionKernelChoice, JobConfig, Offload};
use crate::memory::{check_memory, job_memory};

/// The backend `backend.name` names, if compiled in and able to start
/// here, and the transport of the collectives of a job on `world`.
pub(super) fn backend(
    c: &JobConfig,
    world: &World,
    here: Here,
    p: &mut Problems,
) -> Option<(BackendKind, Transport)> {
    let name = &c.backend.name;
    if here == Here::No {
        // Any backend name, compiled into this build or not.
        let kind = ALL_BACKENDS.into_iter().find(|k| k.name() == name);
        if kind.is_none() {
            let names: Vec<&str> = ALL_BACKENDS.iter().map(|k| k.name()).collect();
            p.key(
                "backend",
                "name",
                format!("unknown backend '{name}'; known: {}", names.join(", ")),
            );
        }
        return kind.map(|k| (k, Transport::Mpi));
    }
    let kind = match name.parse::<BackendKind>() {
        Ok(kind) => kind,
        Err(e) => {
            p.key("backend", "name", format!("{name}: {e}"));
            return None;
        }
    };
    if let Err(e) = check_ready(kind) {
        p.key("backend", "name", format!("{name}: {e}"));
        return None;
    }
    let library = std::env::var_os(LIBRARY_ENV);
    let par = &c.parallelism;
    // Under CP only the fused attention computes the ring's blocks on the
    // device (`comm::resolve`).
    let ring_on_device = par.cp == 1 || c.backend.kernels != Some(Kernels::Reference);
    let device_layout = world.world_size > 1 && ring_on_device;
    match comm::resolve(par.comm, kind, library.as_deref(), device_layout) {
        Ok(t) => Some((kind, t)),
        Err(e) => {
            p.key("parallelism", "comm", e);
            None
        }
    }
}

/// The mesh of `parallelism.{dp,tp,cp,pp}` over `world`.
pub(super) fn mesh(c: &JobConfig, world: &World, p: &mut Problems) -> Option<Mesh> {
    let par = &c.parallelism;
    if par.tp == 0 || par.cp == 0 || par.pp == 0 || par.dp == Some(0) {
        return None; // reported by the field checks
    }
    match Mesh::with_cp(par.dp, par.tp, par.cp, par.pp, world.world_size) {
        Ok(m) => Some(m),
        Err(e) => {
            let degrees = if par.cp == 1 {
                "dp x tp x pp"
            } else {
                "dp x cp x tp x pp"
            };
            p.other(
                format!("parallelism ({degrees} over {} ranks)", world.world_size),
                e.to_string(),
            );
            None
        }
    }
}

/// The data sheet MFU's peak comes from: `metrics.device_type` when
/// `metrics.peak_tflops` is unset (`None`: no sheet, or an unknown name).
pub(super) fn device_sheet(c: &JobConfig, p: &mut Problems) -> Option<DeviceSpec> {
    if c.metrics.peak_tflops.is_some() {
        return None;
    }
    let name = c.metrics.device_type.as_ref()?;
    let sheet = metrics::device_spec(name).filter(|d| d.bf16_flops > 0.0);
    if sheet.is_none() {
        let known: Vec<&str> = metrics::DEVICES
            .iter()
            .filter(|d| d.bf16_flops > 0.0)
            .map(|d| d.name)
            .collect();
        p.key(
            "metrics",
            "device_type",
            format!(
                "unknown device '{name}'; known: {} (plan --gpu's names; give one with --device-type, which --resume also takes, or give --peak-tflops)",
                known.join(", ")
            ),
        );
    }
    sheet
}

/// The peak FLOP/s used for MFU: `metrics.peak_tflops`, else the data
/// sheet's peak for the run's `precision`, else (None) measured.
pub(super) fn peak(c: &JobConfig, sheet: Option<DeviceSpec>, precision: Precision) -> Option<f64> {
    match c.metrics.peak_tflops {
        Some(t) => Some(t * 1e12),
        None => sheet.map(|d| d.peak_flops(precision)),
    }
}

/// The compute precision of a run with `precision.compute` unset: the
/// backend's default, with its one-line notice (if any) in `notes`.
fn unset_precision(kind: BackendKind, notes: &mut Vec<String>) -> Precision {
    let (precision, notice) = kind.default_precision();
    notes.extend(notice.map(|n| format!("{n} ({kind})")));
    precision
}

/// Resolves the model's precision and kernels into `model` and checks the
/// layout against it; `notes` gets the warnings of a layout that runs but
/// wastes time.
pub(super) fn check_with_model(
    c: &JobConfig,
    kind: BackendKind,
    mesh: &Mesh,
    model: &mut DecoderConfig,
    p: &mut Problems,
    notes: &mut Vec<String>,
) {
    model.kernels = c.backend.kernels;
    model.precision = c
        .precision
        .compute
        .unwrap_or_else(|| unset_precision(kind, notes));
    if let Err(e) = check_tp(model, mesh.tp) {
        p.key(
            "parallelism",
            "tp",
            format!("{}: {} {}", mesh.tp, e.field, e.problem),
        );
    }
    check_pipeline(c, model, mesh, p, notes);
    if c.parallelism.offload == Offload::Optimizer && kind.is_cpu() {
        p.key(
            "parallelism",
            "offload",
            format!("optimizer on {kind}: its device memory is host memory, so offloading saves nothing; use it on cuda, rocm or wgpu"),
        );
    }
    match choose_kernels(model, kind.is_cpu().then(|| kind.name())) {
        Err(e) => p.key("backend", "kernels", e.problem),
        Ok(kernels) => attention_kernel(c, kind, kernels, model, p),
    }
    if c.schedule.seq_len > model.max_seq_len {
        p.key(
            "schedule",
            "seq_len",
            format!(
            "{} exceeds the model's max_seq_len {} (a new model from a preset takes --max-seq-len)",
            c.schedule.seq_len, model.max_seq_len
        ),
        );
    }
}

/// `backend.attention_kernel` into `model`: matrix units need the fused
/// attention.
fn attention_kernel(
    c: &JobConfig,
    kind: BackendKind,
    kernels: Kernels,
    model: &mut DecoderConfig,
    p: &mut Problems,
) {
    let (units, name) = match c.backend.attention_kernel {
        AttentionKernelChoice::Auto => return,
        AttentionKernelChoice::MatrixUnits => (MatrixUnits::Fragments, "matrix-units"),
        AttentionKernelChoice::Registers => (MatrixUnits::Registers, "registers"),
    };
    model.attention_matrix_units = units;
    if kernels != Kernels::Fused {
        p.key(
            "backend",
            "attention_kernel",
            format!("{name} on {kind} without fused kernels: only the fused attention (backend.kernels = fused, on cuda, rocm or wgpu) runs on matrix units"),
        );
    }
}

/// The memory pre-check ([`check_memory`]) of `model` on `mesh` with
/// `recompute`, for the ranks of `world` on this host: a note, or the
/// problem; `Ok(None)` under `parallelism.memory_check = false`
/// (`--no-memory-check`).
pub(super) fn memory(
    c: &JobConfig,
    kind: BackendKind,
    mesh: &Mesh,
    model: &DecoderConfig,
    recompute: Recompute,
    world: &World,
) -> Result<Option<String>, String> {
    if !c.parallelism.memory_check {
        return Ok(None);
    }
    // None: the pipeline split is refused by check_pipeline.
    match job_memory(model, c, mesh, recompute, kind) {
        Some(need) => check_memory(&need, ranks_on_node(world.launcher), c, recompute, kind),
        None => Ok(None),
    }
}

/// Refuses a pipeline that cannot run `model`, and notes a schedule that
/// runs but wastes most of the step (1F1B with fewer micro-batches than
/// stages).
fn check_pipeline(
    c: &JobConfig,
    model: &DecoderConfig,
    mesh: &Mesh,
    p: &mut Problems,
    notes: &mut Vec<String>,
) {
    let par = &c.parallelism;
    let kind = ScheduleKind::from(par.pp_schedule);
    if mesh.pp == 1 {
        if par.pp_virtual != 1 || par.pp_layers.is_some() {
            p.key(
                "parallelism",
                "pp_virtual",
                "and --pp-layers need --pp above 1 (they split the model into pipeline stages)",
            );
        }
        return;
    }
    if par.zero == ZeroStage::Three {
        p.key("parallelism", "zero", format!(
            "3 with --pp {}: ZeRO-3 shards whole-model units and cannot run on pipeline stages; use --zero 1 or 2",
            mesh.pp
        ));
    }
    let grad_accum = c.schedule.grad_accum;
    let shape = PipeShape {
        stages: mesh.pp,
        micro_batches: grad_accum,
        chunks: par.pp_virtual,
    };
    if let Err(e) = stage_actions(kind, shape, 0) {
        p.other("parallelism.pp_schedule", format!("--pp-schedule: {e}"));
        return;
    }
    let interleaved = kind == ScheduleKind::Interleaved;
    if let Err(e) = StageLayout::new(
        model.n_layers,
        mesh.pp,
        par.pp_virtual,
        par.pp_layers.as_deref(),
        interleaved,
    ) {
        // The layout's errors name their flags.
        p.other("parallelism.pp_layers", e.to_string());
    }
    if kind == ScheduleKind::OneFOneB && grad_accum < mesh.pp {
        notes.push(format!(
            "warning: --grad-accum {grad_accum} < --pp {}: 1F1B runs, but most of each step is pipeline bubble ((pp-1)/m = {:.0}%); use --grad-accum {} or more",
            mesh.pp,
            100.0 * (mesh.pp - 1) as f64 / grad_accum as f64,
            mesh.pp
        ));
    }
}
