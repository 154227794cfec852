//! `ferrotron eval`, `generate` and `export` on Hugging Face model
//! directories (the committed fixtures of `scripts/make_hf_fixtures.py`),
//! `train --hf-dir` on one rank (the same job under tp2 x pp2 equals it:
//! the facade's `hf_dir`), and their one-line errors with exit code 2 on
//! bad input.

use std::path::{Path, PathBuf};

use crate::common::{ferrotron, scratch};
use crate::mpirun;

use burn::tensor::TensorData;
use ferrotron_engine::checkpoint::{load_safetensors, save_safetensors};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures/hf")
        .join(name)
}

fn expected(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fixture(name).join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ok_stdout(args: &[&str]) -> String {
    let o = ferrotron(args);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// The fixture's greedy prompt as a `--prompt-ids` value (`1,2,3`).
fn prompt_ids(expected: &serde_json::Value) -> String {
    let ids: Vec<String> = expected["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.to_string())
        .collect();
    ids.join(",")
}

/// Every fixture's name (one folder each).
fn fixtures() -> Vec<String> {
    let root = fixture("");
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert!(names.len() >= 6, "{names:?}");
    names
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn eval_prints_the_loss_of_transformers_and_writes_logits() {
    let dir = scratch("eval");
    for name in fixtures() {
        let name = name.as_str();
        let f = fixture(name);
        let logits = dir.join(format!("{name}.safetensors"));
        let out = ok_stdout(&[
            "eval",
            "--hf-dir",
            s(&f.join("model")),
            "--tokens",
            s(&f.join("input_ids.json")),
            "--logits-out",
            s(&logits),
        ]);
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        let e = expected(name);
        let err = (v["loss"].as_f64().unwrap() - e["loss"].as_f64().unwrap()).abs();
        assert!(err <= 1e-5, "{name}: loss error {err}");
        assert_eq!(v["tokens"], e["tokens"], "{name}");
        let ours = &load_safetensors(&logits).unwrap()["logits"];
        let theirs = &load_safetensors(&f.join("expected.safetensors")).unwrap()["logits"];
        assert_eq!(ours.shape, theirs.shape);
        let (a, b) = (
            ours.to_vec::<f32>().unwrap(),
            theirs.to_vec::<f32>().unwrap(),
        );
        let max = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        assert!(max <= 1e-4, "{name}: logits error {max}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn greedy_generate_prints_the_token_ids_of_transformers() {
    for name in ["gpt2", "llama", "bloom", "llama3_scaled", "llama_linear"] {
        let e = expected(name);
        let prompt = prompt_ids(&e);
        let out = ok_stdout(&[
            "generate",
            "--hf-dir",
            s(&fixture(name).join("model")),
            "--prompt-ids",
            &prompt,
            "--max-new-tokens",
            "16",
            "--greedy",
        ]);
        let got: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(got, e["greedy_ids"], "{name}");
    }
    // With a tokenizer, a text prompt prints text.
    let out = ok_stdout(&[
        "generate",
        "--hf-dir",
        s(&fixture("gpt2").join("model")),
        "--prompt",
        "the king",
        "--max-new-tokens",
        "3",
        "--greedy",
    ]);
    assert!(out.starts_with("the king"), "{out}");
}

#[test]
fn an_export_evaluates_to_the_same_loss_and_is_a_new_directory() {
    let dir = scratch("export");
    for name in ["gpt2", "llama", "bloom"] {
        let f = fixture(name);
        let out = dir.join(name);
        ok_stdout(&["export", "--hf-dir", s(&f.join("model")), "--out", s(&out)]);
        let tokens = f.join("input_ids.json");
        let a = ok_stdout(&[
            "eval",
            "--hf-dir",
            s(&f.join("model")),
            "--tokens",
            s(&tokens),
        ]);
        let b = ok_stdout(&["eval", "--hf-dir", s(&out), "--tokens", s(&tokens)]);
        assert_eq!(a, b, "{name}");
        let o = ferrotron(&["export", "--hf-dir", s(&f.join("model")), "--out", s(&out)]);
        assert_eq!(o.status.code(), Some(2), "an export never overwrites");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn generate_stops_at_the_eos_of_generation_config_unless_told_not_to() {
    let dir = scratch("eos");
    let e = expected("llama");
    let want: Vec<u32> = serde_json::from_value(e["greedy_ids"].clone()).unwrap();
    let eos = want[5];
    let first = want.iter().position(|&t| t == eos).unwrap();
    let m = broken_copy(&dir, "llama");
    std::fs::write(
        m.join("generation_config.json"),
        format!(r#"{{"bos_token_id": 0, "eos_token_id": [{eos}, 95]}}"#),
    )
    .unwrap();
    let prompt = prompt_ids(&e);
    let run = |extra: &[&str]| -> Vec<u32> {
        let mut args = vec![
            "generate",
            "--hf-dir",
            s(&m),
            "--prompt-ids",
            &prompt,
            "--max-new-tokens",
            "16",
            "--greedy",
        ];
        args.extend_from_slice(extra);
        serde_json::from_str(ok_stdout(&args).trim()).unwrap()
    };
    assert_eq!(run(&[]), want[..=first]);
    assert_eq!(run(&["--ignore-eos"]), want);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_bf16_sharded_export_reimports_within_bf16_tolerance() {
    let dir = scratch("bf16");
    let f = fixture("llama3_scaled");
    let (out, again) = (dir.join("bf16"), dir.join("again"));
    let model = f.join("model");
    ok_stdout(&[
        "export",
        "--hf-dir",
        s(&model),
        "--out",
        s(&out),
        "--dtype",
        "bf16",
        "--max-shard-size",
        "4KB",
    ]);
    let index = std::fs::read_to_string(out.join("model.safetensors.index.json")).unwrap();
    assert!(index.contains("model-00001-of-0000"), "{index}");
    assert!(!out.join("model.safetensors").exists());
    let config = std::fs::read_to_string(out.join("config.json")).unwrap();
    assert!(config.contains(r#""torch_dtype": "bfloat16""#), "{config}");
    assert!(config.contains(r#""rope_type": "llama3""#), "{config}");
    let generation = std::fs::read_to_string(out.join("generation_config.json")).unwrap();
    assert!(generation.contains(r#""bos_token_id": 0"#), "{generation}");
    let tokens = f.join("input_ids.json");
    let loss = |d: &Path| -> f64 {
        let out = ok_stdout(&["eval", "--hf-dir", s(d), "--tokens", s(&tokens)]);
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        v["loss"].as_f64().unwrap()
    };
    let (full, half) = (loss(&model), loss(&out));
    assert!((full - half).abs() < 2e-2, "f32 {full} vs bf16 {half}");
    assert_ne!(full, half, "the weights were rounded to bf16");
    // A re-export keeps the dtype it was loaded in and fits in one file.
    ok_stdout(&["export", "--hf-dir", s(&out), "--out", s(&again)]);
    assert!(again.join("model.safetensors").is_file());
    let config = std::fs::read_to_string(again.join("config.json")).unwrap();
    assert!(config.contains(r#""torch_dtype": "bfloat16""#), "{config}");
    assert_eq!(loss(&again), half);
    let o = ferrotron(&[
        "export",
        "--hf-dir",
        s(&model),
        "--out",
        s(&dir.join("bad")),
        "--max-shard-size",
        "5 parsecs",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--max-shard-size"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A copy of fixture `name`'s model directory, for breaking.
fn broken_copy(dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    std::fs::create_dir_all(&out).unwrap();
    for entry in std::fs::read_dir(fixture(name).join("model")).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, out.join(p.file_name().unwrap())).unwrap();
    }
    out
}

fn edit_config(model: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = model.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
}

fn edit_weights(model: &Path, edit: impl FnOnce(&mut Vec<(String, TensorData)>)) {
    let path = model.join("model.safetensors");
    let mut t: Vec<(String, TensorData)> = load_safetensors(&path).unwrap().into_iter().collect();
    edit(&mut t);
    save_safetensors(&path, &t).unwrap();
}

/// Exit code 2 and a one-line error containing every needle, for `eval`.
fn assert_rejected(model: &Path, needles: &[&str]) {
    let tokens = fixture("gpt2").join("input_ids.json");
    let o = ferrotron(&["eval", "--hf-dir", s(model), "--tokens", s(&tokens)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    for n in needles {
        assert!(err.contains(n), "'{err}' lacks '{n}'");
    }
}

#[test]
fn bad_model_directories_are_one_line_errors_naming_the_field_or_tensor() {
    let dir = scratch("bad");
    let m = broken_copy(&dir.join("arch"), "llama");
    edit_config(&m, |v| {
        v["architectures"] = serde_json::json!(["MistralForCausalLM"])
    });
    assert_rejected(&m, &["MistralForCausalLM", "LlamaForCausalLM"]);

    let m = broken_copy(&dir.join("scaling"), "llama");
    edit_config(&m, |v| {
        v["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 8.0})
    });
    assert_rejected(&m, &["rope_scaling.rope_type", "'yarn'", "llama3"]);
    edit_config(&m, |v| {
        v["rope_scaling"] = serde_json::json!({"rope_type": "dynamic", "factor": 2.0})
    });
    assert_rejected(
        &m,
        &["rope_scaling.rope_type", "dynamic", "not implemented"],
    );

    let m = broken_copy(&dir.join("missing"), "llama");
    edit_weights(&m, |t| {
        t.retain(|(n, _)| n != "model.layers.1.mlp.up_proj.weight")
    });
    assert_rejected(&m, &["model.layers.1.mlp.up_proj.weight", "missing"]);

    let m = broken_copy(&dir.join("untied"), "llama");
    edit_weights(&m, |t| t.retain(|(n, _)| n != "lm_head.weight"));
    assert_rejected(&m, &["lm_head.weight", "missing"]);

    let m = broken_copy(&dir.join("shape"), "bloom");
    edit_weights(&m, |t| {
        for (n, d) in t.iter_mut() {
            if n == "transformer.h.0.self_attention.query_key_value.weight" {
                let v: Vec<f32> = d.to_vec().unwrap();
                *d = TensorData::new(v[..v.len() / 2].to_vec(), [d.shape[0] / 2, d.shape[1]]);
            }
        }
    });
    assert_rejected(
        &m,
        &[
            "transformer.h.0.self_attention.query_key_value.weight",
            "shape",
        ],
    );

    let m = broken_copy(&dir.join("extra"), "gpt2");
    edit_weights(&m, |t| {
        t.push((
            "transformer.h.0.attn.rotary.weight".into(),
            TensorData::new(vec![0f32; 2], [2]),
        ))
    });
    assert_rejected(&m, &["unexpected", "transformer.h.0.attn.rotary.weight"]);

    let m = broken_copy(&dir.join("vocab"), "gpt2");
    let tok_path = m.join("tokenizer.json");
    let mut tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&tok_path).unwrap()).unwrap();
    let vocab = tok["model"]["vocab"].as_object_mut().unwrap();
    for i in 0..200 {
        let id = vocab.len();
        vocab.insert(format!("w{i}"), serde_json::json!(id));
    }
    std::fs::write(&tok_path, tok.to_string()).unwrap();
    assert_rejected(&m, &["tokenizer.json", "vocab"]);

    // Exactly one model source.
    let o = ferrotron(&["eval", "--tokens", "x.json"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--hf-dir"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_token_files_are_one_line_errors() {
    let dir = scratch("tokens");
    let model = fixture("gpt2").join("model");
    for (body, needle) in [
        (r#"{"ids": [[1, 2]]}"#, "input_ids"),
        (r#"{"input_ids": [[1, 2, 3], [1, 2]]}"#, "row 1"),
        (r#"{"input_ids": [[1, 2, 500]]}"#, "500"),
    ] {
        let f = dir.join("t.json");
        std::fs::write(&f, body).unwrap();
        let o = ferrotron(&["eval", "--hf-dir", s(&model), "--tokens", s(&f)]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(needle) && err.contains("t.json"), "{err}");
    }
    let o = ferrotron(&["generate", "--hf-dir", s(&model), "--prompt-ids", "1,999"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("999"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn train_from_an_hf_dir_writes_an_hf_dir_equal_to_the_exported_run() {
    let dir = scratch("train");
    let corpus = dir.join("corpus.txt");
    let text = "the king of love and the queen , my lord .\n".repeat(200);
    std::fs::write(&corpus, text).unwrap();
    let (run, hf_out, exported) = (dir.join("run"), dir.join("hf"), dir.join("exported"));
    // The gpt2 fixture with an end-of-sequence list beside its bos.
    let model = dir.join("model");
    crate::common::copy_dir(&fixture("gpt2").join("model"), &model);
    std::fs::write(
        model.join("generation_config.json"),
        r#"{"bos_token_id": 1, "eos_token_id": [17, 18]}"#,
    )
    .unwrap();
    let train_args = |out: &Path, hf_out: &Path| -> Vec<String> {
        [
            "--hf-dir",
            s(&model),
            "--corpus",
            s(&corpus),
            "--steps",
            "2",
            "--seq-len",
            "16",
            "--micro-batch",
            "2",
            "--eval-every",
            "2",
            "--eval-batches",
            "1",
            "--sample-tokens",
            "0",
            "--peak-tflops",
            "1",
            "--out",
            s(out),
            "--hf-out",
            s(hf_out),
        ]
        .map(String::from)
        .to_vec()
    };
    mpirun::run("--hf-dir one rank", 1, train_args(&run, &hf_out), &[]);
    ok_stdout(&["export", "--run", s(&run), "--out", s(&exported)]);
    let tokens = fixture("gpt2").join("input_ids.json");
    let trained = ok_stdout(&["eval", "--hf-dir", s(&hf_out), "--tokens", s(&tokens)]);
    let from_run = ok_stdout(&["eval", "--run", s(&run), "--tokens", s(&tokens)]);
    let from_export = ok_stdout(&["eval", "--hf-dir", s(&exported), "--tokens", s(&tokens)]);
    let start = ok_stdout(&["eval", "--hf-dir", s(&model), "--tokens", s(&tokens)]);
    assert_eq!(trained, from_run);
    assert_eq!(trained, from_export);
    assert_ne!(trained, start, "training changed the weights");
    assert!(hf_out.join("tokenizer.json").is_file());
    // The --hf-dir model's special ids are carried over, by the run's
    // export and by `export --run` alike, into both JSON files.
    let json = |dir: &Path, file: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap()
    };
    let want = serde_json::json!({"bos_token_id": 1, "eos_token_id": [17, 18]});
    for out in [&hf_out, &exported] {
        assert_eq!(
            json(out, "generation_config.json"),
            want,
            "{}",
            out.display()
        );
        let config = json(out, "config.json");
        for key in ["bos_token_id", "eos_token_id"] {
            assert_eq!(config[key], want[key], "{}: {key}", out.display());
        }
    }

    // A config with no Hugging Face family is refused before training.
    let o = ferrotron(&[
        "train",
        "--model",
        "gpt-mini",
        "--hf-out",
        s(&hf_out),
        "--out",
        s(&dir.join("run2")),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--hf-out"));
    std::fs::remove_dir_all(&dir).unwrap();
}
