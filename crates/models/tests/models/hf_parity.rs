//! Numerical parity with Hugging Face `transformers` on the committed
//! fixtures of `scripts/make_hf_fixtures.py` (fp32, CPU): logits, loss,
//! gradients of every parameter, parameters after 3 AdamW steps, and greedy
//! generation, for GPT-2, Llama (GQA, untied, theta 500000; tied; with
//! Llama 3.1 `llama3` and with `linear` RoPE scaling) and BLOOM (ALiBi with
//! 6 heads).

#![cfg(feature = "flex")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use ferrotron_engine::checkpoint::{load_safetensors, FloatDtype};
use ferrotron_engine::data::Batch;
use ferrotron_engine::optim::{AdamWConfig, LrSchedule};
use ferrotron_engine::params::{load_named_tensors, named_tensors};
use ferrotron_models::hf::{convert_to_ours, load_hf_dir, save_hf_dir, ExportOptions, HfModel};
use ferrotron_models::ops::cross_entropy;
use ferrotron_models::{generate, Decoder, SamplingConfig};
use ferrotron_parallel::train::{StepConfig, Trainer};

type B = Autodiff<Flex>;

const FAMILIES: &[&str] = &[
    "gpt2",
    "llama",
    "llama_tied",
    "bloom",
    "llama3_scaled",
    "llama_linear",
];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

struct Case {
    hf: HfModel,
    ids: Vec<Vec<i64>>,
    expected: serde_json::Value,
    tensors: BTreeMap<String, TensorData>,
}

fn case(name: &str) -> Case {
    let dir = fixture(name);
    let hf = load_hf_dir(&dir.join("model")).unwrap();
    let ids: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("input_ids.json")).unwrap())
            .unwrap();
    let ids = serde_json::from_value(ids["input_ids"].clone()).unwrap();
    let expected =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let tensors = load_safetensors(&dir.join("expected.safetensors")).unwrap();
    Case {
        hf,
        ids,
        expected,
        tensors,
    }
}

/// The tensors under `prefix.` in the expected file, converted to our names.
fn ours_with_prefix(c: &Case, prefix: &str) -> BTreeMap<String, TensorData> {
    let hf = c
        .tensors
        .iter()
        .filter_map(|(n, d)| n.strip_prefix(prefix).map(|n| (n.to_string(), d.clone())))
        .collect();
    convert_to_ours(c.hf.family, &c.hf.config, hf, prefix).unwrap()
}

fn model(c: &Case) -> Decoder<B> {
    let m = Decoder::<B>::new(&c.hf.config, 0, &Default::default()).unwrap();
    load_named_tensors(m, c.hf.tensors.clone(), "fixture").unwrap()
}

fn ids_tensor(ids: &[Vec<i64>]) -> Tensor<B, 2, Int> {
    let flat: Vec<i64> = ids.iter().flatten().copied().collect();
    Tensor::from_data(
        TensorData::new(flat, [ids.len(), ids[0].len()]),
        &Default::default(),
    )
}

fn values(d: TensorData) -> Vec<f32> {
    d.convert::<f32>().to_vec().unwrap()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn max_abs(a: &[f32]) -> f32 {
    a.iter().map(|x| x.abs()).fold(0.0, f32::max)
}

/// Logits `[batch, seq, vocab]` and the mean next-token loss over `ids`.
fn logits_and_loss(m: &Decoder<B>, ids: &[Vec<i64>]) -> (Tensor<B, 3>, Tensor<B, 1>) {
    let t = ids[0].len();
    let tokens = ids_tensor(ids);
    let logits = m.forward(tokens.clone());
    let loss = cross_entropy(
        m.ops().cross_entropy_impl(),
        logits.clone().narrow(1, 0, t - 1),
        tokens.narrow(1, 1, t - 1),
    );
    (logits, loss)
}

#[test]
fn logits_and_loss_match_transformers() {
    for name in FAMILIES {
        let c = case(name);
        let m = model(&c);
        let (logits, loss) = logits_and_loss(&m, &c.ids);
        let err = max_abs_diff(
            &values(logits.into_data()),
            &values(c.tensors["logits"].clone()),
        );
        let loss: f32 = values(loss.into_data())[0];
        let loss_err = (loss as f64 - c.expected["loss"].as_f64().unwrap()).abs();
        println!("{name}: logits max abs error {err:.2e}, loss abs error {loss_err:.2e}");
        assert!(err <= 1e-4, "{name}: logits max abs error {err}");
        assert!(loss_err <= 1e-5, "{name}: loss abs error {loss_err}");
    }
}

/// Gradients of every float parameter by name.
struct Grads<'a, AB: AutodiffBackend> {
    path: Vec<String>,
    grads: &'a AB::Gradients,
    out: BTreeMap<String, TensorData>,
}

impl<AB: AutodiffBackend> ModuleVisitor<AB> for Grads<'_, AB> {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
        let g = param
            .val()
            .grad(self.grads)
            .expect("every parameter has a gradient");
        self.out.insert(self.path.join("."), g.into_data());
    }
}

/// The magnitude a gradient error is measured against: the gradient's own
/// largest magnitude, except for attention key biases. Their gradient is
/// zero in exact arithmetic (a key bias adds the same `q . b` to every score
/// of a query, and softmax ignores that), so both frameworks hold float
/// noise (~1e-9) there; they are measured against the largest gradient of
/// the fused Hugging Face bias they belong to (q, k and v biases of the layer).
fn grad_scale(want: &BTreeMap<String, TensorData>, param: &str) -> f32 {
    match param.strip_suffix("attn.k.bias") {
        None => max_abs(&values(want[param].clone())),
        Some(layer) => ["q", "k", "v"]
            .iter()
            .map(|p| max_abs(&values(want[&format!("{layer}attn.{p}.bias")].clone())))
            .fold(0.0, f32::max),
    }
}

#[test]
fn gradients_of_every_parameter_match_transformers() {
    for name in FAMILIES {
        let c = case(name);
        let m = model(&c);
        let (_, loss) = logits_and_loss(&m, &c.ids);
        let grads = loss.backward();
        let mut v = Grads::<B> {
            path: Vec::new(),
            grads: &grads,
            out: BTreeMap::new(),
        };
        m.visit(&mut v);
        let want = ours_with_prefix(&c, "grad.");
        assert_eq!(
            v.out.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>()
        );
        let mut worst = 0f32;
        for (param, w) in &want {
            let w = values(w.clone());
            let rel = max_abs_diff(&values(v.out[param].clone()), &w) / grad_scale(&want, param);
            worst = worst.max(rel);
            assert!(
                rel <= 1e-4,
                "{name}: gradient of {param}: relative error {rel}"
            );
        }
        println!("{name}: worst gradient max abs error / max magnitude {worst:.2e}");
    }
}

#[test]
fn three_adamw_steps_match_torch() {
    for name in FAMILIES {
        let c = case(name);
        let a = &c.expected["adamw"];
        let lr = a["lr"].as_f64().unwrap();
        let steps = a["steps"].as_u64().unwrap() as usize;
        let config = StepConfig {
            adamw: AdamWConfig {
                beta1: a["betas"][0].as_f64().unwrap(),
                beta2: a["betas"][1].as_f64().unwrap(),
                eps: a["eps"].as_f64().unwrap(),
                weight_decay: a["weight_decay"].as_f64().unwrap(),
            },
            schedule: LrSchedule {
                max_lr: lr,
                min_lr: lr,
                warmup_steps: 0,
                total_steps: steps,
            },
            grad_clip: 0.0,
        };
        let t = c.ids[0].len();
        let batch = Batch {
            inputs: c.ids.iter().flat_map(|r| r[..t - 1].to_vec()).collect(),
            targets: c.ids.iter().flat_map(|r| r[1..].to_vec()).collect(),
            batch: c.ids.len(),
            seq_len: t - 1,
        };
        let mut trainer = Trainer::new(model(&c), config, Default::default());
        for _ in 0..steps {
            trainer.step(std::slice::from_ref(&batch)).unwrap();
        }
        let got: BTreeMap<String, TensorData> =
            named_tensors(&trainer.full_model().unwrap().valid())
                .into_iter()
                .collect();
        let want = ours_with_prefix(&c, "adamw.");
        let mut worst = 0f32;
        for (param, w) in &want {
            let w = values(w.clone());
            if param.ends_with("attn.k.bias") {
                // Its gradient is zero in exact arithmetic (see `grad_scale`),
                // so Adam's normalised step follows float noise in both
                // frameworks; Adam moves a parameter by at most lr per step.
                let start = values(c.hf.tensors[param].clone());
                let moved = max_abs_diff(&values(got[param].clone()), &start);
                assert!(
                    moved <= 1.01 * (lr * steps as f64) as f32,
                    "{name}: {param} moved {moved}"
                );
                continue;
            }
            let rel = max_abs_diff(&values(got[param].clone()), &w) / max_abs(&w);
            worst = worst.max(rel);
            assert!(
                rel <= 1e-5,
                "{name}: {param} after {steps} AdamW steps: relative error {rel}"
            );
        }
        println!("{name}: worst parameter error after {steps} AdamW steps (relative to max magnitude) {worst:.2e}");
    }
}

#[test]
fn greedy_generation_matches_transformers_with_and_without_cache() {
    for name in FAMILIES {
        let c = case(name);
        let m = model(&c).valid();
        let prompt: Vec<u32> = serde_json::from_value(c.expected["prompt_ids"].clone()).unwrap();
        let want: Vec<u32> = serde_json::from_value(c.expected["greedy_ids"].clone()).unwrap();
        let greedy = SamplingConfig {
            temperature: 0.0,
            top_k: 0,
            seed: 0,
        };
        for cached in [true, false] {
            let got = generate(
                &m,
                &prompt,
                want.len(),
                &greedy,
                &[],
                cached,
                &Default::default(),
            );
            assert_eq!(got, want, "{name} (cache: {cached})");
        }
    }
}

#[test]
fn export_then_import_gives_back_the_same_tensors() {
    let dir = std::env::temp_dir().join(format!("ferrotron-hf-roundtrip-{}", std::process::id()));
    for name in FAMILIES {
        let c = case(name);
        let out = dir.join(name);
        let tensors: Vec<(String, TensorData)> = c.hf.tensors.clone().into_iter().collect();
        let options = ExportOptions {
            special: c.hf.special.clone(),
            ..ExportOptions::default()
        };
        save_hf_dir(
            &out,
            &c.hf.config,
            &tensors,
            c.hf.tokenizer.as_deref(),
            &options,
        )
        .unwrap();
        let back = load_hf_dir(&out).unwrap();
        assert_eq!(back.config, c.hf.config, "{name}");
        assert_eq!(back.tensors, c.hf.tensors, "{name}");
        assert_eq!(back.tokenizer.is_some(), c.hf.tokenizer.is_some(), "{name}");
        assert_eq!(back.special, c.hf.special, "{name}");
        assert_eq!(back.dtype, FloatDtype::F32, "{name}");
        // The written file holds exactly the tensors transformers saves.
        let mut written: Vec<String> = load_safetensors(&out.join("model.safetensors"))
            .unwrap()
            .into_keys()
            .collect();
        let mut original: Vec<String> =
            load_safetensors(&fixture(name).join("model/model.safetensors"))
                .unwrap()
                .into_keys()
                .collect();
        written.sort();
        original.sort();
        assert_eq!(written, original, "{name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sharded_exports_round_trip_and_bf16_ones_round_to_bf16() {
    let dir = std::env::temp_dir().join(format!("ferrotron-hf-shards-{}", std::process::id()));
    let c = case("llama3_scaled");
    let tensors: Vec<(String, TensorData)> = c.hf.tensors.clone().into_iter().collect();
    for (dtype, max_shard_size) in [(FloatDtype::F32, 8000), (FloatDtype::Bf16, 4000)] {
        let out = dir.join(format!("{dtype:?}"));
        let options = ExportOptions {
            dtype,
            max_shard_size,
            special: c.hf.special.clone(),
        };
        save_hf_dir(&out, &c.hf.config, &tensors, None, &options).unwrap();
        assert!(!out.join("model.safetensors").exists(), "{dtype:?}");
        let index: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out.join("model.safetensors.index.json")).unwrap(),
        )
        .unwrap();
        let files: std::collections::BTreeSet<&str> = index["weight_map"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_str().unwrap())
            .collect();
        let n = files.len();
        assert!(n > 2, "{dtype:?}: {n} shards");
        for (k, file) in files.iter().enumerate() {
            assert_eq!(*file, format!("model-{:05}-of-{n:05}.safetensors", k + 1));
            let bytes = std::fs::metadata(out.join(file)).unwrap().len();
            // Shard data stays under the limit (plus the small header); no
            // tensor of this model exceeds it on its own.
            assert!(bytes < max_shard_size + 2048, "{file}: {bytes} bytes");
        }
        let back = load_hf_dir(&out).unwrap();
        assert_eq!(back.config, c.hf.config);
        assert_eq!(back.dtype, dtype);
        for (name, want) in &c.hf.tensors {
            let (got, want) = (values(back.tensors[name].clone()), values(want.clone()));
            for (g, w) in got.iter().zip(&want) {
                // bf16 keeps 8 significant bits: rounding to nearest moves
                // a value by at most half an ulp, <= 2^-8 of its magnitude.
                let tol = if dtype == FloatDtype::Bf16 {
                    w.abs() * 2f32.powi(-8)
                } else {
                    0.0
                };
                assert!((g - w).abs() <= tol, "{dtype:?} {name}: {g} vs {w}");
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
