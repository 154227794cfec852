//! The job's inputs against the model and the resumed run: a tokenizer
//! with more tokens than the model's vocabulary (its ids would index past
//! the embedding and the head), and a corpus whose text changed under the
//! path the resumed run trained on.

use std::path::Path;

use ferrotron_engine::data::{self, Tokenizer};
use ferrotron_models::DecoderConfig;

use super::Problems;
use crate::config::JobConfig;
use crate::resume::Resume;

/// Checks the tokenizer the job will encode with (the resumed run's, else
/// `model.hf_dir`'s; a shard set's is checked with the set, a trained one
/// has the model's size) against `model`'s vocabulary, and a resumed
/// run's corpus against the SHA-256 of the text it trained on.
pub(super) fn check_inputs(
    c: &JobConfig,
    resume: Option<&Resume>,
    model: &DecoderConfig,
    p: &mut Problems,
) {
    let v = model.vocab_size;
    match (resume, &c.model.hf_dir, &c.data.shards) {
        (Some(r), _, _) => {
            let path = r.run.join(data::TOKENIZER_FILE);
            if let Some(problem) = too_large(&path, v, "the run's model") {
                p.other("--resume", problem);
            }
        }
        (None, Some(dir), None) if dir.join(data::TOKENIZER_FILE).is_file() => {
            let path = dir.join(data::TOKENIZER_FILE);
            if let Some(problem) = too_large(&path, v, "config.json's vocab_size") {
                p.key("model", "hf_dir", problem);
            }
        }
        _ => {}
    }
    if let (Some(r), Some(path)) = (resume, &c.data.corpus) {
        if let Some(then) = &r.record.corpus_sha256 {
            match data::read_corpus(path) {
                Ok(text) => {
                    let now = data::sha256_hex(text.as_bytes());
                    if now != *then {
                        p.key("data", "corpus", format!(
                            "{}: its text has SHA-256 {now}, but the run trained on text with {then}; a resumed run keeps its data",
                            path.display()
                        ));
                    }
                }
                Err(e) => p.key("data", "corpus", e.to_string()),
            }
        }
    }
}

/// Why the tokenizer at `path` does not fit a vocabulary of `vocab_size`
/// (`whose`), or `None` when it fits (its size, added tokens included, is
/// at most `vocab_size`: a model may have unused rows, as padded Hugging
/// Face vocabularies do).
fn too_large(path: &Path, vocab_size: usize, whose: &str) -> Option<String> {
    match Tokenizer::from_file(path) {
        Ok(t) => {
            let n = t.get_vocab_size(true);
            (n > vocab_size).then(|| format!(
                "{}: the tokenizer has {n} tokens, more than {whose} of {vocab_size}; its ids {vocab_size} and up would index past the embedding",
                path.display()
            ))
        }
        Err(e) => Some(format!("{}: not a tokenizer: {e}", path.display())),
    }
}
