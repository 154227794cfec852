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

pub(super) fn io(path: &Path, message: impl std::fmt::Display) -> HfError {
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
    let (files, source) = weight_files(dir)?;
    let mut all = BTreeMap::new();
    let mut common: Option<Option<FloatDtype>> = None;
    for path in files {
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
    Ok((all, source, dtype))
}

/// The weight files of a model directory: `model.safetensors`, or the
/// shards the `weight_map` of `model.safetensors.index.json` lists (each
/// once, sorted); and the name errors about the weights give (the file, or
/// the directory for shards).
pub(super) fn weight_files(dir: &Path) -> Result<(Vec<PathBuf>, String), HfError> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        let source = single.display().to_string();
        return Ok((vec![single], source));
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
    let files = shards.into_iter().map(|f| dir.join(f)).collect();
    Ok((files, dir.display().to_string()))
}

/// The Hugging Face tensors a model of `family` and shape `config` reads,
/// found among `found` (the files' tensor names, with or without the
/// base-model prefix, and their shapes): each rule's full Hugging Face
/// name to the name in the file. A tied model's `lm_head.weight` is not
/// needed (and ignored when present).
///
/// # Errors
/// A name present with and without the prefix; [`HfError::MissingTensor`],
/// [`HfError::TensorShape`] and [`HfError::UnexpectedTensors`] naming the
/// Hugging Face tensor and `source`.
pub(super) fn match_names(
    family: Family,
    config: &DecoderConfig,
    found: BTreeMap<String, Vec<usize>>,
    source: &str,
) -> Result<BTreeMap<String, String>, HfError> {
    let prefix = family.prefix();
    let mut hf: BTreeMap<String, (String, Vec<usize>)> = BTreeMap::new();
    for (name, shape) in found {
        let full = if name.starts_with(prefix) || name == "lm_head.weight" {
            name.clone()
        } else {
            format!("{prefix}{name}")
        };
        if hf.insert(full.clone(), (name, shape)).is_some() {
            return Err(io(
                Path::new(source),
                format!("tensor '{full}' appears both with and without the '{prefix}' prefix"),
            ));
        }
    }
    if config.tied_head {
        hf.remove("lm_head.weight");
    }
    let mut used = BTreeMap::new();
    for rule in rules(family, config) {
        let (name, shape) = hf.get(&rule.hf).ok_or_else(|| HfError::MissingTensor {
            path: source.to_string(),
            name: rule.hf.clone(),
        })?;
        let expected = rule.hf_shape();
        if *shape != expected {
            return Err(HfError::TensorShape {
                path: source.to_string(),
                name: rule.hf.clone(),
                found: shape.clone(),
                expected,
            });
        }
        used.insert(rule.hf.clone(), name.clone());
    }
    let unexpected: Vec<&str> = hf
        .keys()
        .filter(|n| !used.contains_key(*n) && !is_ignored_buffer(family, n))
        .map(String::as_str)
        .collect();
    if !unexpected.is_empty() {
        return Err(HfError::UnexpectedTensors {
            path: source.to_string(),
            names: unexpected.join(", "),
        });
    }
    Ok(used)
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
    mut raw: BTreeMap<String, TensorData>,
    source: &str,
) -> Result<BTreeMap<String, TensorData>, HfError> {
    let found = raw
        .iter()
        .map(|(n, d)| (n.clone(), d.shape.to_vec()))
        .collect();
    let names = match_names(family, config, found, source)?;
    let mut tensors = BTreeMap::new();
    let mut cache: BTreeMap<String, Vec<f32>> = BTreeMap::new();
    for rule in rules(family, config) {
        if !cache.contains_key(&rule.hf) {
            let data = raw.remove(&names[&rule.hf]).expect("matched once");
            let values = data
                .to_vec::<f32>()
                .map_err(|e| io(Path::new(source), format!("tensor '{}': {e:?}", rule.hf)))?;
            cache.insert(rule.hf.clone(), values);
        }
        let values = &cache[&rule.hf];
        let n: usize = rule.shape.iter().product();
        let ours: Vec<f32> = (0..n).map(|i| values[rule.hf_index(i)]).collect();
        tensors.insert(rule.ours.clone(), TensorData::new(ours, rule.shape.clone()));
    }
    Ok(tensors)
}

/// A Hugging Face model directory without its weights' values: what a
/// run needs besides the weights, read after checking that the weights
/// hold every tensor the config implies, in its shape (only the files'
/// headers are read).
#[derive(Clone, Debug)]
pub struct HfDir {
    /// The `transformers` family of `config.json`.
    pub family: Family,
    /// Our configuration equivalent to `config.json`.
    pub config: DecoderConfig,
    /// `tokenizer.json` of the directory, when there is one (its vocabulary
    /// is checked to fit `config.vocab_size`).
    pub tokenizer: Option<PathBuf>,
    /// Begin- and end-of-sequence ids (`generation_config.json`, `config.json`
    /// or the tokenizer).
    pub special: SpecialTokens,
}

/// Reads a Hugging Face model directory's `config.json`, optional
/// `tokenizer.json` and special tokens, and checks its weights' names and
/// shapes (memory-mapped headers; no value is read): the errors of
/// [`load_hf_dir`] without reading the weights, so that a run can refuse a
/// bad directory before it writes anything and later read only its part
/// ([`super::slice::load_hf_part`]).
///
/// # Errors
/// As [`load_hf_dir`].
pub fn read_hf_dir(dir: &Path) -> Result<HfDir, HfError> {
    let (family, config) = from_hf_config(&dir.join("config.json"))?;
    super::slice::Mapped::open(dir)?.match_names(family, &config)?;
    let (tokenizer, special) = tokenizer_and_special(dir, &config)?;
    Ok(HfDir {
        family,
        config,
        tokenizer,
        special,
    })
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
    let (tokenizer, special) = tokenizer_and_special(dir, &config)?;
    Ok(HfModel {
        family,
        config,
        tensors,
        tokenizer,
        dtype,
        special,
    })
}

/// The directory's `tokenizer.json` (checked to fit `config`'s
/// vocabulary), if any, and its special tokens.
fn tokenizer_and_special(
    dir: &Path,
    config: &DecoderConfig,
) -> Result<(Option<PathBuf>, SpecialTokens), HfError> {
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
    Ok((tokenizer, special))
}
