//! Training on the `wgpu` backend: Burn's CubeCL backend over the wgpu
//! runtime (Mesa's lavapipe, a Vulkan driver on the CPU, in CI) with the
//! fused kernels.
//! - `ferrotron train --backend wgpu` on `llama-mini` (RMSNorm, RoPE,
//!   SwiGLU, grouped-query attention, untied head) follows the same run on
//!   the default CPU backend step for step: every step's loss and gradient
//!   norm, the final validation loss and the saved weights; the default
//!   precision on wgpu is fp32. (The other families' fused kernels are
//!   checked against the CPU reference in
//!   crates/models/tests/models/fused_kernels.rs; one family here keeps lavapipe's
//!   first shader compilation, minutes on a cold Mesa cache, to one set.)
//!   Each wgpu step records its device memory (CubeCL's pools), at least
//!   the parameters and optimizer state the run counts.
//! - The same wgpu run under `--zero 1 --offload optimizer` (AdamW's
//!   moments in host memory, updated on the CPU) follows the wgpu run
//!   without offload within 1e-6 (losses, gradient norms, weights), and
//!   its device holds the moments' 8 bytes per parameter less at every
//!   step (CubeCL's bytes in use).
//! - `ferrotron bench train --backends flex,wgpu` measures both and their
//!   losses agree; wgpu's peak memory is its pools' reserved bytes.
//!
//! A build without the `wgpu` feature skips with a printed reason
//! (`scripts/test --mpi` builds it, as CI does).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common;
use crate::mpirun;
use ferrotron_test_support::deadline;
use ferrotron_test_support::skip::skip;

use common::{corpus, records, scratch, step_records};
use ferrotron_test_support::runs::{check_steps, check_weights};
use mpirun::{train, RunFlags};

/// Largest relative difference of a step's loss or gradient norm: the
/// fused kernels sum in another order than the CPU operations (seen on
/// lavapipe: below 1e-5 over 4 steps).
const STEP_TOLERANCE: f64 = 1e-4;

/// `false` (and a printed reason) when the binary has no wgpu backend.
fn wgpu_built() -> bool {
    if !cfg!(feature = "wgpu") {
        skip(
            "ferrotron was built without the `wgpu` feature; run `scripts/test --mpi` \
             (or `cargo test -p ferrotron-cli --features wgpu`)",
        );
    }
    cfg!(feature = "wgpu")
}

/// Trains `model` for 4 steps on `backend` with the flags `extra` into
/// `dir/{model}-{backend}{suffix}`; returns the run directory and what the
/// run printed on stdout.
fn train_on(
    dir: &Path,
    corpus: &Path,
    model: &str,
    backend: &str,
    (suffix, extra): (&str, &[&str]),
) -> (PathBuf, String) {
    let out = dir.join(format!("{model}-{backend}{suffix}"));
    let mut args = RunFlags::new(model, corpus, &out, "4").args();
    args.extend(["--backend".to_string(), backend.to_string()]);
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = train(1, &args);
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{model} on {backend} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    (out, stdout)
}

/// The last validation loss of a run's `metrics.jsonl`.
fn last_val_loss(run: &Path) -> f64 {
    records(run)
        .iter()
        .rev()
        .find_map(|v| v.get("val_loss")?.as_f64())
        .expect("a validation record")
}

#[test]
fn wgpu_training_follows_the_cpu_run() {
    if !wgpu_built() {
        return;
    }
    let dir = scratch("wgpu-training");
    let corpus = corpus(&dir);
    let model = "llama-mini";
    let (cpu, _) = train_on(&dir, &corpus, model, "flex", ("", &[]));
    let (gpu, log) = train_on(&dir, &corpus, model, "wgpu", ("", &[]));
    assert!(log.contains(" on wgpu;"), "{log}");
    assert!(log.contains("precision fp32"), "{log}");
    check_steps(model, &gpu, &cpu, STEP_TOLERANCE);
    let (g, c) = (last_val_loss(&gpu), last_val_loss(&cpu));
    assert!(
        ((g - c) / c).abs() <= STEP_TOLERANCE,
        "validation loss {g} on wgpu vs {c} on flex"
    );
    check_weights(model, &gpu, &cpu, 1e-4, 1e-3);
    check_device_memory(&gpu, &cpu);
    let offload = ["--zero", "1", "--offload", "optimizer"];
    let (off, _) = train_on(&dir, &corpus, model, "wgpu", ("-offload", &offload));
    check_steps(model, &off, &gpu, OFFLOAD_TOLERANCE);
    check_weights(model, &off, &gpu, OFFLOAD_TOLERANCE as f32, 1e-5);
    check_offloaded_memory(&off, &gpu);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Largest relative difference of the offloaded run's losses, gradient
/// norms and weights from the run without offload: the host AdamW and
/// the device's tensor operations round alike per element, but lavapipe's
/// division and square root need not be correctly rounded.
const OFFLOAD_TOLERANCE: f64 = 1e-6;

/// The offloaded run's device holds AdamW's two f32 moments (8 bytes per
/// parameter, all of them on one rank) less than the run without offload
/// at every step, within the pools' rounding, and reports no optimizer
/// state on the device.
fn check_offloaded_memory(off: &Path, gpu: &Path) {
    let (off, gpu) = (step_records(off), step_records(gpu));
    assert_eq!(off.len(), gpu.len());
    for (o, g) in off.iter().zip(&gpu) {
        let params = g["param_bytes"].as_u64().unwrap() / 4;
        let want = 8 * params;
        assert_eq!(g["optimizer_bytes"].as_u64().unwrap(), want, "{g}");
        assert_eq!(o["optimizer_bytes"].as_u64().unwrap(), 0, "{o}");
        let in_use = |r: &serde_json::Value| r["device_bytes_in_use"].as_u64().unwrap() as i64;
        let saved = in_use(g) - in_use(o);
        println!(
            "step {}: device bytes in use {} without offload, {} with: {saved} saved, {want} expected",
            g["step"], in_use(g), in_use(o)
        );
        assert!(
            (saved - want as i64).abs() as f64 <= 0.05 * want as f64,
            "offload saved {saved} device bytes, expected {want} (8 x {params} parameters)"
        );
    }
}

/// Every wgpu step records its device memory, and it holds at least the
/// parameters and AdamW state the run counts itself (f32 on the device
/// between steps); the CPU run records none.
fn check_device_memory(gpu: &Path, cpu: &Path) {
    for r in step_records(gpu) {
        let in_use = r["device_bytes_in_use"].as_u64().unwrap_or(0);
        let reserved = r["device_bytes_reserved"].as_u64().unwrap_or(0);
        let state = r["param_bytes"].as_u64().unwrap() + r["optimizer_bytes"].as_u64().unwrap();
        assert!(
            in_use >= state,
            "{in_use} bytes in use < {state} of training state: {r}"
        );
        assert!(reserved >= in_use, "{r}");
    }
    for r in step_records(cpu) {
        assert!(r.get("device_bytes_in_use").is_none(), "{r}");
    }
}

#[test]
fn bench_train_measures_wgpu_beside_flex() {
    if !wgpu_built() {
        return;
    }
    let dir = scratch("wgpu-bench-train");
    let json = dir.join("bench.json");
    // Head dimension 32 and grouped queries, as llama-mini's.
    let out = deadline::output(
        Command::new(env!("CARGO_BIN_EXE_ferrotron"))
            .args([
                "bench",
                "train",
                "--family",
                "llama",
                "--layers",
                "1",
                "--hidden",
                "64",
                "--heads",
                "2",
                "--kv-heads",
                "1",
                "--ffn",
                "96",
                "--vocab",
                "64",
                "--batch",
                "2",
                "--seq",
                "16",
                "--warmup",
                "1",
                "--steps",
                "1",
                "--backends",
                "flex,wgpu",
                "--json",
            ])
            .arg(&json),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench train failed: {stderr}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("--json written")).unwrap();
    let results = doc["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{doc}");
    let (flex, wgpu) = (&results[0], &results[1]);
    assert_eq!(flex["backend"], "flex");
    assert_eq!(wgpu["backend"], "wgpu");
    assert!(
        wgpu["device"].as_str().unwrap().ends_with("(wgpu)"),
        "the adapter's name: {wgpu}"
    );
    assert_eq!(wgpu["precision"], "fp32");
    // The head and loss run in blocks of rows on GPUs too (the cube
    // backends' chunked head), as on the CPU.
    assert_eq!(wgpu["head"], "chunked");
    // Device memory: the pools' reserved bytes, at least the bytes in use.
    let in_use = wgpu["device_bytes_in_use"].as_u64().unwrap_or(0);
    assert!(in_use > 0, "{wgpu}");
    assert!(
        wgpu["peak_memory_bytes"].as_u64().unwrap() >= in_use,
        "{wgpu}"
    );
    assert!(
        wgpu["memory_source"]
            .as_str()
            .unwrap()
            .contains("cubecl wgpu"),
        "{wgpu}"
    );
    assert!(flex.get("device_bytes_in_use").is_none(), "{flex}");
    assert!(wgpu["tokens_per_s"].as_f64().unwrap() > 0.0);
    let (g, c) = (
        wgpu["last_loss"].as_f64().unwrap(),
        flex["last_loss"].as_f64().unwrap(),
    );
    assert!(
        ((g - c) / c).abs() <= STEP_TOLERANCE,
        "last loss {g} on wgpu vs {c} on flex"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
