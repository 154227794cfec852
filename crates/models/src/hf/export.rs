//! Writing our parameters as a Hugging Face model directory.

use std::collections::BTreeMap;
use std::path::Path;

use burn::tensor::TensorData;
use ferrotron_engine::checkpoint::{write_atomic, FloatDtype};
use serde_json::json;

use super::config::to_hf_config;
use super::generation::SpecialTokens;
use super::names::rules;
use super::shards::{write_shards, DEFAULT_MAX_SHARD_SIZE};
use super::HfError;
use crate::config::DecoderConfig;

fn io(path: &Path, message: impl std::fmt::Display) -> HfError {
    HfError::Io {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

/// How [`save_hf_dir`] writes the weights and what it states besides them.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportOptions {
    /// Storage dtype of the weights (also `torch_dtype` in `config.json`).
    pub dtype: FloatDtype,
    /// Largest shard, in bytes of tensor data (see `shards`).
    pub max_shard_size: u64,
    /// Written to `generation_config.json`.
    pub special: SpecialTokens,
}

impl Default for ExportOptions {
    /// f32, 5 GB shards, no special ids.
    fn default() -> Self {
        Self {
            dtype: FloatDtype::F32,
            max_shard_size: DEFAULT_MAX_SHARD_SIZE,
            special: SpecialTokens::default(),
        }
    }
}

/// Writes `config.json`, `generation_config.json`, the weights (Hugging Face
/// names and layouts, `options.dtype`, one `model.safetensors` or shards with
/// `model.safetensors.index.json`) and, when given, a copy of `tokenizer` as
/// `tokenizer.json` into `dir` (created if missing), so that `transformers`'
/// `AutoModelForCausalLM.from_pretrained(dir)` loads the model.
///
/// `tensors` are our named parameters (`ferrotron_engine::params::named_tensors`).
/// A tied head is written once, as the embedding (`transformers` ties
/// `lm_head` to it, as `save_pretrained` does).
///
/// # Errors
///
/// [`HfError::NotExportable`] if `config` matches no family or a parameter
/// is missing or mis-shaped; [`HfError::Io`] if a file cannot be written.
pub fn save_hf_dir(
    dir: &Path,
    config: &DecoderConfig,
    tensors: &[(String, TensorData)],
    tokenizer: Option<&Path>,
    options: &ExportOptions,
) -> Result<(), HfError> {
    let (family, mut json) = to_hf_config(config)?;
    json["torch_dtype"] = json!(options.dtype.torch_name());
    json["dtype"] = json!(options.dtype.torch_name());
    let ours: BTreeMap<&str, &TensorData> = tensors.iter().map(|(n, d)| (n.as_str(), d)).collect();
    let mut hf: BTreeMap<String, (Vec<usize>, Vec<f32>)> = BTreeMap::new();
    for rule in rules(family, config) {
        let data = ours.get(rule.ours.as_str()).ok_or_else(|| {
            HfError::NotExportable(format!("parameter '{}' is missing", rule.ours))
        })?;
        if data.shape.to_vec() != rule.shape {
            return Err(HfError::NotExportable(format!(
                "parameter '{}' has shape {:?}, the config implies {:?}",
                rule.ours,
                data.shape.to_vec(),
                rule.shape
            )));
        }
        let values: Vec<f32> = (*data)
            .clone()
            .convert::<f32>()
            .to_vec()
            .map_err(|e| HfError::NotExportable(format!("parameter '{}': {e:?}", rule.ours)))?;
        let shape = rule.hf_shape();
        let entry = hf.entry(rule.hf.clone()).or_insert_with(|| {
            let n = shape.iter().product();
            (shape, vec![0.0; n])
        });
        for (i, v) in values.into_iter().enumerate() {
            entry.1[rule.hf_index(i)] = v;
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let text = serde_json::to_string_pretty(&json).expect("a JSON value serialises");
    let config_path = dir.join("config.json");
    write_atomic(&config_path, text.as_bytes()).map_err(|e| io(&config_path, e))?;
    let named: Vec<(String, TensorData)> = hf
        .into_iter()
        .map(|(name, (shape, values))| (name, TensorData::new(values, shape)))
        .collect();
    write_shards(dir, &named, options.dtype, options.max_shard_size)?;
    let generation = dir.join("generation_config.json");
    let text = serde_json::to_string_pretty(&options.special.generation_config())
        .expect("a JSON value serialises");
    write_atomic(&generation, text.as_bytes()).map_err(|e| io(&generation, e))?;
    if let Some(tok) = tokenizer {
        let bytes = std::fs::read(tok).map_err(|e| io(tok, e))?;
        let dest = dir.join("tokenizer.json");
        write_atomic(&dest, &bytes).map_err(|e| io(&dest, e))?;
    }
    Ok(())
}
