//! `config.json` of a Hugging Face model directory to and from [`DecoderConfig`].
//!
//! Only what changes the computation is read; a field whose value we do not
//! implement (a RoPE scaling type other than `linear` and `llama3`, attention
//! biases in Llama, BLOOM's residual after the norm, ...) is an error naming
//! the field rather than a silently different model. RoPE scaling is read
//! from `rope_scaling` (transformers 4) or `rope_parameters` (transformers 5)
//! and written to both.

use std::path::Path;

use serde_json::{json, Map, Value};

use super::rope::{rope, rope_json};
use super::HfError;
use crate::config::{DecoderConfig, MlpKind, NormKind, Position};
use crate::presets;
use ferrotron_kernels::attention::MatrixUnits;

/// The `transformers` model families we read and write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `GPT2LMHeadModel`.
    Gpt2,
    /// `LlamaForCausalLM`.
    Llama,
    /// `BloomForCausalLM`.
    Bloom,
}

impl Family {
    /// The `architectures` entry of `config.json`.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Gpt2 => "GPT2LMHeadModel",
            Family::Llama => "LlamaForCausalLM",
            Family::Bloom => "BloomForCausalLM",
        }
    }

    /// The `model_type` of `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Gpt2 => "gpt2",
            Family::Llama => "llama",
            Family::Bloom => "bloom",
        }
    }

    /// Prefix of the base model's tensor names (`transformer.` or `model.`).
    pub fn prefix(self) -> &'static str {
        match self {
            Family::Gpt2 | Family::Bloom => "transformer.",
            Family::Llama => "model.",
        }
    }

    /// The family a configuration of ours corresponds to, or why none does.
    pub fn of(c: &DecoderConfig) -> Result<Family, HfError> {
        let no = |why: &str| Err(HfError::NotExportable(why.to_string()));
        match (&c.position, c.norm, c.mlp) {
            (Position::Learned, NormKind::LayerNorm, MlpKind::GeluTanh) => {
                if !c.bias || c.embed_norm || c.n_kv_heads != c.n_heads {
                    return no("a GPT-2 (learned positions) config needs bias = true, embed_norm = false and n_kv_heads = n_heads");
                }
                Ok(Family::Gpt2)
            }
            (Position::Rope { .. }, NormKind::RmsNorm, MlpKind::Swiglu) => {
                if c.bias || c.embed_norm {
                    return no("a Llama (RoPE) config needs bias = false and embed_norm = false");
                }
                Ok(Family::Llama)
            }
            (Position::Alibi, NormKind::LayerNorm, MlpKind::GeluTanh) => {
                if !c.bias || !c.embed_norm || c.n_kv_heads != c.n_heads || c.ffn_size != 4 * c.hidden_size {
                    return no("a BLOOM (ALiBi) config needs bias = true, embed_norm = true, n_kv_heads = n_heads and ffn_size = 4 x hidden_size");
                }
                Ok(Family::Bloom)
            }
            _ => no("the combination of position, norm and mlp matches none of GPT-2 (learned, layernorm, gelu_tanh), Llama (rope, rmsnorm, swiglu), BLOOM (alibi, layernorm, gelu_tanh)"),
        }
    }
}

/// Reads fields of one `config.json`, naming the file and field in errors.
pub(super) struct Fields<'a> {
    /// The file, for errors.
    pub(super) path: String,
    /// Its (sub-)object.
    pub(super) map: &'a Map<String, Value>,
}

impl Fields<'_> {
    pub(super) fn err(&self, field: &str, problem: impl Into<String>) -> HfError {
        HfError::Field {
            path: self.path.clone(),
            field: field.to_string(),
            problem: problem.into(),
        }
    }

    /// The value of `field`, treating JSON `null` as absent.
    pub(super) fn get(&self, field: &str) -> Option<&Value> {
        self.map.get(field).filter(|v| !v.is_null())
    }

    pub(super) fn usize_or(&self, field: &str, default: Option<usize>) -> Result<usize, HfError> {
        match self.get(field) {
            None => default.ok_or_else(|| self.err(field, "is missing")),
            Some(v) => v
                .as_u64()
                .filter(|&n| n > 0)
                .map(|n| n as usize)
                .ok_or_else(|| self.err(field, format!("must be a positive integer, got {v}"))),
        }
    }

    pub(super) fn usize(&self, field: &str) -> Result<usize, HfError> {
        self.usize_or(field, None)
    }

    pub(super) fn f64_or(&self, field: &str, default: f64) -> Result<f64, HfError> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .ok_or_else(|| self.err(field, format!("must be a number, got {v}"))),
        }
    }

    pub(super) fn bool_or(&self, field: &str, default: bool) -> Result<bool, HfError> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.err(field, format!("must be true or false, got {v}"))),
        }
    }

    pub(super) fn str_or<'s>(&'s self, field: &str, default: &'s str) -> Result<&'s str, HfError> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v
                .as_str()
                .ok_or_else(|| self.err(field, format!("must be a string, got {v}"))),
        }
    }

    /// Errors unless `field` is absent or equals `want`.
    fn require_bool(&self, field: &str, want: bool, why: &str) -> Result<(), HfError> {
        if self.bool_or(field, want)? != want {
            return Err(self.err(field, format!("must be {want}: {why}")));
        }
        Ok(())
    }

    /// Errors unless `field` is absent or one of `allowed`.
    fn require_str(&self, field: &str, allowed: &[&str]) -> Result<(), HfError> {
        let v = self.str_or(field, allowed[0])?;
        if !allowed.contains(&v) {
            return Err(self.err(
                field,
                format!("is '{v}'; supported: {}", allowed.join(", ")),
            ));
        }
        Ok(())
    }
}

/// The family named by `config.json` (its `architectures`, else `model_type`).
fn family(f: &Fields<'_>) -> Result<Family, HfError> {
    let arch = f
        .get("architectures")
        .and_then(|v| v.as_array())
        .and_then(|a| a.first())
        .and_then(|v| v.as_str());
    let model_type = f.get("model_type").and_then(|v| v.as_str());
    let found = match (arch, model_type) {
        (Some(a), _) => a,
        (None, Some(m)) => m,
        (None, None) => {
            return Err(f.err("architectures", "is missing (and so is model_type)"));
        }
    };
    for fam in [Family::Gpt2, Family::Llama, Family::Bloom] {
        if found == fam.architecture() || found == fam.model_type() {
            return Ok(fam);
        }
    }
    Err(HfError::Architecture {
        path: f.path.clone(),
        found: format!("'{found}'"),
    })
}

/// Reads a Hugging Face `config.json` into our configuration.
///
/// # Errors
///
/// [`HfError::Io`] if the file cannot be read or parsed,
/// [`HfError::Architecture`] for another model family, [`HfError::Field`]
/// naming the field that is missing, mistyped or unsupported (for example a
/// `rope_scaling.rope_type` other than default, linear and llama3), or a field error for a shape our decoder rejects.
pub fn from_hf_config(path: &Path) -> Result<(Family, DecoderConfig), HfError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| HfError::Io {
        path: p.clone(),
        message: e.to_string(),
    })?;
    let value: Value = serde_json::from_str(&text).map_err(|e| HfError::Io {
        path: p.clone(),
        message: format!("not valid JSON: {e}"),
    })?;
    let map = value.as_object().ok_or_else(|| HfError::Io {
        path: p.clone(),
        message: "not a JSON object".into(),
    })?;
    parse(&Fields { path: p, map })
}

fn parse(f: &Fields<'_>) -> Result<(Family, DecoderConfig), HfError> {
    let fam = family(f)?;
    let vocab_size = f.usize("vocab_size")?;
    let init_std = f.f64_or("initializer_range", 0.02)?;
    let c = match fam {
        Family::Gpt2 => {
            f.require_str("activation_function", &["gelu_new", "gelu_pytorch_tanh"])?;
            f.require_bool(
                "scale_attn_weights",
                true,
                "unscaled attention is not implemented",
            )?;
            f.require_bool(
                "scale_attn_by_inverse_layer_idx",
                false,
                "per-layer attention scaling is not implemented",
            )?;
            let hidden = f.usize("n_embd")?;
            let heads = f.usize("n_head")?;
            DecoderConfig {
                vocab_size,
                ffn_size: f.usize_or("n_inner", Some(4 * hidden))?,
                max_seq_len: f.usize("n_positions")?,
                norm_eps: f.f64_or("layer_norm_epsilon", 1e-5)?,
                tied_head: f.bool_or("tie_word_embeddings", true)?,
                init_std,
                kernels: None,
                precision: Default::default(),
                attention_matrix_units: MatrixUnits::Off,
                ..presets::gpt2(hidden, f.usize("n_layer")?, heads)
            }
        }
        Family::Llama => {
            f.require_str("hidden_act", &["silu"])?;
            f.require_bool(
                "attention_bias",
                false,
                "Llama attention biases are not implemented",
            )?;
            f.require_bool("mlp_bias", false, "Llama MLP biases are not implemented")?;
            let (theta, scaling) = rope(f)?;
            let hidden = f.usize("hidden_size")?;
            let heads = f.usize("num_attention_heads")?;
            if let Some(hd) = f.get("head_dim") {
                if hd.as_u64() != Some((hidden / heads) as u64) {
                    return Err(f.err(
                        "head_dim",
                        format!(
                            "is {hd}; only hidden_size / num_attention_heads ({}) is supported",
                            hidden / heads
                        ),
                    ));
                }
            }
            DecoderConfig {
                position: Position::Rope { theta, scaling },
                norm_eps: f.f64_or("rms_norm_eps", 1e-6)?,
                tied_head: f.bool_or("tie_word_embeddings", false)?,
                init_std,
                kernels: None,
                precision: Default::default(),
                attention_matrix_units: MatrixUnits::Off,
                ..presets::llama(
                    vocab_size,
                    hidden,
                    f.usize("num_hidden_layers")?,
                    heads,
                    f.usize_or("num_key_value_heads", Some(heads))?,
                    f.usize("intermediate_size")?,
                    f.usize_or("max_position_embeddings", Some(2048))?,
                    theta,
                )
            }
        }
        Family::Bloom => {
            f.require_bool(
                "apply_residual_connection_post_layernorm",
                false,
                "the residual after the norm is not implemented",
            )?;
            let hidden = match f.get("n_embed") {
                Some(_) => f.usize("n_embed")?,
                None => f.usize("hidden_size")?,
            };
            let heads = match f.get("num_attention_heads") {
                Some(_) => f.usize("num_attention_heads")?,
                None => f.usize("n_head")?,
            };
            let layers = match f.get("num_hidden_layers") {
                Some(_) => f.usize("num_hidden_layers")?,
                None => f.usize("n_layer")?,
            };
            DecoderConfig {
                vocab_size,
                // ALiBi has no position table; this only bounds the input length.
                max_seq_len: f.usize_or("seq_length", Some(2048))?,
                norm_eps: f.f64_or("layer_norm_epsilon", 1e-5)?,
                tied_head: f.bool_or("tie_word_embeddings", true)?,
                init_std,
                kernels: None,
                precision: Default::default(),
                attention_matrix_units: MatrixUnits::Off,
                ..presets::bloom(hidden, layers, heads)
            }
        }
    };
    c.validate().map_err(|e| {
        // Named as in config.json, not as our fields.
        let problem = hf_keys(fam)
            .iter()
            .fold(e.problem, |text, (ours, theirs)| text.replace(ours, theirs));
        f.err(hf_key(fam, e.field), problem)
    })?;
    Ok((fam, c))
}

/// Our fields that `config.json` of `fam` names otherwise, with its names.
fn hf_keys(fam: Family) -> &'static [(&'static str, &'static str)] {
    match fam {
        Family::Gpt2 => &[
            ("hidden_size", "n_embd"),
            ("n_layers", "n_layer"),
            ("n_heads", "n_head"),
            ("ffn_size", "n_inner"),
            ("max_seq_len", "n_positions"),
            ("norm_eps", "layer_norm_epsilon"),
        ],
        Family::Llama => &[
            ("n_layers", "num_hidden_layers"),
            ("n_kv_heads", "num_key_value_heads"),
            ("n_heads", "num_attention_heads"),
            ("ffn_size", "intermediate_size"),
            ("max_seq_len", "max_position_embeddings"),
            ("norm_eps", "rms_norm_eps"),
            ("position.theta", "rope_theta"),
        ],
        Family::Bloom => &[
            ("n_layers", "n_layer"),
            ("n_heads", "n_head"),
            ("max_seq_len", "seq_length"),
            ("norm_eps", "layer_norm_epsilon"),
        ],
    }
}

/// The `config.json` key of `fam` that sets our field `field`.
fn hf_key(fam: Family, field: &'static str) -> &'static str {
    hf_keys(fam)
        .iter()
        .find(|(ours, _)| *ours == field)
        .map_or(field, |(_, theirs)| theirs)
}

/// The Hugging Face `config.json` (as JSON) for our configuration.
///
/// # Errors
///
/// [`HfError::NotExportable`] if `c` matches no `transformers` family.
pub fn to_hf_config(c: &DecoderConfig) -> Result<(Family, Value), HfError> {
    let fam = Family::of(c)?;
    let mut v = match fam {
        Family::Gpt2 => json!({
            "n_embd": c.hidden_size,
            "n_layer": c.n_layers,
            "n_head": c.n_heads,
            "n_inner": c.ffn_size,
            "n_positions": c.max_seq_len,
            "n_ctx": c.max_seq_len,
            "layer_norm_epsilon": c.norm_eps,
            "activation_function": "gelu_new",
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        }),
        Family::Llama => {
            let Position::Rope { theta, scaling } = &c.position else {
                unreachable!("Family::of checked the position")
            };
            let (rope_scaling, rope_parameters) = rope_json(*theta, scaling.as_ref());
            json!({
                "hidden_size": c.hidden_size,
                "num_hidden_layers": c.n_layers,
                "num_attention_heads": c.n_heads,
                "num_key_value_heads": c.n_kv_heads,
                "intermediate_size": c.ffn_size,
                "max_position_embeddings": c.max_seq_len,
                "rms_norm_eps": c.norm_eps,
                "hidden_act": "silu",
                "rope_theta": theta,
                "rope_scaling": rope_scaling,
                "rope_parameters": rope_parameters,
                "attention_bias": false,
                "mlp_bias": false,
                "attention_dropout": 0.0,
            })
        }
        Family::Bloom => json!({
            "hidden_size": c.hidden_size,
            "n_layer": c.n_layers,
            "n_head": c.n_heads,
            "layer_norm_epsilon": c.norm_eps,
            "apply_residual_connection_post_layernorm": false,
            "seq_length": c.max_seq_len,
            "hidden_dropout": 0.0,
            "attention_dropout": 0.0,
        }),
    };
    let map = v.as_object_mut().expect("a JSON object literal");
    map.insert("architectures".into(), json!([fam.architecture()]));
    map.insert("model_type".into(), json!(fam.model_type()));
    map.insert("vocab_size".into(), json!(c.vocab_size));
    map.insert("tie_word_embeddings".into(), json!(c.tied_head));
    map.insert("initializer_range".into(), json!(c.init_std));
    Ok((fam, v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets;

    fn fields(v: &Value) -> Result<(Family, DecoderConfig), HfError> {
        parse(&Fields {
            path: "config.json".into(),
            map: v.as_object().unwrap(),
        })
    }

    #[test]
    fn every_family_round_trips_through_config_json() {
        for name in [
            "gpt-mini",
            "llama-mini",
            "bloom-mini",
            "gpt2",
            "llama3-8b",
            "llama3.1-8b",
            "llama3.2-1b",
            "bloom-560m",
        ] {
            let c = presets::preset(name).unwrap();
            let (fam, v) = to_hf_config(&c).unwrap();
            let (fam2, back) = fields(&v).unwrap();
            assert_eq!(fam, fam2, "{name}");
            assert_eq!(back, c, "{name}");
        }
    }

    #[test]
    fn unsupported_values_name_the_field() {
        let (_, mut v) = to_hf_config(&presets::preset("llama3-8b").unwrap()).unwrap();
        v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0});
        let e = fields(&v).unwrap_err().to_string();
        assert!(
            e.contains("'rope_scaling.low_freq_factor' is missing"),
            "{e}"
        );
        v["rope_scaling"] = json!({"type": "dynamic", "factor": 2.0});
        let e = fields(&v).unwrap_err().to_string();
        assert!(
            e.contains("rope_scaling.rope_type") && e.contains("'dynamic'"),
            "{e}"
        );
        v["rope_scaling"] = json!({"rope_type": "linear", "factor": 2.0, "beta_fast": 32});
        let e = fields(&v).unwrap_err().to_string();
        assert!(e.contains("rope_scaling.beta_fast"), "{e}");
        v["rope_scaling"] = Value::Null;
        v["rope_parameters"] = json!({"rope_type": "yarn", "rope_theta": 5e5});
        let e = fields(&v).unwrap_err().to_string();
        assert!(
            e.contains("rope_parameters.rope_type") && e.contains("'yarn'"),
            "{e}"
        );
        v["rope_parameters"] = json!({"rope_type": "linear", "factor": 0.5});
        let e = fields(&v).unwrap_err().to_string();
        assert!(e.contains("rope_parameters.factor"), "{e}");
        v["rope_scaling"] = json!({"rope_type": "linear", "factor": 2.0});
        v["rope_parameters"] = json!({"rope_type": "linear", "factor": 4.0});
        let e = fields(&v).unwrap_err().to_string();
        assert!(e.contains("'rope_parameters' describes a different"), "{e}");
        v["architectures"] = json!(["MistralForCausalLM"]);
        let e = fields(&v).unwrap_err().to_string();
        assert!(e.contains("MistralForCausalLM"), "{e}");
        let (_, mut v) = to_hf_config(&presets::preset("gpt2").unwrap()).unwrap();
        v.as_object_mut().unwrap().remove("n_embd");
        let e = fields(&v).unwrap_err().to_string();
        assert!(e.contains("'n_embd' is missing"), "{e}");
        // What our checks refuse is named by the file's keys.
        let (_, mut v) = to_hf_config(&presets::preset("gpt2").unwrap()).unwrap();
        v["layer_norm_epsilon"] = json!(0.0);
        let e = fields(&v).unwrap_err().to_string();
        assert!(e.contains("'layer_norm_epsilon' must be positive"), "{e}");
        let (_, mut v) = to_hf_config(&presets::preset("llama-mini").unwrap()).unwrap();
        v["num_key_value_heads"] = json!(4);
        let e = fields(&v).unwrap_err().to_string();
        assert!(
            e.contains("'num_key_value_heads' (4) must divide num_attention_heads (6)"),
            "{e}"
        );
    }

    #[test]
    fn rope_theta_is_read_from_rope_parameters() {
        let (_, mut v) = to_hf_config(&presets::preset("llama-mini").unwrap()).unwrap();
        let m = v.as_object_mut().unwrap();
        m.remove("rope_theta");
        m.insert(
            "rope_parameters".into(),
            json!({"rope_type": "default", "rope_theta": 500000.0}),
        );
        let (_, c) = fields(&v).unwrap();
        assert_eq!(
            c.position,
            Position::Rope {
                theta: 500000.0,
                scaling: None
            }
        );
    }

    #[test]
    fn llama31_rope_scaling_is_read_from_either_key() {
        // As in Meta's Llama 3.1 config.json (transformers 4 layout).
        let (_, mut v) = to_hf_config(&presets::preset("llama3-8b").unwrap()).unwrap();
        let m = v.as_object_mut().unwrap();
        m.remove("rope_parameters");
        m.insert("max_position_embeddings".into(), json!(131072));
        m.insert(
            "rope_scaling".into(),
            json!({"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}),
        );
        let (_, c) = fields(&v).unwrap();
        assert_eq!(c, presets::preset("llama3.1-8b").unwrap());
        // transformers 5 layout: only rope_parameters, with the theta inside.
        let m = v.as_object_mut().unwrap();
        let mut rp = m.remove("rope_scaling").unwrap();
        rp["rope_theta"] = json!(500000.0);
        m.remove("rope_theta");
        m.insert("rope_parameters".into(), rp);
        let (_, c) = fields(&v).unwrap();
        assert_eq!(c, presets::preset("llama3.1-8b").unwrap());
    }
}
