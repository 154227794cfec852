//! `ferrotron generate`: sample text from a trained run.

use burn::tensor::backend::AutodiffBackend;
use ferrotron_engine::backend::BackendKind;
use ferrotron_engine::checkpoint::load_safetensors;
use ferrotron_engine::data::Tokenizer;
use ferrotron_engine::params::load_named_tensors;
use ferrotron_models::{Decoder, SamplingConfig};

use crate::args::GenerateArgs;
use crate::dispatch::{dispatch, BackendTask};
use crate::error::usage;
use crate::run_config::RunConfig;
use crate::train::sample;

/// Runs `ferrotron generate`.
pub fn generate(args: GenerateArgs) -> anyhow::Result<()> {
    let config = RunConfig::read(&args.run)?;
    let backend = args
        .backend
        .clone()
        .unwrap_or_else(|| config.train.backend.clone());
    let kind: BackendKind = backend
        .parse()
        .map_err(|e| usage(format!("--backend: {e}")))?;
    if args.temperature < 0.0 {
        return Err(usage(format!(
            "--temperature must be non-negative, got {}",
            args.temperature
        )));
    }
    dispatch(kind, GenerateTask { args, config })
}

struct GenerateTask {
    args: GenerateArgs,
    config: RunConfig,
}

impl BackendTask for GenerateTask {
    type Output = ();

    fn run<B: AutodiffBackend>(self, _: BackendKind, device: B::Device) -> anyhow::Result<()> {
        let run = &self.args.run;
        let tok_path = run.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&tok_path)
            .map_err(|e| usage(format!("{}: {e}", tok_path.display())))?;
        let weights_path = run.join("model.safetensors");
        let weights = load_safetensors(&weights_path).map_err(|e| usage(e.to_string()))?;
        let model = Decoder::<B::InnerBackend>::new(&self.config.model, 0, &device)?;
        let model = load_named_tensors(model, weights, &weights_path.display().to_string())
            .map_err(|e| usage(e.to_string()))?;
        let sampling = SamplingConfig {
            temperature: self.args.temperature,
            top_k: self.args.top_k,
            seed: self.args.seed,
        };
        let text = sample(
            &model,
            &tokenizer,
            &self.args.prompt,
            self.args.max_new_tokens,
            &sampling,
            &device,
        )?;
        println!("{text}");
        Ok(())
    }
}
