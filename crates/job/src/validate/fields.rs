//! Checks of single keys and of keys against each other that need no
//! model: sizes, rates and combinations of the file and flags.

use std::time::Duration;

use ferrotron_engine::precision::Precision;
use ferrotron_parallel::recompute::Recompute;
use ferrotron_parallel::zero::ZeroStage;

use super::Problems;
use crate::config::{JobConfig, Offload};

/// Every problem of single values and of the model-free combinations.
pub(super) fn check_fields(c: &JobConfig, p: &mut Problems) {
    let (o, s, par, pr) = (&c.optimizer, &c.schedule, &c.parallelism, &c.precision);
    for (section, key, v) in [
        ("optimizer", "lr", o.lr),
        ("optimizer", "min_lr", o.min_lr),
        ("optimizer", "weight_decay", o.weight_decay),
        ("optimizer", "beta1", o.beta1),
        ("optimizer", "beta2", o.beta2),
        ("optimizer", "eps", o.eps),
        ("optimizer", "grad_clip", o.grad_clip),
        ("data", "val_fraction", c.data.val_fraction),
        ("parallelism", "comm_timeout_s", par.comm_timeout_s),
        ("parallelism", "bucket_mb", par.bucket_mb),
        (
            "metrics",
            "peak_tflops",
            c.metrics.peak_tflops.unwrap_or(1.0),
        ),
        ("precision", "loss_scale_init", pr.loss_scale_init),
    ] {
        if !v.is_finite() {
            p.key(section, key, format!("must be a finite number, got {v}"));
        }
    }
    for (section, key, v) in [
        ("schedule", "steps", s.steps),
        ("schedule", "micro_batch", s.micro_batch),
        ("schedule", "seq_len", s.seq_len),
        ("schedule", "grad_accum", s.grad_accum),
        ("schedule", "eval_every", s.eval_every),
        ("schedule", "eval_batches", s.eval_batches),
        ("parallelism", "dp", par.dp.unwrap_or(1)),
        ("model", "max_seq_len", c.model.max_seq_len.unwrap_or(1)),
        ("parallelism", "tp", par.tp),
        ("parallelism", "cp", par.cp),
        (
            "parallelism",
            "make_vocab_size_divisible_by",
            par.make_vocab_size_divisible_by,
        ),
        ("parallelism", "pp", par.pp),
        ("parallelism", "pp_virtual", par.pp_virtual),
        (
            "checkpoint",
            "keep_checkpoints",
            c.checkpoint.keep_checkpoints,
        ),
        ("optimizer", "max_skipped", o.max_skipped),
        ("data", "goldfish_context", c.data.goldfish_context),
        ("precision", "loss_scale_window", pr.loss_scale_window),
    ] {
        if v == 0 {
            p.key(section, key, "must be positive, got 0");
        }
    }
    for (section, key, v) in [
        ("optimizer", "lr", o.lr),
        ("optimizer", "eps", o.eps),
        ("parallelism", "bucket_mb", par.bucket_mb),
        ("precision", "loss_scale_init", pr.loss_scale_init),
        (
            "metrics",
            "peak_tflops",
            c.metrics.peak_tflops.unwrap_or(1.0),
        ),
    ] {
        if v.is_finite() && v <= 0.0 {
            p.key(section, key, format!("must be positive, got {v}"));
        }
    }
    for (key, v) in [
        ("min_lr", o.min_lr),
        ("weight_decay", o.weight_decay),
        ("grad_clip", o.grad_clip),
    ] {
        if v.is_finite() && v < 0.0 {
            p.key("optimizer", key, format!("must be non-negative, got {v}"));
        }
    }
    for (key, v) in [("beta1", o.beta1), ("beta2", o.beta2)] {
        if v.is_finite() && !(0.0..1.0).contains(&v) {
            p.key("optimizer", key, format!("must be in [0, 1), got {v}"));
        }
    }
    check_combinations(c, p);
}

/// Keys that are valid alone but not together, and the ranges of the rest.
fn check_combinations(c: &JobConfig, p: &mut Problems) {
    let (o, s, par) = (&c.optimizer, &c.schedule, &c.parallelism);
    if let Some(w) = o.warmup_steps.filter(|&w| w > s.steps) {
        p.key(
            "optimizer",
            "warmup_steps",
            format!("{w} exceeds --steps {}", s.steps),
        );
    }
    if o.min_lr.is_finite() && o.lr.is_finite() && o.min_lr > o.lr {
        p.key(
            "optimizer",
            "min_lr",
            format!("{} exceeds --lr {}", o.min_lr, o.lr),
        );
    }
    if c.data.shards.is_some() && c.data.corpus.is_some() {
        p.key(
            "data",
            "shards",
            "with --corpus: train on the shard set or on the text file, not both",
        );
    }
    let v = c.data.val_fraction;
    if v.is_finite() && (!(0.0..1.0).contains(&v) || v == 0.0) {
        p.key(
            "data",
            "val_fraction",
            format!("must be in (0, 1), got {v}"),
        );
    }
    if par.comm_timeout_s.is_finite()
        && !Duration::try_from_secs_f64(par.comm_timeout_s).is_ok_and(|t| !t.is_zero())
    {
        p.key(
            "parallelism",
            "comm_timeout_s",
            format!(
                "must be a positive number of seconds, got {}",
                par.comm_timeout_s
            ),
        );
    }
    if let Some(v) = c.model.vocab_size {
        let min = ferrotron_engine::data::MIN_VOCAB_SIZE;
        if v < min {
            p.key(
                "model",
                "vocab_size",
                format!("must be at least {min} (256 bytes + <|endoftext|>), got {v}"),
            );
        }
    }
    if let Some(k) = c.data.goldfish_k.filter(|&k| k < 2) {
        p.key(
            "data",
            "goldfish_k",
            format!("must be at least 2 (one token in K is dropped from the loss), got {k}"),
        );
    }
    if c.precision.reduce_dtype == Precision::Fp16 {
        p.key("precision", "reduce_dtype", "fp16: gradients are reduced in fp32 or bf16 (fp16's range cannot hold loss-scaled sums)");
    }
    if let Err(problem) = recompute(c) {
        p.key("parallelism", "recompute", problem);
    }
    check_cp(c, p);
    check_prefetch(c, p);
    if c.parallelism.offload == Offload::Optimizer && c.parallelism.zero == ZeroStage::Off {
        p.key(
            "parallelism",
            "offload",
            "optimizer with --zero 0: each rank offloads its ZeRO shard of the optimizer state; use --zero 1, 2 or 3 (as DeepSpeed's offload_optimizer needs ZeRO >= 1)",
        );
    }
    if par.sp && par.tp == 1 {
        p.key(
            "parallelism",
            "sp",
            "needs --tp above 1: sequence parallelism splits the sequence over the TP group",
        );
    }
    if par.sp && par.tp > 1 && !s.seq_len.is_multiple_of(par.tp) {
        p.key(
            "parallelism",
            "sp",
            format!(
                "--seq-len {} must be divisible by --tp {}",
                s.seq_len, par.tp
            ),
        );
    }
}

/// Context parallelism: the sequence must cut into `2 x cp` chunks (and
/// under sequence parallelism each rank's chunks split over tp).
fn check_cp(c: &JobConfig, p: &mut Problems) {
    let (par, seq) = (&c.parallelism, c.schedule.seq_len);
    if par.cp < 2 {
        return;
    }
    if seq > 0 && !seq.is_multiple_of(2 * par.cp) {
        p.key(
            "parallelism",
            "cp",
            format!(
                "{}: --seq-len {seq} must be a multiple of 2 x cp = {} (each sequence is cut into 2 x cp chunks)",
                par.cp,
                2 * par.cp
            ),
        );
    }
    let local = seq / par.cp;
    if par.sp && par.tp > 1 && seq.is_multiple_of(2 * par.cp) && !local.is_multiple_of(par.tp) {
        p.key(
            "parallelism",
            "sp",
            format!(
                "each rank's {local} tokens (--seq-len {seq} / --cp {}) must be divisible by --tp {}",
                par.cp, par.tp
            ),
        );
    }
}

/// `parallelism.zero3_prefetch`, when given, needs ZeRO-3 (the only stage
/// that gathers parameters) and, above 0, the overlap that runs the
/// gathers on the communication thread: Megatron-LM refuses
/// `--overlap-param-gather` without the distributed optimizer and
/// `--overlap-grad-reduce` alike, where DeepSpeed ignores its `stage3_*`
/// keys below stage 3; a key that would do nothing is refused here.
fn check_prefetch(c: &JobConfig, p: &mut Problems) {
    let par = &c.parallelism;
    let Some(n) = par.zero3_prefetch else {
        return;
    };
    if par.zero != ZeroStage::Three {
        p.key(
            "parallelism",
            "zero3_prefetch",
            format!(
                "{n} with --zero {}: only ZeRO-3 gathers parameters; leave it unset or use --zero 3",
                par.zero
            ),
        );
    } else if n > 0 && !par.overlap_grad_reduce {
        p.key(
            "parallelism",
            "zero3_prefetch",
            format!(
                "{n} with --overlap-grad-reduce false: gathers run ahead only on the overlapping communication thread; give 0 or turn the overlap on"
            ),
        );
    }
}

/// What backward recomputes: `parallelism.recompute`, or when unset
/// `none`, and `full` under ZeRO-3 (which frees each block's parameters
/// after its forward, so it always recomputes the block in backward).
/// Refuses `none` and `selective` with ZeRO-3, and `full` with a pipeline
/// (which keeps each micro-batch's graph from its forward to its backward;
/// selective runs there).
pub(crate) fn recompute(c: &JobConfig) -> Result<Recompute, String> {
    let par = &c.parallelism;
    match (par.recompute, par.zero) {
        (Some(r @ (Recompute::None | Recompute::Selective)), ZeroStage::Three) => Err(format!(
            "{r} with --zero 3: ZeRO-3 frees each block's parameters after its forward and recomputes the block in backward, which is --recompute full; leave --recompute unset or give full"
        )),
        (Some(Recompute::Full), _) if par.pp > 1 => Err(format!(
            "full with --pp {}: the pipeline keeps each micro-batch's autodiff graph from its forward to its backward; use --recompute none or selective",
            par.pp
        )),
        (Some(r), _) => Ok(r),
        (None, ZeroStage::Three) => Ok(Recompute::Full),
        (None, _) => Ok(Recompute::None),
    }
}
