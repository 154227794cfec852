//! The streaming Hugging Face writer: its files equal, byte for byte, those
//! of the whole-model writer it replaced (every tensor converted into one
//! map, then split into shards; kept here as the reference), for every
//! family (GPT-2's fused `c_attn`, BLOOM's interleaved `query_key_value`,
//! Llama's separate projections), f32 and bf16, one file and several
//! shards; and it holds about one output shard and one tensor, never the
//! model.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::tensor::TensorData;
use ferrotron_engine::checkpoint::{save_safetensors_as, FloatDtype};
use ferrotron_models::hf::names::rules;
use ferrotron_models::hf::{
    export_order, load_hf_dir, stream_hf_dir, to_hf_config, ExportOptions, HfError,
};
use ferrotron_models::DecoderConfig;
use serde_json::{json, Map, Value};

use crate::common::thread_heap::peak_during;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
        .join("model")
}

fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("ferrotron-hf-stream-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The whole-model writer as it was: every Hugging Face tensor built in
/// one map, sorted by name, split greedily into shards of at most `max`
/// bytes (an oversized tensor alone), each shard written by
/// `save_safetensors_as`, and the index when there are several.
fn reference_weights(
    dir: &Path,
    config: &DecoderConfig,
    ours: &BTreeMap<String, TensorData>,
    dtype: FloatDtype,
    max: u64,
) {
    let family = to_hf_config(config).unwrap().0;
    let mut hf: BTreeMap<String, (Vec<usize>, Vec<f32>)> = BTreeMap::new();
    for rule in rules(family, config) {
        let values: Vec<f32> = ours[&rule.ours].to_vec().unwrap();
        let shape = rule.hf_shape();
        let entry = hf.entry(rule.hf.clone()).or_insert_with(|| {
            let n = shape.iter().product();
            (shape, vec![0.0; n])
        });
        for (i, v) in values.into_iter().enumerate() {
            entry.1[rule.hf_index(i)] = v;
        }
    }
    let tensors: Vec<(String, TensorData)> = hf
        .into_iter()
        .map(|(n, (s, v))| (n, TensorData::new(v, s)))
        .collect();
    let mut shards: Vec<Vec<(String, TensorData)>> = Vec::new();
    let mut current = 0u64;
    for (name, data) in tensors {
        let size = (data.num_elements() * dtype.size()) as u64;
        match shards.last_mut() {
            Some(last) if current + size <= max => {
                last.push((name, data));
                current += size;
            }
            _ => {
                shards.push(vec![(name, data)]);
                current = size;
            }
        }
    }
    std::fs::create_dir_all(dir).unwrap();
    let n = shards.len();
    if n == 1 {
        save_safetensors_as(&dir.join("model.safetensors"), &shards[0], dtype).unwrap();
        return;
    }
    let (mut map, mut total) = (Map::new(), 0u64);
    for (k, part) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{n:05}.safetensors", k + 1);
        for (name, data) in part {
            map.insert(name.clone(), json!(file));
            total += (data.num_elements() * dtype.size()) as u64;
        }
        save_safetensors_as(&dir.join(&file), part, dtype).unwrap();
    }
    let index = json!({"metadata": {"total_size": total}, "weight_map": Value::Object(map)});
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_string_pretty(&index).unwrap(),
    )
    .unwrap();
}

/// The weight files of `dir` (`model*.safetensors*`), name to bytes.
fn weight_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("model") && n.contains(".safetensors"))
        .map(|n| (n.clone(), std::fs::read(dir.join(&n)).unwrap()))
        .collect()
}

/// Streams `ours` out of an in-memory map, one clone per request.
fn stream(
    dir: &Path,
    config: &DecoderConfig,
    ours: &BTreeMap<String, TensorData>,
    options: &ExportOptions,
) -> u64 {
    let mut source = |name: &str| {
        ours.get(name)
            .cloned()
            .ok_or_else(|| HfError::NotExportable(format!("no '{name}'")))
    };
    stream_hf_dir(dir, config, &mut source, None, options).unwrap()
}

#[test]
fn streamed_exports_equal_the_whole_model_writer_byte_for_byte() {
    for name in ["gpt2", "bloom", "llama", "llama_tied"] {
        let hf = load_hf_dir(&fixture(name)).unwrap();
        for (dtype, max) in [
            (FloatDtype::F32, u64::MAX),
            (FloatDtype::F32, 3000),
            (FloatDtype::Bf16, 2000),
        ] {
            let (got, want) = (
                scratch(&format!("{name}-got")),
                scratch(&format!("{name}-want")),
            );
            let options = ExportOptions {
                dtype,
                max_shard_size: max,
                ..ExportOptions::default()
            };
            stream(&got, &hf.config, &hf.tensors, &options);
            reference_weights(&want, &hf.config, &hf.tensors, dtype, max);
            let (g, w) = (weight_files(&got), weight_files(&want));
            assert!(
                w.len() == 1 || w.len() > 3,
                "{name} {dtype:?}: {} files",
                w.len()
            );
            assert_eq!(g.keys().collect::<Vec<_>>(), w.keys().collect::<Vec<_>>());
            for (file, bytes) in &w {
                assert!(g[file] == *bytes, "{name} {dtype:?} {max}: {file} differs");
            }
            for d in [got, want] {
                std::fs::remove_dir_all(d).unwrap();
            }
        }
    }
}

#[test]
fn the_writer_asks_for_each_parameter_once_in_export_order() {
    let hf = load_hf_dir(&fixture("gpt2")).unwrap();
    let mut asked = Vec::new();
    let mut source = |name: &str| {
        asked.push(name.to_string());
        Ok(hf.tensors[name].clone())
    };
    let dir = scratch("order");
    stream_hf_dir(
        &dir,
        &hf.config,
        &mut source,
        None,
        &ExportOptions::default(),
    )
    .unwrap();
    let order: Vec<String> = export_order(&hf.config)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(asked, order);
    let mut sorted = asked.clone();
    sorted.sort();
    sorted.dedup();
    let mut all: Vec<&String> = hf.tensors.keys().collect();
    all.sort();
    assert_eq!(
        sorted.iter().collect::<Vec<_>>(),
        all,
        "every parameter, once"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// A GPT-2 of 8 layers at width 256 (about 25 MB of f32 weights, each
/// tensor at most 1 MiB) written in 2 MB shards holds at most one shard,
/// the tensor being built and one parameter, plus 256 KiB of bookkeeping:
/// under a fifth of the model.
#[test]
fn the_writer_holds_one_shard_and_one_tensor_not_the_model() {
    let mut config = load_hf_dir(&fixture("gpt2")).unwrap().config;
    config.hidden_size = 256;
    config.n_heads = 8;
    config.n_kv_heads = 8;
    config.ffn_size = 1024;
    config.n_layers = 8;
    config.vocab_size = 512;
    let ours: BTreeMap<String, TensorData> = export_order(&config)
        .unwrap()
        .into_iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let values: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            (name, TensorData::new(values, shape))
        })
        .collect();
    let model: usize = ours.values().map(|d| 4 * d.num_elements()).sum();
    let largest = ours.values().map(|d| 4 * d.num_elements()).max().unwrap();
    let max_shard = 2_000_000u64;
    let options = ExportOptions {
        max_shard_size: max_shard,
        ..ExportOptions::default()
    };
    let dir = scratch("memory");
    let (counted, heap) = peak_during(|| stream(&dir, &config, &ours, &options));
    let bound = max_shard as usize + 2 * largest + (256 << 10);
    assert!(model > 20_000_000, "the model is {model} bytes");
    assert!(heap <= bound, "peak heap {heap} bytes > {bound}");
    assert!(
        heap < model / 5,
        "peak heap {heap} bytes of a {model}-byte model"
    );
    assert!(
        counted as usize <= max_shard as usize + largest,
        "{counted}"
    );
    assert!(weight_files(&dir).len() > 10);
    std::fs::remove_dir_all(dir).unwrap();
}
