//! `bench train --compare`: result files of several runs (machines,
//! backends, PyTorch) merged into one table, one JSON and one chart.

use super::args::TrainBenchArgs;
use super::record::{ResultFile, SCHEMA};
use super::{table, write_outputs};
use crate::error::usage;

/// Reads every `--compare` file (all before anything is written), prints
/// the merged table and writes `--json` and `--chart` if asked.
pub fn run(args: &TrainBenchArgs) -> anyhow::Result<()> {
    let running = args.preset.is_some()
        || args.hf_dir.is_some()
        || args.family.is_some()
        || args.backends.is_some();
    if running {
        return Err(usage(
            "--compare merges result files: give no model (--preset, --hf-dir, --family) or --backends with it",
        ));
    }
    let mut merged = ResultFile {
        schema: SCHEMA.into(),
        results: Vec::new(),
        skipped: Vec::new(),
    };
    for path in &args.compare {
        let file = ResultFile::read(path, "--compare")?;
        merged.results.extend(file.results);
        merged.skipped.extend(file.skipped);
    }
    if merged.results.is_empty() {
        return Err(usage("--compare: the files hold no results"));
    }
    print!("{}", table::render(&merged.results, &merged.skipped));
    write_outputs(args, &merged)
}
