//! The architecture a job trains: a preset, a Hugging Face `config.json`
//! (read alone; the weights load when the job runs) or the resumed run's,
//! with `model.vocab_size` and `model.max_seq_len` applied; and the shard
//! set, whose tokenizer sets the vocabulary.

use std::path::Path;

use ferrotron_engine::data::{self, ShardSet};
use ferrotron_models::hf::from_hf_config;
use ferrotron_models::presets::{preset, PRESET_NAMES};
use ferrotron_models::DecoderConfig;

use super::Problems;
use crate::config::{JobConfig, ModelSection};
use crate::resume::Resume;

/// Opens `data.shards` (checked against the resumed run's shard set).
pub(super) fn shards(c: &JobConfig, resume: Option<&Resume>, p: &mut Problems) -> Option<ShardSet> {
    let dir = c.data.shards.as_ref()?;
    match ShardSet::open(dir) {
        Ok(set) => {
            if let Some(r) = resume {
                if let Err(e) = r.check_shards(&set, dir) {
                    p.other("data.shards", e);
                }
            }
            Some(set)
        }
        Err(e) => {
            p.other("data.shards", format!("--data: {e}"));
            None
        }
    }
}

/// The architecture of the job's model, or `None` with the problem noted.
pub(super) fn architecture(
    c: &JobConfig,
    resume: Option<&Resume>,
    shards: Option<&ShardSet>,
    p: &mut Problems,
) -> Option<DecoderConfig> {
    if let Some(r) = resume {
        return Some(r.record.model.clone());
    }
    let m = &c.model;
    let mut model = match &m.hf_dir {
        Some(dir) => {
            // `--model` with `--hf-dir` is refused by the command line; a
            // job file's preset would otherwise be ignored without a word.
            if m.name != ModelSection::default().name {
                p.key(
                    "model",
                    "name",
                    format!(
                        "{}: the model comes from {} (model.hf_dir); give one of them",
                        m.name,
                        dir.join("config.json").display()
                    ),
                );
            }
            match from_hf_config(&dir.join("config.json")) {
                Ok((_, config)) => config,
                Err(e) => {
                    p.key("model", "hf_dir", format!("{}: {e}", dir.display()));
                    return None;
                }
            }
        }
        None => match preset(&m.name) {
            Some(config) => config,
            None => {
                p.key(
                    "model",
                    "name",
                    format!(
                        "unknown preset '{}'; available: {}",
                        m.name,
                        PRESET_NAMES.join(", ")
                    ),
                );
                return None;
            }
        },
    };
    let from_hf = m.hf_dir.is_some();
    let min_vocab = ferrotron_engine::data::MIN_VOCAB_SIZE;
    // Values the field checks refused are not applied.
    match (m.vocab_size.filter(|&v| v >= min_vocab), shards) {
        (Some(v), _) if from_hf && v != model.vocab_size => {
            p.key(
                "model",
                "vocab_size",
                format!(
                    "{v}: the --hf-dir model has vocab_size {}",
                    model.vocab_size
                ),
            );
        }
        (Some(v), _) => model.vocab_size = v,
        // The model's vocabulary is the shard set's tokenizer's.
        (None, Some(set)) if !from_hf => model.vocab_size = set.index().vocab_size,
        (None, _) => {}
    }
    if let Some(set) = shards {
        let n = set.index().vocab_size;
        if n > model.vocab_size {
            p.key("data", "shards", format!(
                "{}: its tokenizer has {n} tokens, more than the model's vocabulary of {}; give --vocab-size {n} or more",
                set.dir().display(),
                model.vocab_size
            ));
        }
    }
    if let Some(n) = m.max_seq_len.filter(|&n| n > 0) {
        if from_hf && n != model.max_seq_len {
            p.key(
                "model",
                "max_seq_len",
                format!(
                    "{n}: the --hf-dir model has max_seq_len {}",
                    model.max_seq_len
                ),
            );
        } else {
            model.max_seq_len = n;
        }
    }
    if let Some(dir) = &m.hf_dir {
        hf_tokenizer(dir, c.data.shards.is_some(), shards, p);
    }
    Some(model)
}

/// A model from `dir` trains on its own tokenizer: the shard set's must be
/// its `tokenizer.json`, and text is tokenized with it, so a directory
/// without one needs shards made with the model's tokenizer (a new
/// tokenizer trained on the corpus would give the pretrained embeddings
/// other tokens). `shards` is the opened `data.shards` (`None` where it
/// is not opened: a portable check) and `on_shards` whether one is given.
fn hf_tokenizer(dir: &Path, on_shards: bool, shards: Option<&ShardSet>, p: &mut Problems) {
    let path = dir.join(data::TOKENIZER_FILE);
    match (std::fs::read(&path), shards) {
        (Ok(bytes), Some(set)) => {
            let (own, set_s) = (data::sha256_hex(&bytes), &set.id().tokenizer_sha256);
            if own != *set_s {
                p.key("data", "shards", format!(
                    "{}: made with another tokenizer (SHA-256 {set_s}) than the --hf-dir model's {} ({own}); prepare the shards with --tokenizer {}",
                    set.dir().display(),
                    path.display(),
                    path.display()
                ));
            }
        }
        (Ok(_), None) => {}
        (Err(e), _) if e.kind() != std::io::ErrorKind::NotFound => {
            p.key("model", "hf_dir", format!("{}: {e}", path.display()));
        }
        (Err(_), _) if on_shards => {}
        (Err(_), _) => p.key("model", "hf_dir", format!(
            "{} has no tokenizer.json, and a tokenizer trained on the corpus would not be the model's; add the model's tokenizer.json there, or give data.shards prepared with it (--data)",
            dir.display()
        )),
    }
}
