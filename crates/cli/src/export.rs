//! `ferrotron export`: write a model as a Hugging Face model directory.
//!
//! From a run with checkpoints (`--run RUN`), the latest sharded checkpoint
//! is read one whole tensor at a time (its blocks assembled, whatever
//! layout wrote it) into the streaming writer, so no more than one output
//! shard and one tensor are held. A run without checkpoints
//! (`--save-every 0`) and `--hf-dir` export the weights they hold whole.

use std::path::Path;

use burn::tensor::TensorData;
use ferrotron_engine::checkpoint::FloatDtype;
use ferrotron_models::hf::{export_order, save_hf_dir, stream_hf_dir, ExportOptions, HfError};
use ferrotron_parallel::train::checkpoint::read::Reader;
use ferrotron_parallel::train::checkpoint::region::Region;
use ferrotron_parallel::train::checkpoint::{resolve, LATEST};

use crate::args::ExportArgs;
use crate::error::usage;
use crate::source::{ModelSource, RunModel};

/// Runs `ferrotron export`.
pub fn export(args: ExportArgs) -> anyhow::Result<()> {
    if let (Some(run), None) = (args.run.as_deref(), args.hf_dir.as_deref()) {
        if run.join("checkpoints").join(LATEST).exists() {
            return from_checkpoint(run, &args);
        }
    }
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

/// Streams the latest checkpoint of `run` into `args.out`. Every parameter
/// is checked against the index (present, of the config's shape) before
/// anything is written; a damaged block found while streaming removes what
/// was written.
fn from_checkpoint(run: &Path, args: &ExportArgs) -> anyhow::Result<()> {
    let model = RunModel::read(run)?;
    let bad = |e: &dyn std::fmt::Display| usage(format!("--run {}: {e}", run.display()));
    let dir = resolve(run).map_err(|e| bad(&e))?;
    let mut reader = Reader::open(&dir).map_err(|e| bad(&e))?;
    for (name, shape) in export_order(&model.config).map_err(|e| bad(&e))? {
        match reader.index().tensors.get(&name) {
            Some(t) if t.shape == shape => {}
            Some(t) => {
                return Err(bad(&format!(
                    "{}: tensor '{name}' has shape {:?}, the run's model has {shape:?}",
                    dir.join("index.json").display(),
                    t.shape
                )))
            }
            None => {
                return Err(bad(&format!(
                    "{}: the checkpoint has no tensor '{name}'",
                    dir.join("index.json").display()
                )))
            }
        }
    }
    check_out_dir(&args.out, "--out")?;
    let options = ExportOptions {
        dtype: args.dtype.unwrap_or(FloatDtype::F32),
        max_shard_size: args.max_shard_size,
        special: model.special.clone(),
    };
    let mut source = |name: &str| {
        let shape = reader.index().tensors[name].shape.clone();
        let whole = Region::whole(vec![0; shape.len()], shape.clone());
        reader
            .read(name, &shape, &whole)
            .map(|values| TensorData::new(values, shape))
            .map_err(|e| HfError::NotExportable(e.to_string()))
    };
    let existed = args.out.exists();
    let written = stream_hf_dir(
        &args.out,
        &model.config,
        &mut source,
        model.tokenizer.as_deref(),
        &options,
    );
    if let Err(e) = written {
        // Nothing is left behind: the directory was new or empty.
        let _ = std::fs::remove_dir_all(&args.out);
        if existed {
            let _ = std::fs::create_dir(&args.out);
        }
        return Err(usage(e.to_string()));
    }
    println!("wrote {} from {}", args.out.display(), dir.display());
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
