//! `ferrotron plan --emit-config FILE`: the best layout `train` runs today,
//! written as a job file (`train --config FILE`).

use std::path::Path;

use ferrotron_engine::checkpoint::write_atomic;
use ferrotron_job::error::usage_lines;
use ferrotron_job::JobConfig;
use ferrotron_parallel::plan::{Estimate, PlanInput};
use ferrotron_parallel::zero::{ZeroStage, DEFAULT_ZERO3_PREFETCH};

use crate::args::PlanArgs;
use crate::error::usage;

/// Writes the first of `ranked` (best first) that `train` runs today as a
/// job file at `path`; refuses a model the file cannot name (shape flags)
/// and writes nothing when no layout runs today.
pub fn emit_config(
    a: &PlanArgs,
    input: &PlanInput,
    ranked: &[Estimate],
    path: &Path,
) -> anyhow::Result<String> {
    let shape_flags = [a.hidden, a.layers, a.heads, a.kv_heads, a.ffn, a.vocab];
    if shape_flags.iter().any(Option::is_some) {
        return Err(usage(
            "--emit-config: a job file names its model by preset or --hf-dir; the shape flags (--hidden, --layers, --heads, --kv-heads, --ffn, --vocab) cannot be written to it",
        ));
    }
    let Some((rank, best)) = ranked.iter().enumerate().find(|(_, e)| e.runs_today) else {
        return Err(usage(
            "--emit-config: no layout that fits is one `ferrotron train` runs as planned today (the `today` column: fp32, ZeRO-3 with full recomputation, no full recomputation on a pipeline; try --precision fp32); nothing written",
        ));
    };
    let c = &best.choice;
    let mut job = JobConfig::default();
    job.model.name = a.model.clone().unwrap_or_else(|| job.model.name.clone());
    job.model.hf_dir = a.hf_dir.clone();
    job.schedule.seq_len = input.seq;
    job.schedule.micro_batch = c.micro_batch;
    job.schedule.grad_accum = input.global_batch / (c.dp * c.micro_batch);
    let par = &mut job.parallelism;
    (par.dp, par.tp, par.pp, par.sp, par.zero) = (Some(c.dp), c.tp, c.pp, c.sp, c.zero);
    par.cp = c.cp;
    par.recompute = Some(c.recompute);
    if c.offload {
        par.offload = ferrotron_job::config::Offload::Optimizer;
    }
    // The overlap and prefetch the step was priced with.
    par.overlap_grad_reduce = input.overlap_grad_reduce;
    if c.zero == ZeroStage::Three
        && input.overlap_grad_reduce
        && input.zero3_prefetch != DEFAULT_ZERO3_PREFETCH
    {
        par.zero3_prefetch = Some(input.zero3_prefetch);
    }
    if c.interleave > 1 {
        par.pp_schedule = ferrotron_job::config::PpSchedule::Interleaved;
        par.pp_virtual = c.interleave;
    } else if c.pp > 1 {
        par.pp_layers = Some(best.stage_layers.clone());
    }
    job.precision.compute = Some(input.precision.into());
    job.backend.name = backend_for(&a.gpu).into();
    job.metrics.peak_tflops = Some(input.peak_flops() / 1e12);
    job.checkpoint.out = Some(format!("runs/{}-{}", job.model.name, best.label).into());
    job.check_portable(input.gpus)
        .map_err(|e| usage_lines(&e))?;
    let text = format!(
        "# ferrotron plan: rank {} of the planner's table ({}), the best layout `ferrotron train` runs today;\n# {:.3} s/step and {:.1} GiB per GPU estimated on {} x {}.\n{}",
        rank + 1,
        best.label,
        best.time.step_s,
        best.memory.total() / (1u64 << 30) as f64,
        input.gpus,
        input.device.name,
        job.to_toml()
    );
    write_atomic(path, text.as_bytes())?;
    Ok(best.label.clone())
}

/// The backend of a GPU type of the planner's table.
fn backend_for(gpu: &str) -> &'static str {
    match gpu {
        "cpu" => "flex",
        g if g.starts_with("mi") => "rocm",
        _ => "cuda",
    }
}
