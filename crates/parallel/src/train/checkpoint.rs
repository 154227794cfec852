//! Complete checkpoints of a run: `RUN/checkpoints/step-N/` holds
//!
//! | file | what |
//! |---|---|
//! | `model.safetensors` | every parameter, unsharded, f32 |
//! | `optimizer.safetensors` | AdamW's moments `m.NAME` / `v.NAME`, unsharded (gathered from the ZeRO shards) |
//! | `state.json` | the step, AdamW's update count, the sampler's position ([`CheckpointState`]) |
//! | extra files | what the caller adds (`ferrotron train`: the resolved `config.toml`) |
//!
//! Written by rank 0 into `checkpoints/.step-N.tmp`, every file synced to
//! disk, the directory renamed to `step-N` and the parent directory synced;
//! then `checkpoints/latest` (the name of the newest directory) is replaced
//! atomically, and directories beyond the newest `keep` are deleted. A
//! crash at any point leaves `latest` naming a complete checkpoint.
//!
//! The optimizer state is gathered, not written per rank: a checkpoint
//! loads on any DP size and ZeRO stage (each rank keeps its part), at the
//! cost of rank 0 holding the whole state while writing.

use std::fs;
use std::path::{Path, PathBuf};

use ferrotron_engine::checkpoint::{save_safetensors, write_atomic, CheckpointError};
use ferrotron_engine::data::SamplerState;
use serde::{Deserialize, Serialize};

use super::loss_scale::LossScaler;
use super::step::TrainerState;

/// Name of the file in `checkpoints/` that names the newest checkpoint.
pub const LATEST: &str = "latest";

/// `state.json` of a checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointState {
    /// Optimizer steps taken (skipped ones included): the run continues
    /// with step `step + 1`.
    pub step: usize,
    /// Updates AdamW has applied.
    pub optimizer_steps: u64,
    /// Where the batch sampler stands, if the batches come from one.
    pub sampler: Option<SamplerState>,
    /// The dynamic loss scaler's state, when the run scales its loss (fp16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scaler: Option<LossScaler>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Syncs a directory, so that renames inside it are on disk.
fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

/// The step number of a checkpoint directory name `step-N`.
fn step_of(name: &str) -> Option<usize> {
    name.strip_prefix("step-")?.parse().ok()
}

/// Writes the checkpoint of `state` (with `sampler`, and `extra` files
/// `(name, bytes)`) into `root` (a run's `checkpoints/`), points `latest`
/// at it and keeps the newest `keep` checkpoints (at least 1). Returns its
/// directory.
pub fn write(
    root: &Path,
    state: &TrainerState,
    sampler: Option<SamplerState>,
    extra: &[(String, Vec<u8>)],
    keep: usize,
) -> Result<PathBuf, CheckpointError> {
    let name = format!("step-{}", state.steps_done);
    let dir = root.join(&name);
    let tmp = root.join(format!(".{name}.tmp"));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    save_safetensors(&tmp.join("model.safetensors"), &state.model)?;
    save_safetensors(&tmp.join("optimizer.safetensors"), &state.moments)?;
    let meta = CheckpointState {
        step: state.steps_done,
        optimizer_steps: state.optimizer_steps,
        sampler,
        loss_scaler: state.loss_scaler,
    };
    let json = serde_json::to_vec_pretty(&meta).expect("the checkpoint state serialises");
    write_atomic(&tmp.join("state.json"), &json)?;
    for (file, bytes) in extra {
        write_atomic(&tmp.join(file), bytes)?;
    }
    sync_dir(&tmp)?;
    if dir.exists() {
        // A resumed run writing a step it had written before: the old one
        // goes only once the new one is complete.
        let old = root.join(format!(".{name}.old"));
        fs::rename(&dir, &old).map_err(io(&dir))?;
        fs::rename(&tmp, &dir).map_err(io(&tmp))?;
        fs::remove_dir_all(&old).map_err(io(&old))?;
    } else {
        fs::rename(&tmp, &dir).map_err(io(&tmp))?;
    }
    sync_dir(root)?;
    write_atomic(&root.join(LATEST), format!("{name}\n").as_bytes())?;
    prune(root, keep.max(1), state.steps_done)?;
    Ok(dir)
}

/// Deletes all but the newest `keep` checkpoints of `root`, never `latest`.
fn prune(root: &Path, keep: usize, latest: usize) -> Result<(), CheckpointError> {
    let mut steps: Vec<usize> = fs::read_dir(root)
        .map_err(io(root))?
        .filter_map(|e| e.ok())
        .filter_map(|e| step_of(&e.file_name().to_string_lossy()))
        .collect();
    steps.sort_unstable();
    let excess = steps.len().saturating_sub(keep);
    for step in steps.into_iter().take(excess).filter(|&s| s != latest) {
        let dir = root.join(format!("step-{step}"));
        fs::remove_dir_all(&dir).map_err(io(&dir))?;
    }
    Ok(())
}

/// The checkpoint directory `path` names: a run directory (its latest
/// checkpoint), its `checkpoints/` directory, or a `step-N` directory.
/// Errors name the file that is missing or wrong.
pub fn resolve(path: &Path) -> Result<PathBuf, CheckpointError> {
    let root = if path.join(LATEST).is_file() {
        path.to_path_buf()
    } else if path.join("checkpoints").join(LATEST).is_file() {
        path.join("checkpoints")
    } else if path.join("state.json").is_file() {
        return Ok(path.to_path_buf());
    } else {
        return Err(CheckpointError::Format {
            path: path.display().to_string(),
            message: "no checkpoint here: neither checkpoints/latest nor state.json exists".into(),
        });
    };
    let latest = root.join(LATEST);
    let name = fs::read_to_string(&latest).map_err(io(&latest))?;
    let name = name.trim();
    if step_of(name).is_none() {
        return Err(CheckpointError::Format {
            path: latest.display().to_string(),
            message: format!("'{name}' is not a checkpoint name (step-N)"),
        });
    }
    Ok(root.join(name))
}

/// Reads `state.json` of the checkpoint directory `dir`.
pub fn read_state(dir: &Path) -> Result<CheckpointState, CheckpointError> {
    let path = dir.join("state.json");
    let text = fs::read_to_string(&path).map_err(io(&path))?;
    serde_json::from_str(&text).map_err(|e| CheckpointError::Format {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use burn::tensor::TensorData;

    use super::*;

    fn state(step: usize) -> TrainerState {
        TrainerState {
            model: vec![("w".into(), TensorData::new(vec![1.0f32, 2.0], [2]))],
            moments: vec![
                ("m.w".into(), TensorData::new(vec![0.5f32, 0.25], [2])),
                ("v.w".into(), TensorData::new(vec![0.1f32, 0.2], [2])),
            ],
            steps_done: step,
            optimizer_steps: step as u64,
            loss_scaler: None,
        }
    }

    #[test]
    fn checkpoints_rotate_and_latest_names_the_newest() {
        let root = std::env::temp_dir().join(format!("ferrotron-ckpt-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        for step in [2, 4, 6] {
            let extra = [("config.toml".to_string(), b"x = 1\n".to_vec())];
            write(&root, &state(step), None, &extra, 2).unwrap();
        }
        let mut names: Vec<String> = fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["latest", "step-4", "step-6"]);
        let dir = resolve(&root).unwrap();
        assert_eq!(dir, root.join("step-6"));
        assert_eq!(read_state(&dir).unwrap().step, 6);
        assert!(dir.join("config.toml").is_file());
        // The same step again (a resumed run) replaces it.
        write(&root, &state(6), None, &[], 2).unwrap();
        assert_eq!(
            read_state(&resolve(&root).unwrap())
                .unwrap()
                .optimizer_steps,
            6
        );
        fs::write(root.join(LATEST), "nonsense").unwrap();
        let e = resolve(&root).unwrap_err().to_string();
        assert!(e.contains("latest") && e.contains("nonsense"), "{e}");
        let e = resolve(&root.join("step-4").join("missing"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no checkpoint here"), "{e}");
        fs::remove_dir_all(&root).unwrap();
    }
}
