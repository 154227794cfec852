//! `ferrotron export`: write a model as a Hugging Face model directory.

use std::path::Path;

use ferrotron_models::hf::{save_hf_dir, ExportOptions};

use crate::args::ExportArgs;
use crate::error::usage;
use crate::source::ModelSource;

/// Runs `ferrotron export`.
pub fn export(args: ExportArgs) -> anyhow::Result<()> {
    let source = ModelSource::read(args.run.as_deref(), args.hf_dir.as_deref())?;
    check_out_dir(&args.out, "--out")?;
    let tensors: Vec<_> = source.tensors.clone().into_iter().collect();
    let options = ExportOptions {
        dtype: args.dtype.unwrap_or(source.dtype),
        max_shard_size: args.max_shard_size,
        special: source.special.clone(),
    };
    save_hf_dir(
        &args.out,
        &source.config,
        &tensors,
        source.tokenizer.as_deref(),
        &options,
    )
    .map_err(|e| usage(e.to_string()))?;
    println!("wrote {}", args.out.display());
    Ok(())
}

/// Errors (naming `flag`) unless `dir` is new or empty.
pub fn check_out_dir(dir: &Path, flag: &str) -> anyhow::Result<()> {
    if std::fs::read_dir(dir)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
    {
        return Err(usage(format!(
            "{flag} {}: directory is not empty; choose a new directory",
            dir.display()
        )));
    }
    Ok(())
}
