//! `ferrotron bench`: `bench train` measures the training step end to end
//! on each compiled backend (every build); `bench kernels` compares the
//! fused CubeCL kernels with the plain Burn reference on each compiled
//! backend (needs the `kernels-bench` cargo feature); `bench comm`
//! compares one rank's collectives on device buffers with the host copy
//! path.

#[cfg(feature = "kernels-bench")]
mod alloc;
#[cfg(feature = "kernels-bench")]
mod cases;
pub mod comm;
#[cfg(feature = "kernels-bench")]
mod cube;
#[cfg(feature = "kernels-bench")]
mod fused;
#[cfg(feature = "kernels-bench")]
mod kernels;
mod output;
#[cfg(feature = "kernels-bench")]
mod reference;
#[cfg(feature = "kernels-bench")]
mod report;
#[cfg(feature = "kernels-bench")]
mod target;
#[cfg(feature = "kernels-bench")]
mod torch;
pub mod train;

use anyhow::Result;

use crate::args::{BenchArgs, BenchCommand};

/// Runs one `bench` subcommand.
pub fn bench(args: BenchArgs) -> Result<()> {
    match args.command {
        BenchCommand::Kernels(a) => run_kernels(a),
        BenchCommand::Train(a) => train::bench(*a),
        BenchCommand::Comm(a) => comm::run(a),
    }
}

#[cfg(feature = "kernels-bench")]
fn run_kernels(args: crate::args::KernelsBenchArgs) -> Result<()> {
    kernels::run(args)
}

#[cfg(not(feature = "kernels-bench"))]
fn run_kernels(_: crate::args::KernelsBenchArgs) -> Result<()> {
    Err(crate::error::usage(
        "`bench kernels` is not compiled in: build with `--features kernels-bench` (cargo feature of ferrotron-cli)",
    ))
}
