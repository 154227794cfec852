//! `ferrotron generate`: continue a prompt with a run's or a Hugging Face model.

use ferrotron_engine::backend::BackendKind;
use ferrotron_models::ops::TrainBackend;
use ferrotron_models::{generate as decode, SamplingConfig};

use crate::args::GenerateArgs;
use crate::error::usage;
use crate::source::ModelSource;
use ferrotron_job::sample;
use ferrotron_job::{dispatch, parse_backend, BackendTask};

/// Runs `ferrotron generate`.
///
/// With `--prompt-ids` prints the new token ids as a JSON array; otherwise
/// prints the prompt text and its continuation (needs a tokenizer).
pub fn generate(args: GenerateArgs) -> anyhow::Result<()> {
    let source = ModelSource::read(args.run.as_deref(), args.hf_dir.as_deref())?;
    let backend = args
        .backend
        .clone()
        .unwrap_or_else(|| source.backend.clone());
    let kind: BackendKind = parse_backend(&backend)?;
    if args.temperature < 0.0 {
        return Err(usage(format!(
            "--temperature must be non-negative, got {}",
            args.temperature
        )));
    }
    let prompt = match &args.prompt_ids {
        Some(ids) => {
            if ids.is_empty() {
                return Err(usage("--prompt-ids: give at least one token id"));
            }
            source.check_ids(ids, "--prompt-ids")?;
            Prompt::Ids(ids.clone())
        }
        None => Prompt::Text(Box::new(source.tokenizer("--prompt")?)),
    };
    dispatch(
        kind,
        0,
        GenerateTask {
            args,
            source,
            prompt,
        },
    )
}

enum Prompt {
    Ids(Vec<u32>),
    Text(Box<ferrotron_engine::data::Tokenizer>),
}

struct GenerateTask {
    args: GenerateArgs,
    source: ModelSource,
    prompt: Prompt,
}

impl BackendTask for GenerateTask {
    type Output = ();

    fn run<B: TrainBackend>(self, _: BackendKind, device: B::Device) -> anyhow::Result<()> {
        let model = self.source.model::<B::InnerBackend>(&device)?;
        let sampling = SamplingConfig {
            temperature: if self.args.greedy {
                0.0
            } else {
                self.args.temperature
            },
            top_k: self.args.top_k,
            seed: self.args.seed,
        };
        let stop: &[u32] = if self.args.ignore_eos {
            &[]
        } else {
            &self.source.special.eos
        };
        match &self.prompt {
            Prompt::Ids(ids) => {
                let new = decode(
                    &model,
                    ids,
                    self.args.max_new_tokens,
                    &sampling,
                    stop,
                    true,
                    &device,
                );
                println!("{}", serde_json::to_string(&new)?);
            }
            Prompt::Text(tokenizer) => {
                let text = sample(
                    &model,
                    tokenizer,
                    &self.args.prompt,
                    self.args.max_new_tokens,
                    &sampling,
                    stop,
                    &device,
                )?;
                println!("{text}");
            }
        }
        Ok(())
    }
}
