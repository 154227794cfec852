//! Hugging Face interop: read and write `transformers` model directories.
//!
//! A model directory holds `config.json` (`GPT2LMHeadModel`,
//! `LlamaForCausalLM` or `BloomForCausalLM`), the weights as
//! `model.safetensors` or shards listed in `model.safetensors.index.json`,
//! and optionally `tokenizer.json`.
//!
//! - [`config`]: `config.json` to and from [`DecoderConfig`](crate::DecoderConfig).
//! - [`names`]: the table from our parameter names to Hugging Face tensor
//!   names and layouts, per family.
//! - [`import`]: [`load_hf_dir`], a directory to our named tensors;
//!   [`read_hf_dir`], the same without the weights' values.
//! - [`slice`]: [`load_hf_part`], only a rank's part of a directory's
//!   weights, read from the memory-mapped files ([`HfPartSource`]: any
//!   range of it, a ZeRO-3 rank's pieces).
//! - [`export`]: [`save_hf_dir`], our named tensors to a directory, and
//!   [`stream_hf_dir`], the same fed one tensor at a time; [`stream`]
//!   writes the weights tensor by tensor, in shards planned as [`shards`]
//!   says (as `save_pretrained` splits them).
//! - [`generation`]: the begin- and end-of-sequence ids.

pub mod config;
pub mod export;
pub mod generation;
pub mod import;
pub mod names;
mod rope;
pub mod shards;
pub mod slice;
pub mod stream;

pub use config::{from_hf_config, to_hf_config, Family};
pub use export::{save_hf_dir, stream_hf_dir, ExportOptions};
pub use generation::SpecialTokens;
pub use import::{convert_to_ours, load_hf_dir, read_hf_dir, HfDir, HfModel};
pub use slice::{load_hf_part, HfPartSource};
pub use stream::export_order;

/// Everything that can be wrong with a Hugging Face model directory or an export.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    /// A file could not be read or written.
    #[error("{path}: {message}")]
    Io {
        /// File involved.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// `config.json` names an architecture we do not implement.
    #[error("{path}: unsupported architecture {found}; supported: GPT2LMHeadModel, LlamaForCausalLM, BloomForCausalLM")]
    Architecture {
        /// The config file.
        path: String,
        /// The `architectures` / `model_type` found.
        found: String,
    },
    /// A field of `config.json` is missing, of the wrong type, or has a value we
    /// do not support.
    #[error("{path}: field '{field}' {problem}")]
    Field {
        /// The config file.
        path: String,
        /// The offending field.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A tensor the model needs is absent from the weights.
    #[error("{path}: tensor '{name}' is missing")]
    MissingTensor {
        /// Weights file or directory.
        path: String,
        /// Hugging Face tensor name.
        name: String,
    },
    /// A tensor has another shape than the config implies.
    #[error("{path}: tensor '{name}' has shape {found:?}, the config implies {expected:?}")]
    TensorShape {
        /// Weights file.
        path: String,
        /// Hugging Face tensor name.
        name: String,
        /// Shape in the file.
        found: Vec<usize>,
        /// Shape the config implies.
        expected: Vec<usize>,
    },
    /// The weights hold tensors that belong to no parameter.
    #[error("{path}: unexpected tensor(s): {names}")]
    UnexpectedTensors {
        /// Weights file or directory.
        path: String,
        /// Comma-separated names.
        names: String,
    },
    /// The tokenizer knows more ids than the model has embeddings.
    #[error(
        "{path}: tokenizer vocabulary ({tokenizer}) does not fit the model's vocab_size ({model})"
    )]
    VocabMismatch {
        /// The tokenizer file.
        path: String,
        /// Ids the tokenizer can produce.
        tokenizer: usize,
        /// `vocab_size` of the model.
        model: usize,
    },
    /// Our configuration has no Hugging Face equivalent.
    #[error("cannot export: {0}")]
    NotExportable(String),
    /// A rank's part (TP degree, pipeline stage) that the model cannot take.
    #[error("the model cannot take this layout: {0}")]
    Layout(String),
}
