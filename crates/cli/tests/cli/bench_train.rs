//! `ferrotron bench train`: a tiny run (1 warm-up + 1 timed step) writes
//! the documented JSON schema with the Megatron FLOP count; `--compare`
//! merges two result files into one table, one JSON and an SVG chart; bad
//! input exits 2 naming the flag or file and writes nothing. Speed is
//! never asserted.

use std::path::{Path, PathBuf};

use crate::common::ferrotron;

use serde_json::Value;

/// `name` in a directory of its own for `test` (tests run in parallel).
fn temp(test: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ferrotron-bench-train-{test}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs a tiny shape of `family` with `--json path` and `extra` flags and
/// returns the file.
fn tiny_run(family: &str, kv_heads: &str, path: &Path, extra: &[&str]) -> Value {
    let mut args = vec![
        "bench",
        "train",
        "--family",
        family,
        "--layers",
        "1",
        "--hidden",
        "32",
        "--heads",
        "2",
        "--kv-heads",
        kv_heads,
        "--vocab",
        "64",
        "--batch",
        "2",
        "--seq",
        "8",
        "--warmup",
        "1",
        "--steps",
        "1",
        "--backends",
        "flex",
        "--json",
        s(path),
    ];
    args.extend(extra);
    let out = ferrotron(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench train failed: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("tokens/s") && stdout.contains("flex"),
        "{stdout}"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("--json written"))
        .expect("JSON");
    // On a CPU backend the head and loss run in row blocks by default.
    assert_eq!(v["results"][0]["head"], "chunked", "{v}");
    v
}

#[test]
fn tiny_run_writes_the_schema_and_compare_merges_two_files() {
    let (a, b) = (temp("run", "a.json"), temp("run", "b.json"));
    let doc = tiny_run("gpt", "2", &a, &[]);
    assert_eq!(doc["schema"], "ferrotron-bench-train/1");
    let r = &doc["results"][0];
    assert_eq!(doc["results"].as_array().unwrap().len(), 1);
    assert_eq!(r["backend"], "flex");
    assert!(r["framework"].as_str().unwrap().starts_with("ferrotron "));
    assert!(!r["device"].as_str().unwrap().is_empty());
    assert!(r["threads"].as_u64().unwrap() >= 1);
    let shape = &r["shape"];
    assert_eq!(shape["family"], "gpt");
    for (key, v) in [
        ("layers", 1),
        ("hidden", 32),
        ("heads", 2),
        ("kv_heads", 2),
        ("ffn", 128),
        ("vocab", 64),
    ] {
        assert_eq!(shape[key], v, "shape.{key}");
    }
    assert_eq!(shape["tied_head"], true);
    for (key, v) in [("batch", 2), ("seq", 8), ("warmup", 1), ("steps", 1)] {
        assert_eq!(r[key], v, "{key}");
    }
    // Megatron's 72 B s l h^2 (1 + s/6h + V/12lh) over the B s tokens (a GPT
    // shape: ffn = 4h, kv heads = heads).
    let (sq, l, h, v) = (8.0, 1.0, 32.0, 64.0);
    let megatron = 72.0 * l * h * h * (1.0 + sq / (6.0 * h) + v / (12.0 * l * h));
    let fpt = r["flops_per_token"].as_f64().unwrap();
    assert!((fpt / megatron - 1.0).abs() < 1e-12, "{fpt} vs {megatron}");
    let tps = r["tokens_per_s"].as_f64().unwrap();
    let step = r["step_s_median"].as_f64().unwrap();
    assert!(tps > 0.0 && step > 0.0);
    assert!(
        (tps * step / 16.0 - 1.0).abs() < 1e-9,
        "tokens/s = B s / step time"
    );
    let tflops = r["tflops"].as_f64().unwrap();
    assert!((tflops / (fpt * tps / 1e12) - 1.0).abs() < 1e-9);
    // Without recomputation, model and hardware FLOPs are the same.
    let mfu = r["mfu"].as_f64().unwrap();
    assert!((mfu / (tflops / r["peak_tflops"].as_f64().unwrap()) - 1.0).abs() < 1e-9);
    assert!((r["hfu"].as_f64().unwrap() / mfu - 1.0).abs() < 1e-12);
    assert!(r["peak_source"].as_str().unwrap().contains("measured"));
    assert!(r["peak_memory_bytes"].as_u64().unwrap() > 0);
    assert!(r["memory_source"].as_str().unwrap().contains("VmHWM"));
    assert!(r["last_loss"].as_f64().unwrap().is_finite());
    // Named with --backends flex: the others are not listed as skipped.
    assert_eq!(doc["skipped"], serde_json::json!([]));

    // Full recomputation repeats the forward: Megatron's 96 B s l h^2 (1 +
    // s/6h + V/16lh) hardware FLOPs (HFU), while MFU keeps the model's 72.
    let full = tiny_run(
        "gpt",
        "2",
        &temp("run", "full.json"),
        &["--recompute", "full"],
    );
    let f = &full["results"][0];
    let hardware = 96.0 * l * h * h * (1.0 + sq / (6.0 * h) + v / (16.0 * l * h));
    let fpt = f["flops_per_token"].as_f64().unwrap();
    assert!((fpt / hardware - 1.0).abs() < 1e-12, "{fpt} vs {hardware}");
    let rate = f["tokens_per_s"].as_f64().unwrap() / 1e12 / f["peak_tflops"].as_f64().unwrap();
    let (mfu, hfu) = (f["mfu"].as_f64().unwrap(), f["hfu"].as_f64().unwrap());
    assert!((mfu / (megatron * rate) - 1.0).abs() < 1e-9, "mfu {mfu}");
    assert!((hfu / (hardware * rate) - 1.0).abs() < 1e-9, "hfu {hfu}");

    let doc_b = tiny_run("llama", "1", &b, &[]);
    assert_eq!(doc_b["results"][0]["shape"]["family"], "llama");
    assert_eq!(doc_b["results"][0]["shape"]["tied_head"], false);

    let (merged, svg) = (temp("run", "merged.json"), temp("run", "chart.svg"));
    let out = ferrotron(&[
        "bench",
        "train",
        "--compare",
        s(&a),
        s(&b),
        "--json",
        s(&merged),
        "--chart",
        s(&svg),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("gpt l1 h32") && table.contains("llama l1 h32"),
        "{table}"
    );
    // Two workloads: each row is divided by itself, and says so.
    assert!(
        table.contains("1.00 of #1") && table.contains("1.00 of #2"),
        "{table}"
    );
    let m: Value = serde_json::from_str(&std::fs::read_to_string(&merged).unwrap()).unwrap();
    assert_eq!(m["schema"], "ferrotron-bench-train/1");
    assert_eq!(m["results"][0], doc["results"][0]);
    assert_eq!(m["results"][1], doc_b["results"][0]);
    let chart = std::fs::read_to_string(&svg).expect("--chart written");
    assert!(chart.starts_with("<svg") && chart.trim_end().ends_with("</svg>"));
    assert_eq!(chart.matches(r##"fill="#1f77b4""##).count(), 2, "{chart}");
    let _ = std::fs::remove_dir_all(a.parent().unwrap());
}

#[test]
fn bad_input_exits_2_naming_the_flag_or_file_and_writes_nothing() {
    let bad_schema = temp("bad", "bad-schema.json");
    std::fs::write(
        &bad_schema,
        r#"{"schema": "other/1", "results": [], "skipped": []}"#,
    )
    .unwrap();
    let not_json = temp("bad", "not-json.json");
    std::fs::write(&not_json, "tokens/s: 12").unwrap();
    let out_json = temp("bad", "never.json");
    let missing = temp("bad", "missing.json");
    // An input named another way (through `sub/..`) is not overwritten by
    // the merge.
    let sub = not_json.parent().unwrap().join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    let not_json_again = sub.join("..").join("not-json.json");
    let tiny = [
        "--family", "gpt", "--layers", "1", "--hidden", "32", "--heads", "2", "--vocab", "64",
    ];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--compare", s(&missing)], "missing.json"),
        (vec!["--compare", s(&bad_schema)], "bad-schema.json"),
        (vec!["--compare", s(&not_json)], "not-json.json"),
        (
            vec!["--compare", s(&not_json), "--json", s(&not_json_again)],
            "is also an input",
        ),
        (vec!["--layers", "1"], "--preset"),
        (
            vec!["--family", "gpt", "--hidden", "32", "--heads", "5"],
            "--family",
        ),
        ([&tiny[..], &["--seq", "0"]].concat(), "--seq"),
        (
            [&tiny[..], &["--backends", "metal"]].concat(),
            "--backends metal",
        ),
        (
            [&tiny[..], &["--backends", "rocm"]].concat(),
            "--backends rocm",
        ),
        (
            [&tiny[..], &["--device-type", "tpu"]].concat(),
            "--device-type",
        ),
        ([&tiny[..], &["--preset", "gpt-mini"]].concat(), "only one"),
        (
            [&tiny[..], &["--kernels", "fused", "--backends", "flex"]].concat(),
            "--kernels",
        ),
        (
            [&tiny[..], &["--compare", s(&bad_schema)]].concat(),
            "--compare",
        ),
        (
            vec!["--preset", "gpt-mini", "--json", "/nonexistent-dir/x.json"],
            "--json",
        ),
    ];
    for (args, needle) in cases {
        let mut all = vec!["bench", "train"];
        all.extend(&args);
        if !args.contains(&"--json") {
            all.extend(["--json", s(&out_json)]);
        }
        let out = ferrotron(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "{args:?}: one line: {stderr}"
        );
        assert!(
            stderr.contains(needle),
            "{args:?}: {stderr} should name {needle}"
        );
        assert!(!out_json.exists(), "{args:?} wrote {}", out_json.display());
    }
    let _ = std::fs::remove_dir_all(bad_schema.parent().unwrap());
}
