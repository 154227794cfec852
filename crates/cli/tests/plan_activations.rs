//! The planner's activation memory against Ferrotron's CPU path: the bytes
//! a forward pass keeps alive for backward (heap growth from before the
//! forward to after it, the loss and its autodiff graph held), measured
//! with a counting allocator, against `ferrotron plan --explain`'s
//! activations for the same shape (f32, no dropout, no recomputation)
//! under `--activations ferrotron-cpu`: the tensors Burn's autodiff keeps
//! for each primitive of the reference ops, counted (no fitted constant;
//! see `ferrotron_parallel::plan::activation`). Korthikanti's count, for
//! fused kernels, is printed beside it.

use std::process::Command;

use ferrotron_test_support::deadline;

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Int, Tensor, TensorData};
use ferrotron_engine::lm::CausalLm;
use ferrotron_engine::metrics::{heap_bytes, CountingAllocator};
use ferrotron_models::presets::preset;
use ferrotron_models::Decoder;

#[path = "cli/common/mod.rs"]
mod common;

use common::plan_cpu_args;

/// The heap in use, counted (the allocator `ferrotron train` installs).
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

type B = Autodiff<Flex>;

const VOCAB: usize = 300;

/// Bytes the forward of `model` keeps for backward on a `[batch, seq]` batch.
fn stored_by_forward(model: &str, batch: usize, seq: usize) -> f64 {
    let mut config = preset(model).unwrap();
    config.vocab_size = VOCAB;
    let device = Default::default();
    let decoder = Decoder::<B>::new(&config, 7, &device).unwrap();
    let ids = |shift: usize| {
        let v: Vec<i64> = (0..batch * seq)
            .map(|i| ((i * 31 + shift) % VOCAB) as i64)
            .collect();
        Tensor::<B, 2, Int>::from_data(TensorData::new(v, [batch, seq]), &device)
    };
    // A first forward and backward, so that lazily built state is in place.
    let _ = decoder.loss(ids(0), ids(1)).backward();
    let before = heap_bytes();
    let loss = decoder.loss(ids(0), ids(1));
    let _ = loss.clone().into_data();
    let after = heap_bytes();
    drop(loss);
    after.saturating_sub(before) as f64
}

/// The planner's activations of one micro-batch of `batch` x `seq` on one
/// CPU rank under the activation model `activations`.
fn planned(model: &str, batch: usize, seq: usize, activations: &str) -> f64 {
    let label = format!("dp1-tp1-pp1-z0-mb{batch}-none");
    let out = deadline::output(
        Command::new(env!("CARGO_BIN_EXE_ferrotron"))
            .args(plan_cpu_args(model, VOCAB, 1, batch, seq))
            .args(["--explain", &label, "--json", "--activations", activations]),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let a = &v["memory"]["activations"];
    ["layers", "embedding", "output", "recompute_working"]
        .iter()
        .map(|k| a[k].as_f64().unwrap())
        .sum()
}

#[test]
fn activation_peak_of_the_cpu_path_is_within_25_percent_of_the_plan() {
    let mut ratios = Vec::new();
    for (model, batch, seq) in [
        ("gpt-mini", 4, 64),
        ("gpt-mini", 2, 128),
        ("gpt-mini", 1, 256),
        ("llama-mini", 4, 64),
        ("llama-mini", 1, 256),
        ("bloom-mini", 4, 64),
    ] {
        let measured = stored_by_forward(model, batch, seq);
        let plan = planned(model, batch, seq, "ferrotron-cpu");
        let korthikanti = planned(model, batch, seq, "korthikanti");
        let ratio = measured / plan;
        println!(
            "{model} {batch}x{seq}: measured {:.0} KiB, counted {:.0} KiB, ratio {ratio:.3}; to Korthikanti's count {:.3}",
            measured / 1024.0,
            plan / 1024.0,
            measured / korthikanti
        );
        ratios.push((model, batch, seq, ratio));
    }
    for (model, batch, seq, ratio) in ratios {
        assert!(
            (ratio - 1.0).abs() <= 0.25,
            "{model} {batch}x{seq}: ratio {ratio}"
        );
    }
}
