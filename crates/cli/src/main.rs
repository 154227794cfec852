//! The `ferrotron` command.

mod args;
mod dispatch;
mod error;
mod generate;
mod run_config;
mod settings;
mod train;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command};
use crate::error::UsageError;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train(a) => train::train(*a),
        Command::Generate(a) => generate::generate(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<UsageError>().is_some() => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
