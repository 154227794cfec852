//! The memory pre-check: what one rank of the job will hold, by the
//! planner's memory model (`ferrotron_parallel::plan::memory`, the code
//! `ferrotron plan` ranks layouts with), times the ranks on this host,
//! against the host's available memory, before the model is allocated.
//!
//! Per rank it counts the fuller of the first and the last pipeline stage:
//! f32 parameters, gradients and AdamW's two moments (4 + 4 + 8 bytes per
//! parameter the rank holds: its TP slice of its stage's blocks, sharded
//! over DP x CP by the ZeRO stage as the trainer lays them out), the
//! activations of the micro-batches in flight, of this rank's
//! `seq_len / cp` tokens under context parallelism (the planner's activation
//! model: [`ActivationModel::FerrotronCpu`] on the CPU path, Korthikanti et
//! al. elsewhere; f32 elements; the head's gradients in place of the
//! logits where the model runs the chunked head), and the step's buffers (two gradient
//! buckets, or ZeRO-3's gathered units: the embedding and head, and the
//! `--zero3-prefetch N` + 1 blocks gathered at once under overlap). No reserve is added: the check
//! refuses only a run whose counted bytes already exceed what is free. The
//! state rank 0 gathers to write a checkpoint is not counted.

use ferrotron_engine::backend::BackendKind;
use ferrotron_engine::metrics::available_memory_bytes;
use ferrotron_models::ops::{choose_kernels, HeadLoss};
use ferrotron_models::{DecoderConfig, MlpKind, NormKind, Position};
use ferrotron_parallel::mesh::Mesh;
use ferrotron_parallel::pipeline::{ScheduleKind, StageLayout};
use ferrotron_parallel::plan::buffers::Prefetch;
use ferrotron_parallel::plan::{
    memory, ActivationModel, Choice, MemoryEstimate, MemoryInput, ModelShape, Precision,
};
use ferrotron_parallel::recompute::Recompute;
use ferrotron_parallel::tensor::padded_vocab;
use ferrotron_parallel::zero::{ZeroStage, DEFAULT_ZERO3_PREFETCH};

use crate::config::{JobConfig, Offload, PpSchedule};

/// GiB, for messages.
fn gib(bytes: f64) -> f64 {
    bytes / (1u64 << 30) as f64
}

/// The planner's view of a decoder configuration.
pub fn shape_of(c: &DecoderConfig) -> ModelShape {
    ModelShape {
        vocab: c.vocab_size,
        hidden: c.hidden_size,
        layers: c.n_layers,
        heads: c.n_heads,
        kv_heads: c.n_kv_heads,
        ffn: c.ffn_size,
        learned_positions: (c.position == Position::Learned).then_some(c.max_seq_len),
        layer_norm: c.norm == NormKind::LayerNorm,
        bias: c.bias,
        gated_mlp: c.mlp == MlpKind::Swiglu,
        tied_head: c.tied_head,
        embed_norm: c.embed_norm,
    }
}

/// Bytes one rank of job `c` on `mesh` (training `model` with `recompute`
/// on backend `kind`) holds, by the planner's memory model; `None` when
/// the pipeline split cannot be built (validation reports that).
pub fn job_memory(
    model: &DecoderConfig,
    c: &JobConfig,
    mesh: &Mesh,
    recompute: Recompute,
    kind: BackendKind,
) -> Option<MemoryEstimate> {
    let par = &c.parallelism;
    let schedule = ScheduleKind::from(par.pp_schedule);
    let interleaved = schedule == ScheduleKind::Interleaved;
    let layout = StageLayout::new(
        model.n_layers,
        mesh.pp,
        par.pp_virtual,
        par.pp_layers.as_deref(),
        interleaved,
    )
    .ok()?;
    let mut shape = shape_of(model);
    shape.vocab = padded_vocab(shape.vocab, mesh.tp, par.make_vocab_size_divisible_by);
    let cpu_path = kind.is_cpu() && c.backend.kernels.is_none();
    let without_kernels = kind.is_cpu().then(|| kind.name());
    // The head the model will run (a refused kernel choice is reported by
    // validation; it is counted here as the whole logits).
    let chunked_head = choose_kernels(model, without_kernels)
        .is_ok_and(|k| HeadLoss::choose(model, k, !kind.is_cpu()) == HeadLoss::Chunked);
    let input = MemoryInput {
        model: shape,
        global_batch: mesh.dp * c.schedule.micro_batch * c.schedule.grad_accum,
        seq: c.schedule.seq_len,
        // The trainer keeps f32 parameters, gradients and AdamW state at
        // every compute precision; activations are counted as f32 too.
        precision: Precision::Fp32,
        bucket_mb: par.bucket_mb,
        dropout: false,
        fp32_main_grads: false,
        activations: if cpu_path {
            ActivationModel::FerrotronCpu
        } else {
            ActivationModel::Korthikanti
        },
        chunked_head,
        reserve_bytes: 0.0,
        prefetch: Prefetch {
            overlap: par.overlap_grad_reduce,
            depth: par.zero3_prefetch.unwrap_or(DEFAULT_ZERO3_PREFETCH),
        },
        gpipe: schedule == ScheduleKind::GPipe,
    };
    let choice = Choice {
        dp: mesh.dp,
        tp: mesh.tp,
        cp: mesh.cp,
        pp: mesh.pp,
        sp: par.sp,
        zero: par.zero,
        micro_batch: c.schedule.micro_batch,
        recompute,
        interleave: par.pp_virtual,
        offload: par.offload == Offload::Optimizer,
    };
    Some(memory(&input, &choice, &layout))
}

/// The ways to make job `c` (with `recompute`) need less memory per rank,
/// for the refusal.
fn remedies(c: &JobConfig, recompute: Recompute) -> String {
    let par = &c.parallelism;
    let mut ways = vec![format!(
        "raise --tp (now {}), --cp (now {}) or --pp (now {}) over more ranks",
        par.tp, par.cp, par.pp
    )];
    // ZeRO-3 cannot run on pipeline stages.
    let top = if par.pp > 1 {
        ZeroStage::Two
    } else {
        ZeroStage::Three
    };
    if u8::from(par.zero) < u8::from(top) {
        ways.push(format!(
            "raise --zero (now {}, up to {top}) over more data-parallel ranks",
            par.zero
        ));
    }
    let gpipe = par.pp > 1 && par.pp_schedule == PpSchedule::Gpipe;
    if gpipe {
        // GPipe holds every micro-batch: more of them hold more.
        ways.push("--pp-schedule 1f1b (it holds at most --pp micro-batches)".into());
    } else if c.schedule.micro_batch > 1 {
        ways.push(format!(
            "lower --micro-batch (now {}) and raise --grad-accum",
            c.schedule.micro_batch
        ));
    }
    if recompute != Recompute::Full && par.pp == 1 {
        ways.push("--recompute full".into());
    }
    ways.push("run fewer ranks on this host".into());
    ways.join(", ")
}

/// The pre-check: refuses job `c` when `ranks_on_host` ranks of `need`
/// bytes each exceed this host's available memory (`MemAvailable`) on a
/// CPU backend, with the estimate and how to make it fit. On GPU backends
/// the device's capacity is not known before it is used: `Ok(Some(note))`
/// gives the estimate and says the check was not done, as it does when no
/// `MemAvailable` is readable.
pub fn check_memory(
    need: &MemoryEstimate,
    ranks_on_host: usize,
    c: &JobConfig,
    recompute: Recompute,
    kind: BackendKind,
) -> Result<Option<String>, String> {
    let per_rank = need.total();
    let per_host = per_rank * ranks_on_host as f64;
    let s = &need.state;
    let breakdown = format!(
        "parameters {:.2} + gradients {:.2} + AdamW state {:.2} + activations {:.2} + step buffers {:.2} GiB",
        gib(s.param_bytes as f64),
        gib(s.grad_bytes as f64),
        gib(s.optimizer_bytes as f64),
        gib(need.activations.total()),
        gib(need.transient)
    );
    if !kind.is_cpu() {
        return Ok(Some(format!(
            "memory pre-check: not done on {kind} (the device's memory is not known before it is used); estimate {:.2} GiB per rank ({breakdown})",
            gib(per_rank)
        )));
    }
    let Some(have) = available_memory_bytes() else {
        return Ok(Some(
            "memory pre-check: not done (no MemAvailable in /proc/meminfo)".into(),
        ));
    };
    if per_host <= have as f64 {
        return Ok(None);
    }
    let stage = match need.stage {
        "only" => String::new(),
        stage => format!(", on the {stage} pipeline stage"),
    };
    Err(format!(
        "the job needs about {:.2} GiB per rank ({breakdown}{stage}) and {:.2} GiB for the {ranks_on_host} rank(s) on this host, more than its {:.2} GiB of available memory (MemAvailable); to fit: {}; or skip this check with --no-memory-check",
        gib(per_rank),
        gib(per_host),
        gib(have as f64),
        remedies(c, recompute)
    ))
}
