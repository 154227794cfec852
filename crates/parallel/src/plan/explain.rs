//! The memory and time breakdown of one choice, for a person.

use std::fmt::Write as _;

use super::time::overlaps;
use super::{Estimate, PlanInput};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Several lines: the layout, memory per GPU by class and time per step by part.
pub fn explain(input: &PlanInput, e: &Estimate) -> String {
    let c = &e.choice;
    let mem = &e.memory;
    let t = &e.time;
    let micro_batches = input.global_batch / (c.dp * c.micro_batch);
    let gib = |b: f64| b / GIB;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{}: dp {} x tp {}{}{} x pp {}{} on {} {} GPUs ({} per node), ZeRO-{}, micro-batch {} x {} micro-batches per DP rank, recompute {:?}, {}",
        e.label,
        c.dp,
        c.tp,
        if c.sp { " (+SP)" } else { "" },
        if c.cp > 1 {
            format!(" x cp {} (ring attention)", c.cp)
        } else {
            String::new()
        },
        c.pp,
        if c.interleave > 1 {
            format!(" (interleaved, {} chunks per stage)", c.interleave)
        } else {
            String::new()
        },
        input.gpus,
        input.device.name,
        input.gpus_per_node,
        u8::from(c.zero),
        c.micro_batch,
        micro_batches,
        c.recompute,
        input.precision
    );
    let _ = writeln!(
        s,
        "memory per GPU ({} stage): {:.2} GiB of {:.1} GiB",
        mem.stage,
        gib(mem.total()),
        gib(input.device.memory_bytes)
    );
    let rows = [
        ("parameters", mem.state.param_bytes as f64),
        ("gradients", mem.state.grad_bytes as f64),
        ("optimizer state", mem.state.optimizer_bytes as f64),
        ("activations: layers", mem.activations.layers),
        ("activations: embedding", mem.activations.embedding),
        ("activations: output + logits", mem.activations.output),
        (
            "activations: recompute working set",
            mem.activations.recompute_working,
        ),
        ("transient buffers", mem.transient),
        ("reserve (framework, runtime)", mem.reserve),
    ];
    for (name, bytes) in rows {
        let _ = writeln!(s, "  {name:<36} {:>10.3} GiB", gib(bytes));
    }
    let _ = writeln!(
        s,
        "checkpoint, host memory beyond the above: {:.3} GiB while a save streams its blocks, {:.3} GiB held through the next steps with --async-checkpoint",
        gib(mem.checkpoint.streamed),
        gib(mem.checkpoint.background)
    );
    if c.offload {
        let _ = writeln!(
            s,
            "optimizer offloaded: {:.3} GiB of its state in host memory, not counted above (--offload optimizer)",
            gib(mem.host_offload)
        );
    }
    if mem.gathered_blocks > 0 {
        let _ = writeln!(
            s,
            "ZeRO-3 holds {} block(s) gathered at once beside the embedding and head (the one computing and {} ahead: --zero3-prefetch under overlap)",
            mem.gathered_blocks,
            mem.gathered_blocks - 1
        );
    }
    if c.pp > 1 {
        let split: Vec<String> = e.stage_layers.iter().map(usize::to_string).collect();
        let _ = writeln!(
            s,
            "blocks per stage: {}{}",
            split.join(","),
            if c.interleave > 1 {
                String::new()
            } else {
                format!(" (train --pp-layers {})", split.join(","))
            }
        );
    }
    let _ = writeln!(
        s,
        "time per step: {:.3} s ({:.0} tokens/s, MFU {:.1}%, HFU {:.1}%, bubble {:.1}% of the pipeline)",
        t.step_s,
        t.tokens_per_s,
        100.0 * t.mfu,
        100.0 * t.hfu,
        100.0 * t.bubble_fraction
    );
    let rows = [
        ("compute", t.compute_s),
        ("tensor-parallel collectives", t.tp_comm_s),
        ("context-parallel ring (not hidden)", t.cp_comm_s),
        ("pipeline sends", t.pp_comm_s),
        ("pipeline bubble", t.bubble_s),
        ("data-parallel collectives, exposed", t.dp_exposed_s),
        ("optimizer offload: PCIe and CPU AdamW", t.offload_s),
    ];
    for (name, secs) in rows {
        let _ = writeln!(s, "  {name:<36} {secs:>10.4} s");
    }
    let _ = writeln!(
        s,
        "  (data-parallel collectives in all {:.4} s, {:.4} s of it hidden behind compute{})",
        t.dp_comm_s,
        t.dp_comm_s - t.dp_exposed_s,
        if overlaps(input, c) {
            ": overlapped as the trainer runs it"
        } else {
            ": not overlapped (dp 1, tp, cp or pp above 1, or --overlap-grad-reduce false)"
        }
    );
    let _ = writeln!(
        s,
        "energy per step: {:.0} kJ (an estimate: {} GPUs at their {:.0} W board power)",
        t.energy_estimate_j / 1e3,
        c.dp * c.cp * c.tp * c.pp,
        input.device.tdp_w
    );
    let _ = write!(
        s,
        "Ferrotron runs this layout today: {}",
        if e.runs_today { "yes" } else { "no" }
    );
    s
}
