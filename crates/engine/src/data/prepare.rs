//! `data prepare`: input files → documents → token ids → a shard set.
//!
//! With a given tokenizer the inputs are streamed: documents are encoded in
//! batches of about [`ENCODE_BATCH_BYTES`] and written as they come, so
//! memory stays bounded (a plain text file, being one document, is read
//! whole). Training a tokenizer needs every document at once (as the
//! trainer does on its corpus): the text is held in memory for that.

use std::path::PathBuf;

use super::shard_index::ShardIndex;
use super::shard_writer::ShardWriter;
use super::tokenizer::{encode_documents, end_of_text_id, train_bpe_documents};
use super::{for_each_document, DataError, Tokenizer};

/// Text encoded per batch when streaming (bytes).
pub const ENCODE_BATCH_BYTES: usize = 8 << 20;

/// Where the tokenizer of a shard set comes from.
#[derive(Clone, Debug)]
pub enum TokenizerSource {
    /// A `tokenizer.json` (copied into the set byte for byte).
    File(PathBuf),
    /// The byte-level BPE of [`super::train_bpe_documents`], trained on all
    /// the inputs with this vocabulary size.
    Train {
        /// Tokens of the vocabulary.
        vocab_size: usize,
    },
}

/// What to prepare.
#[derive(Clone, Debug)]
pub struct PrepareConfig {
    /// Input files, in order.
    pub inputs: Vec<PathBuf>,
    /// JSON-lines field holding the text (`None`: each file is one text).
    pub text_field: Option<String>,
    /// The tokenizer.
    pub tokenizer: TokenizerSource,
    /// The shard set directory to create.
    pub out: PathBuf,
    /// Most tokens per shard file.
    pub shard_tokens: u64,
}

/// Progress of [`prepare`], in bytes.
pub trait PrepareProgress {
    /// A phase begins (`reading`, `encoding`); `total` bytes to go through.
    fn phase(&mut self, name: &str, total: u64);
    /// `done` bytes of the phase are through.
    fn advance(&mut self, done: u64);
}

/// Tokenizes `config.inputs` into a new shard set at `config.out` (see the
/// module doc) and returns its index. The set appears at `out` only once
/// complete.
///
/// # Errors
///
/// Those of reading the inputs ([`for_each_document`]), of loading or
/// training the tokenizer, of encoding, and of [`ShardWriter`] (an
/// existing, non-empty `out` included).
pub fn prepare(
    config: &PrepareConfig,
    progress: &mut dyn PrepareProgress,
) -> Result<ShardIndex, DataError> {
    let field = config.text_field.as_deref();
    let disk_total: u64 = config
        .inputs
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    let (tokenizer, json, held) = match &config.tokenizer {
        TokenizerSource::File(path) => {
            let json = std::fs::read(path).map_err(|source| DataError::Io {
                action: "reading tokenizer file",
                path: path.clone(),
                source,
            })?;
            let tokenizer =
                Tokenizer::from_bytes(&json).map_err(|source| DataError::TokenizerLoad {
                    path: path.clone(),
                    source,
                })?;
            (tokenizer, json, None)
        }
        TokenizerSource::Train { vocab_size } => {
            progress.phase("reading", disk_total);
            let mut docs = Vec::new();
            let mut before = 0;
            for path in &config.inputs {
                for_each_document(path, field, &mut |text, read| {
                    docs.push(text);
                    progress.advance(before + read);
                    Ok(())
                })?;
                before += std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            }
            progress.phase("training the tokenizer", 0);
            let refs: Vec<&str> = docs.iter().map(String::as_str).collect();
            let tokenizer = train_bpe_documents(&refs, *vocab_size)?;
            let json = tokenizer
                .to_string(false)
                .map_err(|source| DataError::TokenizerSave {
                    path: config.out.clone(),
                    source,
                })?
                .into_bytes();
            (tokenizer, json, Some(docs))
        }
    };
    let mut writer = ShardWriter::create(
        &config.out,
        json,
        tokenizer.get_vocab_size(true),
        end_of_text_id(&tokenizer),
        config.shard_tokens,
    )?;
    let mut batch = Batch::default();
    match held {
        Some(docs) => {
            progress.phase("encoding", docs.iter().map(|d| d.len() as u64).sum());
            let mut done = 0;
            for text in docs {
                done += text.len() as u64;
                batch.push(text, &tokenizer, &mut writer)?;
                progress.advance(done);
            }
        }
        None => {
            progress.phase("encoding", disk_total);
            let mut before = 0;
            for path in &config.inputs {
                for_each_document(path, field, &mut |text, read| {
                    batch.push(text, &tokenizer, &mut writer)?;
                    progress.advance(before + read);
                    Ok(())
                })?;
                before += std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            }
        }
    }
    batch.flush(&tokenizer, &mut writer)?;
    writer.finish()
}

/// Documents waiting to be encoded together.
#[derive(Default)]
struct Batch {
    docs: Vec<String>,
    bytes: usize,
}

impl Batch {
    /// Adds a document; encodes and writes the batch once it is large.
    fn push(
        &mut self,
        text: String,
        tokenizer: &Tokenizer,
        writer: &mut ShardWriter,
    ) -> Result<(), DataError> {
        self.bytes += text.len();
        self.docs.push(text);
        if self.bytes >= ENCODE_BATCH_BYTES {
            self.flush(tokenizer, writer)?;
        }
        Ok(())
    }

    /// Encodes and writes the documents held, in order.
    fn flush(&mut self, tokenizer: &Tokenizer, writer: &mut ShardWriter) -> Result<(), DataError> {
        let refs: Vec<&str> = self.docs.iter().map(String::as_str).collect();
        for (ids, text) in encode_documents(tokenizer, &refs)?.iter().zip(&refs) {
            writer.push_document(ids, text.len())?;
        }
        self.docs.clear();
        self.bytes = 0;
        Ok(())
    }
}

/// The input paths of `patterns`: each is a file, or a glob pattern
/// (`*`, `?`, `[...]`) expanded in sorted order.
///
/// # Errors
///
/// [`DataError::InvalidArgument`] for a pattern that is malformed or
/// matches nothing.
pub fn expand_inputs(patterns: &[String]) -> Result<Vec<PathBuf>, DataError> {
    let mut paths = Vec::new();
    for pattern in patterns {
        if !pattern.contains(['*', '?', '[']) {
            paths.push(PathBuf::from(pattern));
            continue;
        }
        let bad = |reason: &'static str| DataError::InvalidArgument {
            name: "input",
            value: pattern.clone(),
            reason,
        };
        let mut matched: Vec<PathBuf> = glob::glob(pattern)
            .map_err(|_| bad("is not a valid glob pattern"))?
            .filter_map(Result::ok)
            .collect();
        if matched.is_empty() {
            return Err(bad("matches no file"));
        }
        matched.sort();
        paths.extend(matched);
    }
    Ok(paths)
}
