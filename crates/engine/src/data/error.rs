//! Error type of the data pipeline.

use std::path::PathBuf;

/// Everything that can go wrong while reading a corpus, training or loading a
/// tokenizer, splitting tokens or sampling batches.
///
/// Every variant names the file, the argument or the part of the data involved
/// so that the message alone tells the user what to fix.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file could not be read, written, renamed or its directory created.
    #[error("{action} `{path}`: {source}")]
    Io {
        /// What was being done, e.g. "reading corpus file".
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },

    /// A corpus path is not a regular file (a directory, a device such as
    /// `/dev/zero`, a pipe), which could not be read or never ends.
    #[error("corpus `{path}` is not a regular file; give a text file (plain or .gz)")]
    NotAFile {
        /// The path given.
        path: PathBuf,
    },

    /// A corpus file holds no text (only whitespace, or nothing).
    #[error("corpus file `{path}` is empty")]
    EmptyCorpus {
        /// The corpus file.
        path: PathBuf,
    },

    /// A corpus file is not valid UTF-8 (after gzip decompression for `.gz`).
    #[error("corpus file `{path}` is not valid UTF-8: {source}")]
    NotUtf8 {
        /// The corpus file.
        path: PathBuf,
        /// Where the first invalid byte sequence is.
        #[source]
        source: std::string::FromUtf8Error,
    },

    /// A tokenizer file could not be parsed as a `tokenizer.json`.
    #[error("cannot load tokenizer file `{path}`: {source}")]
    TokenizerLoad {
        /// The tokenizer file.
        path: PathBuf,
        /// The error reported by the `tokenizers` crate.
        #[source]
        source: tokenizers::Error,
    },

    /// A tokenizer could not be serialised for saving to `path`.
    #[error("cannot serialise tokenizer for `{path}`: {source}")]
    TokenizerSave {
        /// The file the tokenizer was to be saved to.
        path: PathBuf,
        /// The error reported by the `tokenizers` crate.
        #[source]
        source: tokenizers::Error,
    },

    /// The requested vocabulary is smaller than the byte alphabet plus special tokens.
    #[error(
        "vocab_size {requested} is too small: a byte-level BPE needs at least {minimum} tokens"
    )]
    VocabTooSmall {
        /// The requested `vocab_size` (tokens).
        requested: usize,
        /// 256 byte tokens + the special tokens.
        minimum: usize,
    },

    /// The training text ran out of mergeable pairs before reaching `vocab_size`.
    #[error(
        "training text ({text_bytes} bytes) only supports a vocabulary of {learned} tokens, \
         {requested} were requested; use more text or a smaller vocab_size"
    )]
    CorpusTooSmallForVocab {
        /// The requested `vocab_size` (tokens).
        requested: usize,
        /// The vocabulary size actually learned (tokens).
        learned: usize,
        /// Size of the training text in bytes.
        text_bytes: usize,
    },

    /// BPE training failed inside the `tokenizers` crate.
    #[error("BPE training failed: {source}")]
    TokenizerTrain {
        /// The error reported by the `tokenizers` crate.
        #[source]
        source: tokenizers::Error,
    },

    /// Encoding text into token ids failed inside the `tokenizers` crate.
    #[error("encoding text ({text_bytes} bytes) failed: {source}")]
    Encode {
        /// Size of the text being encoded, in bytes.
        text_bytes: usize,
        /// The error reported by the `tokenizers` crate.
        #[source]
        source: tokenizers::Error,
    },

    /// An argument is outside its valid range.
    #[error("invalid {name} = {value}: {reason}")]
    InvalidArgument {
        /// The argument's name, e.g. "val_fraction".
        name: &'static str,
        /// The value given, formatted.
        value: String,
        /// What the valid range is.
        reason: &'static str,
    },

    /// One side of a train/validation split would be too short.
    #[error(
        "{part} split would have {len} tokens (of {total}), fewer than the minimum {min_len}; \
         use a longer corpus or change val_fraction"
    )]
    SplitTooShort {
        /// "train" or "val".
        part: &'static str,
        /// Tokens the part would get.
        len: usize,
        /// The minimum number of tokens asked for.
        min_len: usize,
        /// Total tokens being split.
        total: usize,
    },

    /// A token stream is too short to cut even one window of `seq_len + 1` tokens.
    #[error("{what} has {tokens_len} tokens, too few for one window of seq_len {seq_len} + 1")]
    TooFewTokens {
        /// Which stream, e.g. "token stream" or "sampler state".
        what: &'static str,
        /// Tokens available.
        tokens_len: usize,
        /// Requested sequence length (tokens per row).
        seq_len: usize,
    },

    /// A token shard set is damaged, truncated or foreign: its index, its
    /// tokenizer or one of its shards does not match what the index says.
    #[error("{path}: {reason}")]
    BadShardSet {
        /// The file at fault (`index.json`, `tokenizer.json` or a shard).
        path: PathBuf,
        /// What is wrong and what was expected.
        reason: String,
    },

    /// A token id is not below the vocabulary it must index (the shard
    /// set's tokenizer's, or the model's when a batch is drawn).
    #[error("token id {id} at {at} is outside the vocabulary of {vocab_size} tokens ({whose})")]
    OutOfVocab {
        /// The id found.
        id: u32,
        /// The vocabulary's size (tokens).
        vocab_size: usize,
        /// Whose vocabulary: "the model's", "the shard set's tokenizer's".
        whose: &'static str,
        /// Where the id is: the shard and the token's offset in it, or the
        /// position in the stream.
        at: String,
    },

    /// A line of a JSON-lines input is not a JSON object with the text field.
    #[error("{path}:{line}: {reason}")]
    BadJsonLine {
        /// The input file.
        path: PathBuf,
        /// The line number, from 1.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}
