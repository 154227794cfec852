//! Reading a Hugging Face model directory into our parameter names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use burn::tensor::TensorData;
use ferrotron_engine::checkpoint::{load_safetensors_typed, FloatDtype};
use ferrotron_engine::data::Tokenizer;

use super::config::{from_hf_config, Family};
use super::generation::SpecialTokens;
use super::names::{is_ignored_buffer, rules};
use super::HfError;
use crate::config::DecoderConfig;

/// A Hugging Face model directory, read and converted to our layout.
#[derive(Clone, Debug)]
pub struct HfModel {
    /// The `transformers` family of `config.json`.
    pub family: Family,
    /// Our configuration equivalent to `config.json`.
    pub config: DecoderConfig,
    /// Every parameter under our name, in our layout (f32), ready for
    /// `ferrotron_engine::params::load_named_tensors`.
    pub tensors: BTreeMap<String, TensorData>,
    /// `tokenizer.json` of the directory, when there is one (its vocabulary
    /// is checked to fit `config.vocab_size`).
    pub tokenizer: Option<PathBuf>,
    /// The dtype the weights were stored in (f32 when they mix dtypes).
    pub dtype: FloatDtype,
    /// Begin- and end-of-sequence ids (`generation_config.json`, `config.json`
    /// or the tokenizer).
    pub special: SpecialTokens,
}

fn io(path: &Path, message: impl std::fmt::Display) -> HfError {
    HfError::Io {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

/// Every tensor of the directory's weights, by its name in the file(s).
///
/// Reads `model.safetensors`, or the shards listed in the `weight_map` of
/// `model.safetensors.index.json`. F32, F16 and BF16 are read as f32; the
/// dtype returned is the one all files share (f32 when they mix dtypes).
type Weights = (BTreeMap<String, TensorData>, String, FloatDtype);

fn read_weights(dir: &Path) -> Result<Weights, HfError> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        let (t, dtype) = load_safetensors_typed(&single).map_err(|e| io(&single, e))?;
        let dtype = dtype.unwrap_or(FloatDtype::F32);
        return Ok((t, single.display().to_string(), dtype));
    }
    let index = dir.join("model.safetensors.index.json");
    if !index.exists() {
        return Err(io(
            dir,
            "holds neither model.safetensors nor model.safetensors.index.json",
        ));
    }
    let text = std::fs::read_to_string(&index).map_err(|e| io(&index, e))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| io(&index, format!("not valid JSON: {e}")))?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| HfError::Field {
            path: index.display().to_string(),
            field: "weight_map".into(),
            problem: "is missing or not an object".into(),
        })?;
    let mut shards = BTreeSet::new();
    for (name, file) in map {
        let file = file.as_str().ok_or_else(|| HfError::Field {
            path: index.display().to_string(),
            field: format!("weight_map.{name}"),
            problem: "must be a file name".into(),
        })?;
        shards.insert(file.to_string());
    }
    let mut all = BTreeMap::new();
    let mut common: Option<Option<FloatDtype>> = None;
    for shard in shards {
        let path = dir.join(&shard);
        let (tensors, dtype) = load_safetensors_typed(&path).map_err(|e| io(&path, e))?;
        common = Some(match common {
            Some(c) if c != dtype => None,
            _ => dtype,
        });
        for (name, data) in tensors {
            if all.insert(name.clone(), data).is_some() {
                return Err(io(&path, format!("tensor '{name}' appears in two shards")));
            }
        }
    }
    let dtype = common.flatten().unwrap_or(FloatDtype::F32);
    Ok((all, dir.display().to_string(), dtype))
}

/// Converts tensors under Hugging Face names and layouts (as in a model
/// file: with or without the base-model prefix) to our names and layouts for
/// a model of `family` and shape `config`. Used for weights, and equally for
/// anything shaped like them (gradients, optimizer results).
///
/// # Errors
///
/// [`HfError::MissingTensor`], [`HfError::TensorShape`] and
/// [`HfError::UnexpectedTensors`] naming the Hugging Face tensor and `source`.
pub fn convert_to_ours(
    family: Family,
    config: &DecoderConfig,
    raw: BTreeMap<String, TensorData>,
    source: &str,
) -> Result<BTreeMap<String, TensorData>, HfError> {
    let source = source.to_string();
    let prefix = family.prefix();
    let mut hf: BTreeMap<String, TensorData> = BTreeMap::new();
    for (name, data) in raw {
        let full = if name.starts_with(prefix) || name == "lm_head.weight" {
            name
        } else {
            format!("{prefix}{name}")
        };
        if hf.insert(full.clone(), data).is_some() {
            return Err(io(
                Path::new(&source),
                format!("tensor '{full}' appears both with and without the '{prefix}' prefix"),
            ));
        }
    }
    if config.tied_head {
        hf.remove("lm_head.weight");
    }
    let mut used = BTreeSet::new();
    let mut tensors = BTreeMap::new();
    let mut cache: BTreeMap<String, Vec<f32>> = BTreeMap::new();
    for rule in rules(family, config) {
        let data = hf.get(&rule.hf).ok_or_else(|| HfError::MissingTensor {
            path: source.clone(),
            name: rule.hf.clone(),
        })?;
        let expected = rule.hf_shape();
        if data.shape.to_vec() != expected {
            return Err(HfError::TensorShape {
                path: source.clone(),
                name: rule.hf.clone(),
                found: data.shape.to_vec(),
                expected,
            });
        }
        if !cache.contains_key(&rule.hf) {
            let values = data
                .clone()
                .to_vec::<f32>()
                .map_err(|e| io(Path::new(&source), format!("tensor '{}': {e:?}", rule.hf)))?;
            cache.insert(rule.hf.clone(), values);
        }
        let values = &cache[&rule.hf];
        let n: usize = rule.shape.iter().product();
        let ours: Vec<f32> = (0..n).map(|i| values[rule.hf_index(i)]).collect();
        used.insert(rule.hf.clone());
        tensors.insert(rule.ours.clone(), TensorData::new(ours, rule.shape.clone()));
    }
    let unexpected: Vec<&str> = hf
        .keys()
        .filter(|n| !used.contains(*n) && !is_ignored_buffer(family, n))
        .map(String::as_str)
        .collect();
    if !unexpected.is_empty() {
        return Err(HfError::UnexpectedTensors {
            path: source,
            names: unexpected.join(", "),
        });
    }
    Ok(tensors)
}

/// Reads a Hugging Face model directory (`config.json`, weights, optional
/// `tokenizer.json`) and converts its tensors to our names and layouts.
///
/// Tensor names are accepted with and without the base-model prefix
/// (`transformer.` for GPT-2 and BLOOM, `model.` for Llama). A tied model
/// needs no `lm_head.weight` (one that is present is ignored); an untied one
/// needs it.
///
/// # Errors
///
/// The errors of [`from_hf_config`]; [`HfError::Io`] for unreadable files;
/// [`HfError::MissingTensor`], [`HfError::TensorShape`] and
/// [`HfError::UnexpectedTensors`] naming the Hugging Face tensor;
/// [`HfError::VocabMismatch`] if `tokenizer.json` has more ids than the
/// model's `vocab_size`.
pub fn load_hf_dir(dir: &Path) -> Result<HfModel, HfError> {
    let (family, config) = from_hf_config(&dir.join("config.json"))?;
    let (raw, source, dtype) = read_weights(dir)?;
    let tensors = convert_to_ours(family, &config, raw, &source)?;
    let tok_path = dir.join("tokenizer.json");
    let mut tok = None;
    let tokenizer = if tok_path.exists() {
        let t = tok.insert(Tokenizer::from_file(&tok_path).map_err(|e| io(&tok_path, e))?);
        let n = t.get_vocab_size(true);
        if n > config.vocab_size {
            return Err(HfError::VocabMismatch {
                path: tok_path.display().to_string(),
                tokenizer: n,
                model: config.vocab_size,
            });
        }
        Some(tok_path)
    } else {
        None
    };
    let special = SpecialTokens::read_dir(dir, tok.as_ref())?;
    Ok(HfModel {
        family,
        config,
        tensors,
        tokenizer,
        dtype,
        special,
    })
}
