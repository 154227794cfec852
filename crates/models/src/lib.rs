//! Ferrotron architectures.
//!
//! One configurable decoder ([`Decoder`]) covers GPT-2, Llama 2/3 and BLOOM;
//! a family is a [`DecoderConfig`], and [`presets`] holds the published shapes
//! and small CPU-sized ones.

pub mod config;
pub mod context_parallel;
pub mod decoder;
pub mod generate;
pub mod hf;
pub mod init;
pub mod layers;
pub mod ops;
pub mod part;
pub mod presets;
pub mod rope_scaling;
pub mod tensor_parallel;

pub use config::{ConfigError, DecoderConfig, Kernels, MlpKind, NormKind, Position};
pub use decoder::{Decoder, KvCache};
/// The attention kernels a model asks for on the matrix units
/// ([`DecoderConfig::attention_matrix_units`]).
pub use ferrotron_kernels::attention::MatrixUnits;
pub use generate::{generate, SamplingConfig};
pub use part::{ModelPart, PartError};
pub use rope_scaling::RopeScaling;
