//! Writing our parameters as a Hugging Face model directory.

use std::collections::BTreeMap;
use std::path::Path;

use burn::tensor::TensorData;
use ferrotron_engine::checkpoint::{write_atomic, FloatDtype};
use serde_json::json;

use super::config::to_hf_config;
use super::generation::SpecialTokens;
use super::shards::DEFAULT_MAX_SHARD_SIZE;
use super::stream::{export_order, write_weights};
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
/// `lm_head` to it, as `save_pretrained` does). The weights are written as
/// [`stream_hf_dir`] writes them.
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
    let ours: BTreeMap<&str, &TensorData> = tensors.iter().map(|(n, d)| (n.as_str(), d)).collect();
    for (name, shape) in export_order(config)? {
        let data = ours
            .get(name.as_str())
            .ok_or_else(|| HfError::NotExportable(format!("parameter '{name}' is missing")))?;
        if data.shape.to_vec() != shape {
            return Err(HfError::NotExportable(format!(
                "parameter '{name}' has shape {:?}, the config implies {shape:?}",
                data.shape.to_vec()
            )));
        }
    }
    let mut source = |name: &str| {
        ours.get(name)
            .map(|d| (*d).clone())
            .ok_or_else(|| HfError::NotExportable(format!("parameter '{name}' is missing")))
    };
    stream_hf_dir(dir, config, &mut source, tokenizer, options).map(|_| ())
}

/// [`save_hf_dir`] with the parameters handed over one at a time by
/// `source` (called once per parameter of ours, by name, in
/// [`export_order`]), so that no more than one
/// output shard and one tensor are held: a sharded checkpoint or a gather
/// per tensor across ranks feeds it. Returns the most bytes of tensor data
/// the writer held at once.
///
/// # Errors
///
/// As [`save_hf_dir`], and whatever `source` returns.
pub fn stream_hf_dir(
    dir: &Path,
    config: &DecoderConfig,
    source: &mut dyn FnMut(&str) -> Result<TensorData, HfError>,
    tokenizer: Option<&Path>,
    options: &ExportOptions,
) -> Result<u64, HfError> {
    let (family, mut json) = to_hf_config(config)?;
    json["torch_dtype"] = json!(options.dtype.torch_name());
    json["dtype"] = json!(options.dtype.torch_name());
    let special = options.special.generation_config();
    for key in ["bos_token_id", "eos_token_id"] {
        json[key] = special[key].clone();
    }
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let text = serde_json::to_string_pretty(&json).expect("a JSON value serialises");
    let config_path = dir.join("config.json");
    write_atomic(&config_path, text.as_bytes()).map_err(|e| io(&config_path, e))?;
    let peak = write_weights(
        dir,
        family,
        config,
        source,
        options.dtype,
        options.max_shard_size,
    )?;
    let generation = dir.join("generation_config.json");
    let text = serde_json::to_string_pretty(&special).expect("a JSON value serialises");
    write_atomic(&generation, text.as_bytes()).map_err(|e| io(&generation, e))?;
    if let Some(tok) = tokenizer {
        let bytes = std::fs::read(tok).map_err(|e| io(tok, e))?;
        let dest = dir.join("tokenizer.json");
        write_atomic(&dest, &bytes).map_err(|e| io(&dest, e))?;
    }
    Ok(peak)
}
