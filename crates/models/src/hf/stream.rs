//! Writing the weights of a Hugging Face directory tensor by tensor.
//!
//! Every Hugging Face tensor's name and shape follow from the config alone
//! ([`rules`]), so the shards are planned before any value is read: tensors
//! sorted by name, filled in order as [`super::shards`] describes. Each
//! Hugging Face tensor is then built from the parameters of ours that live
//! in it, asked for one at a time from a source (a fused GPT-2 `c_attn` or
//! BLOOM `query_key_value` holds the three of q, k, v: only it is held while
//! they arrive), encoded and appended to the current shard; the shard is
//! written (temporary file, `fsync`, rename) as soon as its last tensor is
//! in, and `model.safetensors.index.json` last. At any time the writer
//! holds one output shard's bytes, the tensor being built and the one
//! parameter being scattered into it.

use std::path::Path;

use burn::tensor::TensorData;
use ferrotron_engine::checkpoint::{write_atomic, FloatDtype};
use safetensors::tensor::TensorView;
use serde_json::{json, Map, Value};

use super::config::Family;
use super::names::{rules, Rule};
use super::shards::plan;
use super::HfError;
use crate::config::DecoderConfig;

/// One Hugging Face tensor: its name, shape, and the rules of ours in it.
struct HfTensor {
    name: String,
    shape: Vec<usize>,
    parts: Vec<Rule>,
}

/// The Hugging Face tensors of `config`, sorted by name.
fn hf_tensors(family: Family, config: &DecoderConfig) -> Vec<HfTensor> {
    let mut out: Vec<HfTensor> = Vec::new();
    let mut all = rules(family, config);
    all.sort_by(|a, b| a.hf.cmp(&b.hf));
    for rule in all {
        match out.last_mut() {
            Some(t) if t.name == rule.hf => t.parts.push(rule),
            _ => out.push(HfTensor {
                name: rule.hf.clone(),
                shape: rule.hf_shape(),
                parts: vec![rule],
            }),
        }
    }
    out
}

/// Our parameters (name, shape) in the order [`write_weights`] asks its
/// source for them. A caller whose source is a collective (every rank
/// gathers each tensor in turn) runs the same sequence on the other ranks.
///
/// # Errors
///
/// [`HfError::NotExportable`] if `config` matches no family.
pub fn export_order(config: &DecoderConfig) -> Result<Vec<(String, Vec<usize>)>, HfError> {
    let family = super::config::to_hf_config(config)?.0;
    Ok(hf_tensors(family, config)
        .into_iter()
        .flat_map(|t| t.parts.into_iter().map(|r| (r.ours, r.shape)))
        .collect())
}

/// Builds Hugging Face tensor `t` (`[numel]` f32, in its layout) from the
/// parameters `source` hands over one at a time.
fn build(
    t: &HfTensor,
    source: &mut dyn FnMut(&str) -> Result<TensorData, HfError>,
) -> Result<Vec<f32>, HfError> {
    let mut out = vec![0.0f32; t.shape.iter().product()];
    for rule in &t.parts {
        let data = source(&rule.ours)?;
        if data.shape.to_vec() != rule.shape {
            return Err(HfError::NotExportable(format!(
                "parameter '{}' has shape {:?}, the config implies {:?}",
                rule.ours,
                data.shape.to_vec(),
                rule.shape
            )));
        }
        let not_f32 = |e| HfError::NotExportable(format!("parameter '{}': {e:?}", rule.ours));
        let converted;
        let values: &[f32] = match data.as_slice::<f32>() {
            Ok(v) => v,
            Err(_) => {
                converted = data.clone().convert::<f32>().to_vec().map_err(not_f32)?;
                &converted
            }
        };
        for (i, &v) in values.iter().enumerate() {
            out[rule.hf_index(i)] = v;
        }
    }
    Ok(out)
}

/// Writes one safetensors file of `tensors` (name, shape, encoded bytes)
/// atomically: the bytes `safetensors::serialize` would give, streamed to a
/// temporary file that is synced and renamed over `path`.
fn write_shard(
    path: &Path,
    tensors: &[(String, Vec<usize>, Vec<u8>)],
    dtype: FloatDtype,
) -> Result<(), HfError> {
    let io = |p: &Path, e: &dyn std::fmt::Display| HfError::Io {
        path: p.display().to_string(),
        message: e.to_string(),
    };
    let views = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(dtype.safetensors(), shape.clone(), bytes)
                .map(|v| (name.as_str(), v))
                .map_err(|e| io(path, &e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(
        ".{}.tmp-{}",
        name.unwrap_or_default(),
        std::process::id()
    ));
    safetensors::serialize_to_file(views, &None, &tmp).map_err(|e| io(&tmp, &e))?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| io(&tmp, &e))?;
    std::fs::rename(&tmp, path).map_err(|e| io(path, &e))
}

/// Writes the weights of a model of `config` into `dir` (which exists) as
/// `dtype`: one `model.safetensors`, or shards of at most `max_shard_size`
/// bytes of tensor data and `model.safetensors.index.json`, asking `source`
/// for each of our parameters once, in [`export_order`]. Returns the most
/// bytes of tensor data it held at once (one shard's encoded bytes plus the
/// f32 tensor being built).
///
/// # Errors
///
/// What `source` returns; [`HfError::NotExportable`] for a parameter of the
/// wrong shape; [`HfError::Io`] naming a file that could not be written.
pub fn write_weights(
    dir: &Path,
    family: Family,
    config: &DecoderConfig,
    source: &mut dyn FnMut(&str) -> Result<TensorData, HfError>,
    dtype: FloatDtype,
    max_shard_size: u64,
) -> Result<u64, HfError> {
    let tensors = hf_tensors(family, config);
    let sizes: Vec<u64> = tensors
        .iter()
        .map(|t| (t.shape.iter().product::<usize>() * dtype.size()) as u64)
        .collect();
    let shards = plan(&sizes, max_shard_size);
    let n = shards.len();
    let file = |k: usize| match n {
        1 => "model.safetensors".to_string(),
        _ => format!("model-{:05}-of-{n:05}.safetensors", k + 1),
    };
    let mut peak = 0u64;
    let mut weight_map = Map::new();
    for (k, members) in shards.iter().enumerate() {
        let mut shard: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::with_capacity(members.len());
        let mut held = 0u64;
        for &i in members {
            let t = &tensors[i];
            let values = build(t, source)?;
            peak = peak.max(held + 4 * values.len() as u64);
            let bytes = dtype.encode(&values);
            held += bytes.len() as u64;
            peak = peak.max(held + 4 * values.len() as u64);
            weight_map.insert(t.name.clone(), json!(file(k)));
            shard.push((t.name.clone(), t.shape.clone(), bytes));
        }
        write_shard(&dir.join(file(k)), &shard, dtype)?;
    }
    if n > 1 {
        let index = json!({
            "metadata": {"total_size": sizes.iter().sum::<u64>()},
            "weight_map": Value::Object(weight_map),
        });
        let path = dir.join("model.safetensors.index.json");
        let text = serde_json::to_string_pretty(&index).expect("a JSON value serialises");
        write_atomic(&path, text.as_bytes()).map_err(|e| HfError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
    }
    Ok(peak)
}
