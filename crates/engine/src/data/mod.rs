//! Data pipeline: text corpus → byte-level BPE tokens → train/validation
//! split → batches of `[batch, seq_len]` next-token windows.
//!
//! - [`embedded_corpus`] / [`read_corpus`]: the built-in Shakespeare corpus or a
//!   user text file (plain or `.gz`).
//! - [`train_bpe`] / [`load_or_train`] / [`encode`]: a GPT-2 style byte-level BPE
//!   tokenizer, trained deterministically and cached as `tokenizer.json`.
//! - [`split`]: last fraction of the token stream as validation.
//! - [`BatchSampler`] / [`eval_batches`]: seeded random training windows that can
//!   resume from a checkpoint, and contiguous evaluation windows.

mod corpus;
mod error;
mod sampler;
mod split;
mod tokenizer;

pub use corpus::{embedded_corpus, read_corpus, EMBEDDED_CORPUS_GZ};
pub use error::DataError;
pub use sampler::{eval_batches, Batch, BatchSampler, SamplerState};
pub use split::{split, TokenSplit};
pub use tokenizer::{encode, load_or_train, train_bpe, END_OF_TEXT, MIN_VOCAB_SIZE};
/// The tokenizer type returned by [`train_bpe`] and [`load_or_train`]
/// (re-exported so callers need not depend on `tokenizers` directly).
pub use tokenizers::Tokenizer;
