//! Ferrotron: a pure-Rust engine for training large language models.
//!
//! This facade re-exports the public API of the workspace crates:
//! [`engine`] (numerics on one device: backends, optimizer, data, checkpoints,
//! metrics), [`parallel`] (the training step executor, data parallelism, ZeRO) and [`models`] (the
//! configurable decoder and its presets).
//!
//! ```no_run
//! use burn::backend::{Autodiff, Flex};
//! use ferrotron::models::{presets, Decoder};
//! use ferrotron::engine::optim::{AdamWConfig, LrSchedule};
//! use ferrotron::parallel::trainer::{StepConfig, Trainer};
//!
//! let config = presets::preset("llama-mini").unwrap();
//! let model = Decoder::<Autodiff<Flex>>::new(&config, 42, &Default::default()).unwrap();
//! let schedule = LrSchedule { max_lr: 1e-3, min_lr: 1e-4, warmup_steps: 10, total_steps: 100 };
//! let step = StepConfig { adamw: AdamWConfig::default(), schedule, grad_clip: 1.0 };
//! let mut trainer = Trainer::new(model, step, Default::default());
//! let mut sampler = ferrotron::engine::data::BatchSampler::new(10_000, 64, 0).unwrap();
//! let tokens: Vec<u32> = (0..10_000).map(|i| i % 4096).collect();
//! let out = trainer.step(&[sampler.next_batch(&tokens, 8)]).unwrap();
//! println!("loss {}", out.loss);
//! ```

pub use ferrotron_engine as engine;
pub use ferrotron_models as models;
pub use ferrotron_parallel as parallel;

pub use ferrotron_engine::lm::CausalLm;
pub use ferrotron_models::{Decoder, DecoderConfig};
pub use ferrotron_parallel::trainer::{StepConfig, StepOutput, Trainer};
