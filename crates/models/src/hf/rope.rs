//! RoPE base and scaling in a Llama `config.json`: read from `rope_theta`,
//! `rope_scaling` (transformers 4) and `rope_parameters` (transformers 5),
//! written back to all three. `default`, `linear` and `llama3` are read;
//! `dynamic` and every other `rope_type` are errors naming it.

use serde_json::{json, Value};

use super::config::Fields;
use super::HfError;
use crate::rope_scaling::RopeScaling;

/// RoPE base and scaling of a Llama `config.json`: `rope_theta`, and the
/// scaling of `rope_scaling` and of `rope_parameters` (which must agree
/// when both are given; `rope_parameters.rope_theta` overrides `rope_theta`).
pub(super) fn rope(f: &Fields<'_>) -> Result<(f64, Option<RopeScaling>), HfError> {
    let mut theta = f.f64_or("rope_theta", 10000.0)?;
    let mut found: Option<(&str, Option<RopeScaling>)> = None;
    for key in ["rope_scaling", "rope_parameters"] {
        let Some(v) = f.get(key) else { continue };
        let map = v
            .as_object()
            .ok_or_else(|| f.err(key, format!("must be an object or null, got {v}")))?;
        let sub = Fields {
            path: f.path.clone(),
            map,
        };
        theta = sub.f64_or("rope_theta", theta)?;
        let scaling = rope_scaling(&sub, key)?;
        if let Some((first, earlier)) = &found {
            if *earlier != scaling {
                return Err(f.err(
                    key,
                    format!("describes a different RoPE scaling than {first} ({earlier:?} vs {scaling:?})"),
                ));
            }
        }
        found = Some((key, scaling));
    }
    Ok((theta, found.and_then(|(_, s)| s)))
}

/// The scaling described by one `rope_scaling` / `rope_parameters` object
/// (`key` names it in errors); `None` for `rope_type` `default`.
fn rope_scaling(sub: &Fields<'_>, key: &str) -> Result<Option<RopeScaling>, HfError> {
    let kind = match sub.get("rope_type") {
        Some(_) => sub.str_or("rope_type", "default")?,
        None => sub.str_or("type", "default")?,
    };
    let params: &[&str] = match kind {
        "default" => &[],
        "linear" => &["factor"],
        "llama3" => &[
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        ],
        "dynamic" => {
            return Err(sub.err(
                &format!("{key}.rope_type"),
                "is 'dynamic' (dynamic NTK scaling), which is not implemented; supported: default, linear, llama3",
            ))
        }
        other => {
            return Err(sub.err(
                &format!("{key}.rope_type"),
                format!("is '{other}'; supported: default, linear, llama3"),
            ))
        }
    };
    for field in sub.map.keys() {
        let known = ["rope_type", "type", "rope_theta"].contains(&field.as_str())
            || params.contains(&field.as_str());
        if !known && !sub.map[field].is_null() {
            return Err(sub.err(
                &format!("{key}.{field}"),
                format!("is not used by rope_type '{kind}' here; refusing a setting Ferrotron would ignore"),
            ));
        }
    }
    let number = |field: &str| -> Result<f64, HfError> {
        sub.get(field)
            .ok_or_else(|| sub.err(&format!("{key}.{field}"), "is missing"))?
            .as_f64()
            .ok_or_else(|| sub.err(&format!("{key}.{field}"), "must be a number"))
    };
    let scaling = match kind {
        "linear" => RopeScaling::Linear {
            factor: number("factor")?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: number("factor")?,
            low_freq_factor: number("low_freq_factor")?,
            high_freq_factor: number("high_freq_factor")?,
            original_max_position_embeddings: number("original_max_position_embeddings")
                .ok()
                .filter(|n| n.fract() == 0.0 && *n >= 1.0)
                .ok_or_else(|| {
                    sub.err(
                        &format!("{key}.original_max_position_embeddings"),
                        "must be a positive integer",
                    )
                })? as usize,
        },
        _ => return Ok(None),
    };
    scaling.validate().map_err(|e| {
        sub.err(
            &format!("{key}.{}", e.field.trim_start_matches("position.scaling.")),
            e.problem,
        )
    })?;
    Ok(Some(scaling))
}

/// The `rope_scaling` and `rope_parameters` values of `config.json` for RoPE
/// with base `theta` and `scaling`, as transformers writes them.
pub(super) fn rope_json(theta: f64, scaling: Option<&RopeScaling>) -> (Value, Value) {
    let Some(s) = scaling else {
        return (
            Value::Null,
            json!({"rope_type": "default", "rope_theta": theta}),
        );
    };
    let mut v = serde_json::to_value(s).expect("plain numbers serialise");
    let map = v.as_object_mut().expect("an internally tagged enum");
    map.remove("type");
    map.insert("rope_type".into(), json!(s.rope_type()));
    let scaling = v.clone();
    let map = v.as_object_mut().expect("an object");
    map.insert("rope_theta".into(), json!(theta));
    (scaling, v)
}
