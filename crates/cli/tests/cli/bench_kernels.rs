//! `ferrotron bench kernels`: a quick sweep writes, per kernel (the row and
//! the tiled attention among them), a `flex` row (reference only) and a
//! `wgpu` row (fused and reference) with positive times and memory, and
//! TFLOP/s for attention (built with `--features kernels-bench`); the cmma
//! attention kernel runs only when named and says where it cannot;
//! `--mma-tiles` adds a row per tile pair of the register kernels, and
//! only with them; `--no-reference` leaves the reference out; `--torch` sets PyTorch's
//! attention times beside the rows of their shape and type, and a file of
//! another kind exits 2; a
//! backend that is not compiled in is refused by name; without the feature
//! the subcommand exits 2 naming the feature.

use std::path::{Path, PathBuf};
use std::process::Command;

use ferrotron_test_support::deadline;

/// This process's path for a bench's `--json` file, told apart by `tag`.
#[cfg_attr(not(feature = "kernels-bench"), allow(dead_code))]
fn json_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ferrotron-bench-{tag}-{}.json", std::process::id()))
}

/// `ferrotron bench kernels --quick --reps 1`, then `args`, then `--json
/// json`.
#[cfg_attr(not(feature = "kernels-bench"), allow(dead_code))]
fn quick_bench(args: &[&str], json: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrotron"));
    cmd.args(["bench", "kernels", "--quick", "--reps", "1"])
        .args(args)
        .arg("--json")
        .arg(json);
    cmd
}

/// The `rows` of the `--json` file a bench wrote at `path`, which is then
/// removed.
#[cfg_attr(not(feature = "kernels-bench"), allow(dead_code))]
fn take_rows(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).expect("--json file written");
    let _ = std::fs::remove_file(path);
    let doc: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    doc["rows"].as_array().expect("rows array").clone()
}

#[cfg(feature = "kernels-bench")]
#[test]
fn quick_bench_writes_a_json_row_per_kernel_with_positive_times() {
    let json = json_path("quick");
    let out = deadline::output(
        // The autotune level is chosen for the adapter by the binary.
        quick_bench(&[], &json).env_remove("CUBECL_AUTOTUNE_LEVEL"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}");
    assert!(
        stderr.contains("bench: cubecl autotune level"),
        "the autotune choice is reported: {stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    let rows = take_rows(&json);
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
    // Both attention kernel pairs report their forward alone, their
    // backward alone and TFLOP/s (on the fused path only), at each shape of
    // the quick sweep.
    for kernel in ["attention", "attention_tiled"] {
        let attention: Vec<_> = rows
            .iter()
            .filter(|r| r["kernel"] == kernel && r["backend"] == "wgpu")
            .collect();
        assert_eq!(attention.len(), 2, "{kernel}: one wgpu row per quick shape");
        for row in attention {
            for key in [
                "fused_forward_ms",
                "fused_backward_ms",
                "fused_tflops",
                "fused_forward_tflops",
                "fused_backward_tflops",
            ] {
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
    assert!(
        rows.iter()
            .all(|r| r["kernel"] != "attention_cmma_bf16" && r["kernel"] != "attention_mma_bf16"),
        "the matrix-unit kernels run only when named"
    );
}

#[cfg(feature = "kernels-bench")]
#[test]
fn the_matrix_unit_kernels_run_when_named_and_say_where_they_cannot() {
    // Lavapipe has no matrix units: the rows carry the reference and the
    // reason the fused path is absent.
    for kernel in ["attention_cmma_bf16", "attention_mma_bf16"] {
        let json = json_path(kernel);
        let out = deadline::output(&mut quick_bench(
            &["--backends", "wgpu", "--only", kernel],
            &json,
        ));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "bench failed: {stderr}");
        let rows = take_rows(&json);
        assert_eq!(rows.len(), 2, "one row per quick shape: {rows:?}");
        for row in rows {
            assert_eq!(row["kernel"], kernel);
            assert!(row["fused_ms"].is_null(), "{row}");
            assert!(row["reference_ms"].as_f64().unwrap_or(0.0) > 0.0, "{row}");
            assert!(
                row["note"]
                    .as_str()
                    .is_some_and(|n| n.contains("not on this device")),
                "{row}"
            );
        }
    }
}

#[cfg(feature = "kernels-bench")]
#[test]
fn mma_tiles_adds_a_row_per_register_tile_pair_only_with_the_register_kernels() {
    let json = json_path("mma-tiles");
    let run = |only: &str| {
        deadline::output(&mut quick_bench(
            &[
                "--backends",
                "wgpu",
                "--only",
                only,
                "--mma-tiles",
                "--no-reference",
            ],
            &json,
        ))
    };
    let out = run("attention");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--mma-tiles"), "{stderr}");
    assert!(!json.exists(), "nothing written");

    let out = run("attention_mma_bf16");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}");
    let notes: Vec<String> = take_rows(&json)
        .iter()
        .map(|r| r["note"].as_str().unwrap_or_default().to_string())
        .collect();
    // Per quick shape: the largest tiles, then the forward's four tile
    // pairs and the backward's four, each named; lavapipe runs none.
    let named = [
        "forward registers64x64-mma",
        "forward registers64x32-mma",
        "forward registers64x16-mma",
        "forward registers16x16-mma",
        "backward registers64x32-mma",
        "backward registers64x16-mma",
        "backward registers32x16-mma",
        "backward registers16x16-mma",
    ];
    let no_reference = "reference not run (--no-reference)";
    let largest = format!("attention_mma_bf16: not on this device; {no_reference}");
    let tiles = named.map(|n| {
        format!(
            "{n}; attention_mma_bf16: not on this device (no mma instruction, or these tiles \
             do not fit its shared memory); {no_reference}"
        )
    });
    let per_shape = std::iter::once(largest).chain(tiles);
    let want: Vec<String> = per_shape.clone().chain(per_shape).collect();
    assert_eq!(notes, want);
}

#[cfg(feature = "kernels-bench")]
#[test]
fn no_reference_times_the_fused_kernels_alone() {
    let json = json_path("noref");
    let out = deadline::output(&mut quick_bench(
        &["--backends", "wgpu", "--only", "swiglu", "--no-reference"],
        &json,
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}");
    let rows = take_rows(&json);
    assert!(!rows.is_empty());
    for row in rows {
        assert!(row["fused_ms"].as_f64().unwrap_or(0.0) > 0.0, "{row}");
        for key in ["reference_ms", "reference_peak_mib", "time_ratio"] {
            assert!(row[key].is_null(), "{key}: {row}");
        }
        assert!(
            row["note"]
                .as_str()
                .is_some_and(|n| n.contains("--no-reference")),
            "{row}"
        );
    }
}

#[cfg(feature = "kernels-bench")]
#[test]
fn head_dim_sets_the_attention_shapes_and_an_odd_one_exits_2_writing_nothing() {
    let json = json_path("hd");
    let run = |head_dim: &str| {
        deadline::output(&mut quick_bench(
            &[
                "--backends",
                "flex",
                "--only",
                "attention",
                "--head-dim",
                head_dim,
            ],
            &json,
        ))
    };
    let out = run("7");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--head-dim 7"), "{stderr}");
    assert!(!json.exists(), "nothing written");
    let out = run("128");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = take_rows(&json);
    let shapes: Vec<&str> = rows.iter().map(|r| r["shape"].as_str().unwrap()).collect();
    // The row and the tiled kernel at the two quick lengths.
    assert_eq!(
        shapes,
        [
            "[1, 2, 64, 128]",
            "[1, 2, 64, 128]",
            "[1, 2, 128, 128]",
            "[1, 2, 128, 128]"
        ]
    );
}

/// Writes a file as scripts/bench_torch_attention.py does, in `dtype`,
/// with one row: `[1, 2, 64, 64]` (bench kernels --quick's first attention
/// shape) at 0.5 ms forward and 1.5 ms backward.
#[cfg(feature = "kernels-bench")]
fn torch_file(tag: &str, schema: &str, dtype: &str) -> PathBuf {
    let path = json_path(tag);
    let doc = serde_json::json!({
        "schema": schema,
        "device": "test",
        "torch": "test",
        "dtype": dtype,
        "backend": "math",
        "causal": true,
        "warmup": 1,
        "reps": 3,
        "rows": [{
            "shape": "[1, 2, 64, 64]",
            "forward_ms": 0.5,
            "backward_ms": 1.5,
            "ms": 2.0,
            "forward_tflops": 0.001,
            "backward_tflops": 0.001,
            "tflops": 0.001
        }]
    });
    std::fs::write(&path, doc.to_string()).expect("write the torch file");
    path
}

#[cfg(feature = "kernels-bench")]
#[test]
fn torch_times_stand_beside_the_attention_rows_of_their_shape_and_type() {
    for (dtype, applies) in [("f32", true), ("bf16", false)] {
        let torch = torch_file(
            &format!("torch-{dtype}"),
            "ferrotron-torch-attention/1",
            dtype,
        );
        let json = json_path(&format!("with-torch-{dtype}"));
        let out = deadline::output(&mut quick_bench(
            &[
                "--backends",
                "wgpu",
                "--only",
                "attention",
                "--no-reference",
                "--torch",
                torch.to_str().unwrap(),
            ],
            &json,
        ));
        let _ = std::fs::remove_file(&torch);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "bench failed: {stderr}");
        let rows = take_rows(&json);
        assert_eq!(rows.len(), 4, "row and tiled kernel at 64 and 128 tokens");
        for row in rows {
            let fused = row["fused_ms"].as_f64().expect("fused ms");
            let fused_forward = row["fused_forward_ms"].as_f64().expect("fused fwd ms");
            if applies && row["shape"] == "[1, 2, 64, 64]" {
                assert_eq!(row["torch_ms"], 2.0, "{row}");
                assert_eq!(row["torch_forward_ms"], 0.5, "{row}");
                assert_eq!(row["torch_backward_ms"], 1.5, "{row}");
                let ratio = row["time_ratio_vs_torch"].as_f64().expect("ratio");
                assert!((ratio - fused / 2.0).abs() < 1e-12, "{row}");
                let forward = row["forward_ratio_vs_torch"].as_f64().expect("fwd ratio");
                assert!((forward - fused_forward / 0.5).abs() < 1e-12, "{row}");
            } else {
                // Another shape, or f32 kernels beside bf16 times.
                for key in ["torch_ms", "time_ratio_vs_torch", "forward_ratio_vs_torch"] {
                    assert!(row[key].is_null(), "{key}: {row}");
                }
            }
        }
    }
}

#[cfg(feature = "kernels-bench")]
#[test]
fn a_torch_file_of_another_schema_exits_2_naming_it_and_writing_nothing() {
    let torch = torch_file("torch-bad", "ferrotron-bench-train/1", "f32");
    let json = json_path("with-bad-torch");
    let out = deadline::output(&mut quick_bench(
        &[
            "--backends",
            "flex",
            "--only",
            "attention",
            "--torch",
            torch.to_str().unwrap(),
        ],
        &json,
    ));
    let _ = std::fs::remove_file(&torch);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("--torch {}", torch.display())),
        "{stderr}"
    );
    assert!(stderr.contains("ferrotron-torch-attention/1"), "{stderr}");
    assert!(!json.exists(), "nothing written");
}

#[cfg(feature = "kernels-bench")]
#[test]
fn a_backend_not_compiled_in_is_refused_by_name() {
    let out = deadline::output(Command::new(env!("CARGO_BIN_EXE_ferrotron")).args([
        "bench",
        "kernels",
        "--quick",
        "--backends",
        "flex,metal",
    ]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("--backends metal"), "{stderr}");
    assert!(stderr.contains("compiled: flex, wgpu"), "{stderr}");
}

#[cfg(not(feature = "kernels-bench"))]
#[test]
fn bench_kernels_without_the_feature_exits_2_naming_it() {
    println!("skipped the quick benchmark: built without --features kernels-bench");
    let out = deadline::output(
        Command::new(env!("CARGO_BIN_EXE_ferrotron")).args(["bench", "kernels", "--quick"]),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("kernels-bench"), "{stderr}");
}
