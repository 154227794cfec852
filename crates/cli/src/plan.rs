//! `ferrotron plan`: ranks the parallel layouts of a model on a GPU count
//! and type (the model is `ferrotron_parallel::plan`'s; this file parses,
//! builds the input and prints).

use ferrotron_engine::metrics::{device_spec, DEVICES};
use ferrotron_job::memory::shape_of;
use ferrotron_models::hf::from_hf_config;
use ferrotron_models::presets::{preset, PRESET_NAMES};
use ferrotron_parallel::plan::explain::explain;
use ferrotron_parallel::plan::link::{default_links, link, LINKS};
use ferrotron_parallel::plan::search::choices;
use ferrotron_parallel::plan::{
    estimate, plan, ActivationModel, Choice, Link, ModelShape, PlanInput, Precision, Recompute,
};
use ferrotron_parallel::zero::ZeroStage;

use crate::args::PlanArgs;
use crate::error::usage;
use crate::plan_emit::emit_config;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The model of `--model`, `--hf-dir` or the shape flags (which also
/// override a preset's or a config's fields).
fn model(a: &PlanArgs) -> anyhow::Result<(String, ModelShape)> {
    let (name, mut c) = match (&a.model, &a.hf_dir) {
        (Some(_), Some(_)) => return Err(usage("give --model or --hf-dir, not both")),
        (Some(m), None) => (
            m.clone(),
            preset(m).ok_or_else(|| {
                usage(format!(
                    "--model: unknown preset '{m}' (known: {})",
                    PRESET_NAMES.join(", ")
                ))
            })?,
        ),
        (None, Some(dir)) => {
            let (_, c) = from_hf_config(&dir.join("config.json"))
                .map_err(|e| usage(format!("--hf-dir: {e}")))?;
            (dir.display().to_string(), c)
        }
        (None, None) => {
            let missing: Vec<&str> = [
                ("--hidden", a.hidden),
                ("--layers", a.layers),
                ("--heads", a.heads),
                ("--ffn", a.ffn),
                ("--vocab", a.vocab),
            ]
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(|(n, _)| *n)
            .collect();
            if !missing.is_empty() {
                return Err(usage(format!(
                    "give --model, --hf-dir or the shape flags; missing {}",
                    missing.join(", ")
                )));
            }
            // A Llama-style shape; the flags below fill it in.
            let mut c = preset("llama3-8b").expect("the preset exists");
            c.n_kv_heads = a.heads.expect("checked above");
            ("custom".to_string(), c)
        }
    };
    let set = |field: &mut usize, v: Option<usize>| {
        if let Some(v) = v {
            *field = v;
        }
    };
    // Multi-head presets stay multi-head when --heads changes.
    if c.n_kv_heads == c.n_heads && a.kv_heads.is_none() {
        set(&mut c.n_kv_heads, a.heads);
    }
    set(&mut c.hidden_size, a.hidden);
    set(&mut c.n_layers, a.layers);
    set(&mut c.n_heads, a.heads);
    set(&mut c.n_kv_heads, a.kv_heads);
    set(&mut c.ffn_size, a.ffn);
    set(&mut c.vocab_size, a.vocab);
    c.validate()
        .map_err(|e| usage(format!("model shape: {e}")))?;
    Ok((name, shape_of(&c)))
}

/// Whether `x` is a number above zero (NaN is not).
fn positive(x: f64) -> bool {
    x > 0.0
}

/// A link from the table, with `--*-gbps` / `--*-us` overrides.
fn pick_link(
    flag: &str,
    name: Option<&String>,
    default: Option<Link>,
    gbps: Option<f64>,
    us: Option<f64>,
) -> anyhow::Result<Link> {
    let known = || LINKS.iter().map(|l| l.name).collect::<Vec<_>>().join(", ");
    let mut l = match name {
        Some(n) => link(n)
            .ok_or_else(|| usage(format!("--{flag}: unknown link '{n}' (known: {})", known())))?,
        None => match (default, gbps, us) {
            (Some(l), _, _) => l,
            (None, Some(_), Some(_)) => Link {
                name: "custom",
                bandwidth: 0.0,
                latency: 0.0,
            },
            _ => {
                return Err(usage(format!(
                    "--{flag}: this GPU type has no default link; give --{flag} (one of {}) or --{flag}-gbps and --{flag}-us",
                    known()
                )))
            }
        },
    };
    if let Some(g) = gbps {
        if !positive(g) {
            return Err(usage(format!("--{flag}-gbps must be positive, got {g}")));
        }
        l.bandwidth = g * 1e9;
    }
    if let Some(u) = us {
        if !(positive(u) || u == 0.0) {
            return Err(usage(format!("--{flag}-us must not be negative, got {u}")));
        }
        l.latency = u * 1e-6;
    }
    Ok(l)
}

/// The planner's input from the flags.
pub fn input(a: &PlanArgs) -> anyhow::Result<(String, PlanInput)> {
    let (name, shape) = model(a)?;
    let mut device = device_spec(&a.gpu).ok_or_else(|| {
        let known: Vec<&str> = DEVICES.iter().map(|d| d.name).collect();
        usage(format!(
            "--gpu: unknown GPU '{}' (known: {})",
            a.gpu,
            known.join(", ")
        ))
    })?;
    let precision: Precision = match &a.precision {
        Some(p) => p.parse().map_err(|e| usage(format!("--precision: {e}")))?,
        None if device.name == "cpu" => Precision::Fp32,
        None => Precision::Bf16,
    };
    if let Some(g) = a.gpu_mem_gib {
        device.memory_bytes = g * GIB;
    }
    if let Some(t) = a.peak_tflops {
        match precision {
            Precision::Fp32 => device.fp32_flops = t * 1e12,
            _ => device.bf16_flops = t * 1e12,
        }
    }
    if let Some(w) = a.tdp_w {
        device.tdp_w = w;
    }
    let peak = match precision {
        Precision::Fp32 => device.fp32_flops,
        _ => device.bf16_flops,
    };
    if !(device.memory_bytes > 0.0 && peak > 0.0) {
        return Err(usage(format!(
            "--gpu {}: the table has no memory or peak for it; give --gpu-mem-gib and --peak-tflops (positive)",
            device.name
        )));
    }
    let defaults = default_links(device.name);
    let intra = pick_link(
        "intra",
        a.intra.as_ref(),
        defaults.map(|d| d.0),
        a.intra_gbps,
        a.intra_us,
    )?;
    let inter = pick_link(
        "inter",
        a.inter.as_ref(),
        defaults.map(|d| d.1),
        a.inter_gbps,
        a.inter_us,
    )?;
    for (flag, v) in [
        ("--gpus", a.gpus),
        ("--gpus-per-node", a.gpus_per_node),
        ("--global-batch", a.global_batch),
        ("--seq-len", a.seq_len),
        ("--max-micro-batch", a.max_micro_batch),
    ] {
        if v == 0 {
            return Err(usage(format!("{flag} must be positive")));
        }
    }
    if !(a.efficiency > 0.0 && a.efficiency <= 1.0) {
        return Err(usage(format!(
            "--efficiency must be in (0, 1], got {}",
            a.efficiency
        )));
    }
    if !(positive(a.reserve_gib) || a.reserve_gib == 0.0) || !positive(a.bucket_mb) {
        return Err(usage(
            "--reserve-gib must not be negative and --bucket-mb must be positive",
        ));
    }
    let activations: ActivationModel = a
        .activations
        .parse()
        .map_err(|e| usage(format!("--activations: {e}")))?;
    let zero_stages = a
        .zero
        .split(',')
        .map(|z| {
            z.trim()
                .parse::<u8>()
                .ok()
                .and_then(|n| ZeroStage::try_from(n).ok())
                .ok_or_else(|| usage(format!("--zero: '{z}' is not a ZeRO stage 0, 1, 2 or 3")))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let recompute = a
        .recompute
        .split(',')
        .map(|r| {
            r.trim()
                .parse::<Recompute>()
                .map_err(|e| usage(format!("--recompute: {e}")))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok((
        name,
        PlanInput {
            model: shape,
            gpus: a.gpus,
            gpus_per_node: a.gpus_per_node,
            device,
            intra,
            inter,
            global_batch: a.global_batch,
            seq: a.seq_len,
            precision,
            efficiency: a.efficiency,
            reserve_bytes: a.reserve_gib * GIB,
            bucket_mb: a.bucket_mb,
            dropout: a.dropout,
            fp32_main_grads: a.fp32_main_grads,
            max_micro_batch: a.max_micro_batch,
            zero_stages,
            recompute,
            sequence_parallel: !a.no_sp,
            context_parallel: !a.no_cp,
            activations,
            // Ferrotron's trainer: chunked with the fused kernels, and on
            // the CPU path in f32 (`ferrotron_models::ops::HeadLoss::choose`).
            chunked_head: activations == ActivationModel::Korthikanti
                || precision == Precision::Fp32,
            overlap_grad_reduce: a.overlap_grad_reduce.unwrap_or(true),
            zero3_prefetch: a.zero3_prefetch,
        },
    ))
}

/// Runs `ferrotron plan`.
pub fn run(a: PlanArgs) -> anyhow::Result<()> {
    let (name, input) = input(&a)?;
    if let Some(label) = &a.explain {
        let c: Choice = label
            .parse()
            .map_err(|e| usage(format!("--explain: {e}")))?;
        if !choices(&input).contains(&c) {
            return Err(usage(format!(
                "--explain: {label} is not a layout the planner tries here (dp x cp x tp x pp must be {}, tp must divide the heads, dp the global batch {}, the micro-batch each DP rank's share, 2 x cp the sequence; ZeRO 1-3 need dp x cp above 1, ZeRO-3 no pipeline)",
                input.gpus, input.global_batch
            )));
        }
        let e = estimate(&input, &c);
        if a.json {
            println!("{}", serde_json::to_string_pretty(&e)?);
        } else {
            println!("{}", explain(&input, &e));
            let need = e.memory.total();
            if need > input.device.memory_bytes {
                println!(
                    "does not fit: needs {:.1} GiB > {:.1} GiB",
                    need / GIB,
                    input.device.memory_bytes / GIB
                );
            }
        }
        return Ok(());
    }
    let mut p = plan(&input);
    if let Some(path) = &a.emit_config {
        let label = emit_config(&a, &input, &p.feasible, path)?;
        println!("wrote {} ({label})", path.display());
    }
    if a.runnable {
        p.feasible.retain(|e| e.runs_today);
        p.rejected.retain(|r| r.estimate.runs_today);
    }
    let tried = p.feasible.len() + p.rejected.len();
    p.feasible.truncate(a.top);
    p.rejected.truncate(a.rejected);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&p)?);
        return Ok(());
    }
    println!(
        "{name}: {:.2} B parameters, {} layers, hidden {}, {} heads ({} kv); {} x {} ({} per node; {} within, {} between nodes); global batch {} x {} tokens, {}",
        input.model.num_params() as f64 / 1e9,
        input.model.layers,
        input.model.hidden,
        input.model.heads,
        input.model.kv_heads,
        input.gpus,
        input.device.name,
        input.gpus_per_node,
        input.intra.name,
        input.inter.name,
        input.global_batch,
        input.seq,
        input.precision
    );
    println!(
        "{tried} choices tried; estimates at {:.0}% of the {:.0} TFLOP/s peak, {:.1} GiB reserved per GPU (ferrotron plan --explain CHOICE for the breakdown)",
        100.0 * input.efficiency,
        input.peak_flops() / 1e12,
        input.reserve_bytes / GIB
    );
    if p.feasible.is_empty() {
        println!(
            "no choice fits in {:.1} GiB",
            input.device.memory_bytes / GIB
        );
    } else {
        println!(
            "{:>4}  {:<30} {:>11} {:>9} {:>11} {:>6} {:>6} {:>7} {:>9} {:>5}",
            "rank",
            "choice",
            "GiB/GPU",
            "step s",
            "tokens/s",
            "MFU",
            "HFU",
            "bubble",
            "kJ/step*",
            "today"
        );
        for (i, e) in p.feasible.iter().enumerate() {
            println!(
                "{:>4}  {:<30} {:>11.2} {:>9.3} {:>11.0} {:>5.1}% {:>5.1}% {:>6.1}% {:>9.1} {:>5}",
                i + 1,
                e.label,
                e.memory.total() / GIB,
                e.time.step_s,
                e.time.tokens_per_s,
                100.0 * e.time.mfu,
                100.0 * e.time.hfu,
                100.0 * e.time.bubble_fraction,
                e.time.energy_estimate_j / 1e3,
                if e.runs_today { "yes" } else { "no" }
            );
        }
        println!("* estimated from the GPUs' board power (TDP), not measured");
    }
    if !p.rejected.is_empty() {
        println!("faster choices that do not fit (per dp/tp/pp/ZeRO stage, the smallest):");
        for r in &p.rejected {
            println!(
                "      {:<30} {:>9.3} s/step  {}",
                r.estimate.label, r.estimate.time.step_s, r.reason
            );
        }
    }
    Ok(())
}
