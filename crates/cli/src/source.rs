//! Where a model comes from: a run directory (`--run`) or a Hugging Face
//! model directory (`--hf-dir`). Everything is read and checked before a
//! backend is chosen, so bad input exits with code 2 before any work.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::tensor::TensorData;
use ferrotron_engine::checkpoint::{load_safetensors, FloatDtype};
use ferrotron_engine::data::Tokenizer;
use ferrotron_engine::params::load_named_tensors;
use ferrotron_models::hf::{load_hf_dir, SpecialTokens};
use ferrotron_models::ops::KernelBackend;
use ferrotron_models::{Decoder, DecoderConfig};

use crate::error::usage;
use ferrotron_job::run_files::read_run_files;

/// A model read from disk: its shape, weights (our names) and tokenizer.
pub struct ModelSource {
    /// The architecture.
    pub config: DecoderConfig,
    /// Every parameter under our name.
    pub tensors: BTreeMap<String, TensorData>,
    /// `tokenizer.json`, when the directory has one.
    pub tokenizer: Option<PathBuf>,
    /// The backend the run was trained on (`flex` for Hugging Face directories).
    pub backend: String,
    /// The directory, for error messages.
    pub name: String,
    /// The dtype the weights were stored in (f32 for runs).
    pub dtype: FloatDtype,
    /// Begin- and end-of-sequence ids (runs: the tokenizer's `<|endoftext|>`).
    pub special: SpecialTokens,
}

/// What a run directory says of its model besides the weights.
pub struct RunModel {
    /// The architecture.
    pub config: DecoderConfig,
    /// `tokenizer.json`, when the run has one.
    pub tokenizer: Option<PathBuf>,
    /// Begin and end of sequence: those of the Hugging Face model the run
    /// started from, else the tokenizer's `<|endoftext|>` as both.
    pub special: SpecialTokens,
    /// The backend the run was trained on.
    pub backend: String,
}

impl RunModel {
    /// Reads the run directory `run`; errors name `--run` or the file.
    pub fn read(run: &Path) -> anyhow::Result<Self> {
        let (job, record) =
            read_run_files(run).map_err(|e| usage(format!("--run {}: {e}", run.display())))?;
        let tok = run.join("tokenizer.json");
        let special = match &record.special {
            Some(special) => special.clone(),
            None if tok.exists() => {
                let t = Tokenizer::from_file(&tok)
                    .map_err(|e| usage(format!("{}: {e}", tok.display())))?;
                SpecialTokens::from_tokenizer(&t)
            }
            None => SpecialTokens::default(),
        };
        Ok(Self {
            config: record.model,
            tokenizer: tok.exists().then_some(tok),
            special,
            backend: job.backend.name,
        })
    }
}

impl ModelSource {
    /// Reads exactly one of `--run` or `--hf-dir`.
    pub fn read(run: Option<&Path>, hf_dir: Option<&Path>) -> anyhow::Result<Self> {
        match (run, hf_dir) {
            (Some(run), None) => {
                let m = RunModel::read(run)?;
                let weights = run.join("model.safetensors");
                let tensors = load_safetensors(&weights).map_err(|e| usage(e.to_string()))?;
                Ok(Self {
                    config: m.config,
                    tensors,
                    tokenizer: m.tokenizer,
                    backend: m.backend,
                    name: weights.display().to_string(),
                    dtype: FloatDtype::F32,
                    special: m.special,
                })
            }
            (None, Some(dir)) => {
                let hf = load_hf_dir(dir)
                    .map_err(|e| usage(format!("--hf-dir {}: {e}", dir.display())))?;
                Ok(Self {
                    config: hf.config,
                    tensors: hf.tensors,
                    tokenizer: hf.tokenizer,
                    backend: "flex".into(),
                    name: dir.display().to_string(),
                    dtype: hf.dtype,
                    special: hf.special,
                })
            }
            _ => Err(usage("give exactly one of --run DIR or --hf-dir DIR")),
        }
    }

    /// The tokenizer, or a usage error naming `flag` when there is none.
    pub fn tokenizer(&self, flag: &str) -> anyhow::Result<Tokenizer> {
        let path = self.tokenizer.as_ref().ok_or_else(|| {
            usage(format!(
                "{flag}: {} has no tokenizer.json; give token ids instead",
                self.name
            ))
        })?;
        Tokenizer::from_file(path).map_err(|e| usage(format!("{}: {e}", path.display())))
    }

    /// Builds the model on `device` with the weights.
    pub fn model<B: KernelBackend>(&self, device: &B::Device) -> anyhow::Result<Decoder<B>> {
        let model = Decoder::<B>::new(&self.config, 0, device)?;
        load_named_tensors(model, self.tensors.clone(), &self.name)
            .map_err(|e| usage(e.to_string()))
    }

    /// Checks that every id is inside the vocabulary; the error names `what`.
    pub fn check_ids(&self, ids: &[u32], what: &str) -> anyhow::Result<()> {
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= self.config.vocab_size) {
            return Err(usage(format!(
                "{what}: token id {bad} is outside the model's vocabulary (vocab_size {})",
                self.config.vocab_size
            )));
        }
        Ok(())
    }
}
