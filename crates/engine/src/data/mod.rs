//! Data pipeline: text corpus → byte-level BPE tokens → train/validation
//! split → batches of `[batch, seq_len]` next-token windows.
//!
//! - [`embedded_corpus`] / [`read_corpus`]: the built-in Shakespeare corpus or a
//!   user text file (plain or `.gz`).
//! - [`train_bpe`] / [`encode`]: a GPT-2 style byte-level BPE tokenizer,
//!   trained deterministically, saved as `tokenizer.json`.
//! - [`split_lengths`]: the last fraction of the token stream as
//!   validation.
//! - [`TokenSource`]: a token stream by position, in memory (`Vec<u32>`) or
//!   memory-mapped ([`ShardSet`]); [`TokenRange`] a part of one.
//! - [`BatchSampler`] / [`eval_batches`]: seeded random training windows that can
//!   resume from a checkpoint, and contiguous evaluation windows, read from
//!   any [`TokenSource`].
//! - Token shards (`ferrotron data prepare`): [`prepare`] reads documents
//!   ([`for_each_document`]: text, `.gz`, JSON lines), encodes them and
//!   writes a shard set ([`ShardWriter`]: `shard-NNNNN.bin` files in the
//!   [`shard_format`] layout, `tokenizer.json`, `index.json` =
//!   [`ShardIndex`], with each shard's XXH3-64) atomically; [`ShardSet`]
//!   opens one for training, checking every shard's checksum and ids.
//! - [`Goldfish`]: the goldfish loss's hashed mask, which turns about one
//!   target in `k` of a training [`Batch`] into [`IGNORED_TARGET`].

mod corpus;
mod documents;
mod error;
mod goldfish;
mod prepare;
mod sampler;
mod shard_check;
pub mod shard_format;
mod shard_index;
mod shard_set;
mod shard_writer;
mod split;
mod tokenizer;
mod tokens;

pub use corpus::{embedded_corpus, read_corpus, EMBEDDED_CORPUS_GZ};
pub use documents::for_each_document;
pub use error::DataError;
pub use goldfish::{context_hash, Goldfish, DEFAULT_GOLDFISH_CONTEXT, IGNORED_TARGET};
pub use prepare::{
    expand_inputs, prepare, PrepareConfig, PrepareProgress, TokenizerSource, ENCODE_BATCH_BYTES,
};
pub use sampler::{eval_batches, Batch, BatchSampler, SamplerState};
pub use shard_check::{xxh3_64_file, xxh3_64_hex};
pub use shard_index::{sha256_hex, ShardEntry, ShardIndex, FORMAT, INDEX_FILE, TOKENIZER_FILE};
pub use shard_set::{ShardSet, ShardSetId};
pub use shard_writer::ShardWriter;
pub use split::split_lengths;
pub use tokenizer::{
    encode, encode_documents, end_of_text_id, save_tokenizer, train_bpe, train_bpe_documents,
    END_OF_TEXT, EOS_TOKENS, MIN_VOCAB_SIZE,
};
/// The tokenizer type returned by [`train_bpe`] (re-exported so callers
/// need not depend on `tokenizers` directly).
pub use tokenizers::Tokenizer;
pub use tokens::{check_ids, TokenRange, TokenSource};
