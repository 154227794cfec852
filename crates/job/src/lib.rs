//! The job layer of Ferrotron (torchtitan's `JobConfig` + `Trainer` +
//! `parallelize_llama`): what `ferrotron train` does, as a library.
//!
//! - [`JobConfig`]: every setting, by section; the TOML file and (through
//!   [`JobFlags`]) the command line, each setting declared once.
//! - [`JobConfig::validate`]: every check, all problems at once, one line
//!   each naming the key; only its [`ValidJob`] can run.
//! - [`parallelize`]: TP (+SP), recomputation, the pipeline split and the
//!   gradient sync applied to a model, in that order.
//! - [`Job::run`]: build or load the model, tokenizer and data, resume,
//!   the loop with checkpoints, export and the final sample.
//! - [`dispatch`]: runs a [`BackendTask`] on the backend named at run time.

pub mod backend;
pub mod comm;
pub mod config;
pub mod error;
mod job;
pub mod memory;
mod parallelize;
pub mod resume;
pub mod run_files;
pub mod tokens;
mod validate;

pub use backend::{check_ready, device_memory, dispatch, parse_backend, BackendTask};
pub use config::{Change, JobConfig, JobFlags, Key, KEYS, SECTIONS};
pub use error::{ConfigError, Interrupted, UsageError, INTERRUPTED_EXIT};
pub use job::{Job, PrintReport, Report};
pub use parallelize::{
    build_part, load_hf_dir_part, parallelize, parallelize_fresh, parallelize_hf_dir,
    parallelize_part, parallelize_to_load, Parallelized,
};
pub use resume::{on_resume, OnResume, Resume};
pub use validate::{ValidJob, World, DEFAULT_WARMUP_STEPS};

/// Samples text from a model (the end-of-run sample of [`Job::run`]).
pub use job::sample;
