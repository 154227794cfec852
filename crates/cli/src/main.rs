//! The `ferrotron` command.

mod args;
mod bench;
mod checkpoint;
mod data;
mod data_verify;
mod error;
mod eval;
mod export;
mod generate;
mod plan;
mod plan_emit;
mod source;
mod train;

use std::process::ExitCode;

use clap::Parser;
use ferrotron_engine::metrics::CountingAllocator;

use crate::args::{Cli, Command};
use crate::error::{Interrupted, UsageError, INTERRUPTED_EXIT};

/// Counts the heap in use, for each training step's `peak_activation_bytes`
/// on CPU backends (see `ferrotron_engine::metrics::CountingAllocator`).
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train(a) => train::train(*a),
        Command::Generate(a) => generate::generate(a),
        Command::Eval(a) => eval::eval(a),
        Command::Export(a) => export::export(a),
        Command::Plan(a) => plan::run(*a),
        Command::Bench(a) => bench::bench(a),
        Command::Data(a) => data::data(a),
        Command::Checkpoint(a) => checkpoint::checkpoint(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<UsageError>().is_some() => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(e) if e.downcast_ref::<Interrupted>().is_some() => {
            eprintln!("{e}");
            ExitCode::from(INTERRUPTED_EXIT)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
