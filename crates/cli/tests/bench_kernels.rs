//! `ferrotron bench kernels`: a quick sweep writes, per kernel (the row and
//! the tiled attention among them), a `flex` row (reference only) and a
//! `wgpu` row (fused and reference) with positive times and memory, and
//! TFLOP/s for attention (built with `--features kernels-bench`); a backend that
//! is not compiled in is refused by name; without the feature the
//! subcommand exits 2 naming the feature.

use std::process::Command;

#[cfg(feature = "kernels-bench")]
#[test]
fn quick_bench_writes_a_json_row_per_kernel_with_positive_times() {
    let json = std::env::temp_dir().join(format!("ferrotron-bench-{}.json", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_ferrotron"))
        .args(["bench", "kernels", "--quick", "--reps", "1", "--json"])
        .arg(&json)
        // The autotune level is chosen for the adapter by the binary.
        .env_remove("CUBECL_AUTOTUNE_LEVEL")
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}");
    assert!(
        stderr.contains("bench: cubecl autotune level"),
        "the autotune choice is reported: {stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("--json file written"))
            .expect("valid JSON");
    let _ = std::fs::remove_file(&json);
    let rows = doc["rows"].as_array().expect("rows array");
    let kernels = [
        "attention",
        "attention_tiled",
        "swiglu",
        "rms_norm",
        "layer_norm",
        "rope",
        "cross_entropy",
    ];
    let row = |kernel: &str, backend: &str| {
        rows.iter()
            .find(|r| r["kernel"] == kernel && r["backend"] == backend)
            .unwrap_or_else(|| panic!("no {backend} row for {kernel}"))
    };
    let positive = |row: &serde_json::Value, key: &str| {
        let v = row[key].as_f64().unwrap_or(0.0);
        assert!(
            v > 0.0,
            "{} on {}: {key} = {}",
            row["kernel"],
            row["backend"],
            row[key]
        );
    };
    for kernel in kernels {
        let flex = row(kernel, "flex");
        positive(flex, "reference_ms");
        positive(flex, "reference_peak_mib");
        assert!(flex["fused_ms"].is_null(), "flex has no fused kernels");
        let wgpu = row(kernel, "wgpu");
        for key in [
            "fused_ms",
            "reference_ms",
            "time_ratio_vs_flex",
            "fused_peak_mib",
            "reference_peak_mib",
        ] {
            positive(wgpu, key);
        }
        assert!(stdout.contains(kernel), "table lacks {kernel}");
    }
    // Both attention forward kernels report their forward alone and TFLOP/s
    // (on the fused path only), at each shape of the quick sweep.
    for kernel in ["attention", "attention_tiled"] {
        let attention: Vec<_> = rows
            .iter()
            .filter(|r| r["kernel"] == kernel && r["backend"] == "wgpu")
            .collect();
        assert_eq!(attention.len(), 2, "{kernel}: one wgpu row per quick shape");
        for row in attention {
            for key in ["fused_forward_ms", "fused_tflops", "fused_forward_tflops"] {
                positive(row, key);
            }
            assert!(
                row["fused_forward_ms"].as_f64() < row["fused_ms"].as_f64(),
                "{kernel}: the forward alone is part of forward + backward: {row}"
            );
        }
        assert!(row(kernel, "flex")["fused_tflops"].is_null());
    }
    assert!(row("swiglu", "wgpu")["fused_tflops"].is_null());
}

#[cfg(feature = "kernels-bench")]
#[test]
fn a_backend_not_compiled_in_is_refused_by_name() {
    let out = Command::new(env!("CARGO_BIN_EXE_ferrotron"))
        .args(["bench", "kernels", "--quick", "--backends", "flex,metal"])
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("--backends metal"), "{stderr}");
    assert!(stderr.contains("compiled: flex, wgpu"), "{stderr}");
}

#[cfg(not(feature = "kernels-bench"))]
#[test]
fn bench_kernels_without_the_feature_exits_2_naming_it() {
    println!("skipped the quick benchmark: built without --features kernels-bench");
    let out = Command::new(env!("CARGO_BIN_EXE_ferrotron"))
        .args(["bench", "kernels", "--quick"])
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("kernels-bench"), "{stderr}");
}
