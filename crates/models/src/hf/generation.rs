//! The token ids that begin and end a sequence, as a Hugging Face model
//! directory states them, each id on its own: `generation_config.json`
//! (what `generate` in `transformers` reads), else `bos_token_id` /
//! `eos_token_id` of `config.json`, else the tokenizer's `<|endoftext|>`
//! (the one special token of Ferrotron's and GPT-2's tokenizers, which
//! serves as both).

use std::path::Path;

use ferrotron_engine::data::{Tokenizer, END_OF_TEXT};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::HfError;

/// Begin- and end-of-sequence token ids (also kept in a run directory's
/// `run.toml`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecialTokens {
    /// The id a sequence starts with, if the model has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos: Option<u32>,
    /// Ids that end a sequence (Llama 3 instruct models have several).
    #[serde(default)]
    pub eos: Vec<u32>,
}

impl SpecialTokens {
    /// From a tokenizer alone: its `<|endoftext|>` token, if any, as both.
    pub fn from_tokenizer(tokenizer: &Tokenizer) -> Self {
        let id = tokenizer.token_to_id(END_OF_TEXT);
        Self {
            bos: id,
            eos: id.into_iter().collect(),
        }
    }

    /// From model directory `dir` (see the module documentation);
    /// `tokenizer` is the directory's tokenizer, when it has one.
    ///
    /// # Errors
    ///
    /// [`HfError::Io`] for an unreadable or invalid JSON file,
    /// [`HfError::Field`] for a token id that is not a non-negative integer
    /// (or list of them).
    pub fn read_dir(dir: &Path, tokenizer: Option<&Tokenizer>) -> Result<Self, HfError> {
        let mut found = Self::default();
        // Each id from the first source that states it.
        for file in ["generation_config.json", "config.json"] {
            let path = dir.join(file);
            if path.exists() {
                found = found.or(from_json(&path)?);
            }
        }
        Ok(match tokenizer {
            Some(t) => found.or(Self::from_tokenizer(t)),
            None => found,
        })
    }

    /// These ids, each taken from `other` where this one has none.
    fn or(self, other: Self) -> Self {
        Self {
            bos: self.bos.or(other.bos),
            eos: if self.eos.is_empty() {
                other.eos
            } else {
                self.eos
            },
        }
    }

    /// The content of a `generation_config.json` stating these ids; an
    /// exported `config.json` states them too (so that `transformers` does
    /// not fill in its class defaults).
    pub fn generation_config(&self) -> Value {
        let eos = match self.eos.as_slice() {
            [] => Value::Null,
            [one] => json!(one),
            many => json!(many),
        };
        json!({"bos_token_id": self.bos, "eos_token_id": eos})
    }
}

/// `bos_token_id` and `eos_token_id` (an id or a list of ids) of one JSON file.
fn from_json(path: &Path) -> Result<SpecialTokens, HfError> {
    let p = path.display().to_string();
    let io = |message: String| HfError::Io {
        path: p.clone(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| io(e.to_string()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| io(format!("not valid JSON: {e}")))?;
    let id = |field: &str, v: &Value| -> Result<u32, HfError> {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| HfError::Field {
                path: p.clone(),
                field: field.into(),
                problem: format!("must be a token id (a non-negative integer), got {v}"),
            })
    };
    let bos = match v.get("bos_token_id").filter(|b| !b.is_null()) {
        Some(b) => Some(id("bos_token_id", b)?),
        None => None,
    };
    let eos = match v.get("eos_token_id").filter(|e| !e.is_null()) {
        None => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .map(|e| id("eos_token_id", e))
            .collect::<Result<_, _>>()?,
        Some(e) => vec![id("eos_token_id", e)?],
    };
    Ok(SpecialTokens { bos, eos })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ferrotron_tokenizer_begins_and_ends_with_endoftext() {
        let text = "the king and the queen of love. ".repeat(20);
        let tok = ferrotron_engine::data::train_bpe(&text, 270).unwrap();
        let ids = SpecialTokens::from_tokenizer(&tok);
        assert_eq!((ids.bos, ids.eos), (Some(0), vec![0]));
    }

    #[test]
    fn ids_come_from_generation_config_then_config_and_lists_are_read() {
        let dir = std::env::temp_dir().join(format!("ft-gen-ids-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("config.json"),
            r#"{"bos_token_id": 1, "eos_token_id": 2}"#,
        )
        .unwrap();
        let read = SpecialTokens::read_dir(&dir, None).unwrap();
        assert_eq!((read.bos, read.eos), (Some(1), vec![2]));
        std::fs::write(
            dir.join("generation_config.json"),
            r#"{"bos_token_id": 7, "eos_token_id": [8, 9]}"#,
        )
        .unwrap();
        let read = SpecialTokens::read_dir(&dir, None).unwrap();
        assert_eq!((read.bos, read.eos.clone()), (Some(7), vec![8, 9]));
        // An id generation_config.json leaves out comes from config.json.
        std::fs::write(dir.join("generation_config.json"), r#"{"bos_token_id": 7}"#).unwrap();
        let only_bos = SpecialTokens::read_dir(&dir, None).unwrap();
        assert_eq!((only_bos.bos, only_bos.eos), (Some(7), vec![2]));
        let text = read.generation_config().to_string();
        assert_eq!(text, r#"{"bos_token_id":7,"eos_token_id":[8,9]}"#);
        std::fs::write(
            dir.join("generation_config.json"),
            r#"{"eos_token_id": -1}"#,
        )
        .unwrap();
        let e = SpecialTokens::read_dir(&dir, None).unwrap_err().to_string();
        assert!(
            e.contains("generation_config.json: field 'eos_token_id'"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
