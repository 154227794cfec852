//! `ferrotron bench train`: end-to-end training-step throughput.
//!
//! One step is what `ferrotron train` does per optimizer step on one rank:
//! forward, backward, global-norm clipping and AdamW through
//! `ferrotron_parallel::train::Trainer`, on random token ids of
//! `--batch x --seq`, with a model initialised by the project's seeded
//! init. Each compiled backend with a device runs `--warmup` untimed steps
//! then `--steps` timed ones; the median step time gives tokens/s, the
//! model's FLOPs per token (`DecoderConfig::train_flops_per_token`,
//! Megatron's count) give TFLOP/s, and MFU divides by the device peak.

pub mod args;
mod chart;
mod compare;
mod host;
mod model;
mod record;
mod run;
mod table;

use ferrotron_engine::checkpoint::write_atomic;

pub use self::args::TrainBenchArgs;
use self::record::ResultFile;
use super::output::check_output;

/// Runs `bench train`: a measurement, or with `--compare` a merge.
pub fn bench(args: TrainBenchArgs) -> anyhow::Result<()> {
    for (flag, path) in [("--json", &args.json), ("--chart", &args.chart)] {
        if let Some(path) = path {
            check_output(flag, path, &args.compare)?;
        }
    }
    if args.compare.is_empty() {
        run::run(&args)
    } else {
        compare::run(&args)
    }
}

/// Writes `--json` and `--chart` of `file` where asked (atomically).
fn write_outputs(args: &TrainBenchArgs, file: &ResultFile) -> anyhow::Result<()> {
    if let Some(path) = &args.json {
        write_atomic(path, serde_json::to_string_pretty(file)?.as_bytes())?;
        eprintln!("bench train: results written to {}", path.display());
    }
    if let Some(path) = &args.chart {
        let bars: Vec<(String, f64)> = file
            .results
            .iter()
            .map(|r| {
                (
                    format!(
                        "{} {} {} | {} | {} | {}x{}",
                        r.framework,
                        r.backend,
                        r.precision,
                        r.device,
                        table::model_label(r),
                        r.batch,
                        r.seq
                    ),
                    r.tokens_per_s,
                )
            })
            .collect();
        let svg = chart::bars_svg("Training-step throughput", &bars);
        write_atomic(path, svg.as_bytes())?;
        eprintln!("bench train: chart written to {}", path.display());
    }
    Ok(())
}
