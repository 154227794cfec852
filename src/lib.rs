//! Ferrotron: a pure-Rust engine for training large language models.
//!
//! This facade re-exports the public API of the workspace crates:
//! [`engine`] (numerics on one device: backends, optimizer, data, checkpoints,
//! metrics), [`parallel`] (process groups, data parallelism, ZeRO, the
//! training step and loop), [`models`] (the configurable decoder and its
//! presets) and [`job`] (what `ferrotron train` does: the sectioned
//! [`JobConfig`], its validation, `parallelize` and [`Job`]).
//!
//! A whole training job, as `ferrotron train` runs it:
//!
//! ```no_run
//! use ferrotron::{Job, JobConfig};
//! use ferrotron::job::{PrintReport, World};
//! let mut config = JobConfig::from_file("configs/gpt-mini.toml".as_ref())
//!     .map_err(|e| anyhow::anyhow!("{e:?}"))?;
//! config.schedule.steps = 3;
//! let valid = config.validate(&World::SINGLE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
//! Job::new(valid)?.run(&mut PrintReport)?;
//! # Ok::<(), anyhow::Error>(())
//! ```
//!
//! The pieces underneath, for a loop of your own:
//!
//! ```no_run
//! use burn::backend::{Autodiff, Flex};
//! use ferrotron::models::{presets, Decoder};
//! use ferrotron::engine::optim::{AdamWConfig, LrSchedule};
//! use ferrotron::parallel::recompute::Recompute;
//! use ferrotron::parallel::train::{self, LoopConfig, Silent, StepConfig, TokenWindows, Trainer};
//!
//! let config = presets::preset("llama-mini").unwrap();
//! let model = Decoder::<Autodiff<Flex>>::new(&config, 42, &Default::default()).unwrap();
//! let schedule = LrSchedule { max_lr: 1e-3, min_lr: 1e-4, warmup_steps: 10, total_steps: 100 };
//! let step = StepConfig { adamw: AdamWConfig::default(), schedule, grad_clip: 1.0 };
//! let mut trainer = Trainer::new(model, step, Default::default());
//! let tokens: Vec<u32> = (0..10_000).map(|i| i % 4096).collect();
//! let sampler = ferrotron::engine::data::BatchSampler::new(tokens.len(), 64, 0).unwrap();
//! let mut batches = TokenWindows { sampler, tokens: &tokens, vocab_size: config.vocab_size };
//! let val = [batches.sampler.next_batch(&tokens, 8)];
//! let plan = LoopConfig {
//!     steps: 100, micro_batch: 8, grad_accum: 1, eval_every: 50,
//!     flops_per_token: config.train_flops_per_token(64, trainer.recompute()),
//!     model_flops_per_token: config.train_flops_per_token(64, Recompute::None), peak_flops: 1e11,
//!     ..LoopConfig::default()
//! };
//! let summary = train::run(&mut trainer, &mut batches, &val, &plan, &mut Silent).unwrap();
//! println!("final validation loss {:?}", summary.validations.last());
//! ```

pub use ferrotron_engine as engine;
pub use ferrotron_job as job;
pub use ferrotron_models as models;
pub use ferrotron_parallel as parallel;

pub use ferrotron_engine::lm::CausalLm;
pub use ferrotron_job::{Job, JobConfig};
pub use ferrotron_models::{Decoder, DecoderConfig};
pub use ferrotron_parallel::train::{LoopConfig, StepConfig, StepOutput, Trainer};
