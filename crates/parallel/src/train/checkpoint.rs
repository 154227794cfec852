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
//! atomically, the parent directory synced again, and only then are the
//! directories beyond the newest `keep` deleted (`publish_steps`). A
//! crash at any point leaves `latest` naming a complete checkpoint. A
//! write that fails (a full disk) removes the temporary directory and
//! reports the file, the bytes the whole checkpoint needs and the system's
//! error; `latest` and the earlier checkpoints are untouched.
//!
//! The optimizer state is gathered, not written per rank: a checkpoint
//! loads on any DP size and ZeRO stage (each rank keeps its part), at the
//! cost of rank 0 holding the whole state while writing.

use std::borrow::Cow;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use burn::tensor::TensorData;
use ferrotron_engine::checkpoint::{encode_safetensors, write_atomic, CheckpointError, FloatDtype};
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

/// Test-only hook, read by [`write`] and nowhere else:
/// `FERROTRON_TEST_FAIL_CHECKPOINT_WRITE=N` makes the N-th checkpoint this
/// process writes (1: the first) fail on its second file as a full disk
/// does, so tests can check what a failed write leaves behind. Never set
/// it in a real run.
pub const FAIL_WRITE_ENV: &str = "FERROTRON_TEST_FAIL_CHECKPOINT_WRITE";

/// Checkpoints this process has started to write (for [`FAIL_WRITE_ENV`]).
static WRITES: AtomicUsize = AtomicUsize::new(0);

/// Whether [`FAIL_WRITE_ENV`] asks this checkpoint's write to fail.
fn injected_failure() -> bool {
    let n = WRITES.fetch_add(1, Ordering::SeqCst) + 1;
    std::env::var(FAIL_WRITE_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        == Some(n)
}

/// The contents of one file of a checkpoint, encoded when it is written.
enum Content<'a> {
    /// Named tensors, written as f32 safetensors.
    Tensors(&'a [(String, TensorData)]),
    /// Bytes as they are.
    Bytes(&'a [u8]),
}

impl Content<'_> {
    /// The file's bytes (`path` names it in errors).
    fn encode(&self, path: &Path) -> Result<Cow<'_, [u8]>, CheckpointError> {
        match self {
            Content::Tensors(t) => Ok(Cow::Owned(encode_safetensors(path, t, FloatDtype::F32)?)),
            Content::Bytes(b) => Ok(Cow::Borrowed(b)),
        }
    }
}

/// Writes the checkpoint of `state` (with `sampler`, and `extra` files
/// `(name, bytes)`) into `root` (a run's `checkpoints/`), points `latest`
/// at it and keeps the newest `keep` checkpoints (at least 1). Returns its
/// directory. A failed write ([`CheckpointError::Write`]) removes the
/// temporary directory and leaves `latest` and the checkpoints as they
/// were.
pub fn write(
    root: &Path,
    state: &TrainerState,
    sampler: Option<SamplerState>,
    extra: &[(String, Vec<u8>)],
    keep: usize,
) -> Result<PathBuf, CheckpointError> {
    write_with(root, state, sampler, extra, keep, injected_failure())
}

/// [`write`], failing the second file's write when `fail` is set.
fn write_with(
    root: &Path,
    state: &TrainerState,
    sampler: Option<SamplerState>,
    extra: &[(String, Vec<u8>)],
    keep: usize,
    fail: bool,
) -> Result<PathBuf, CheckpointError> {
    let name = format!("step-{}", state.steps_done);
    let tmp = root.join(format!(".{name}.tmp"));
    let meta = CheckpointState {
        step: state.steps_done,
        optimizer_steps: state.optimizer_steps,
        sampler,
        loss_scaler: state.loss_scaler,
    };
    let json = serde_json::to_vec_pretty(&meta).expect("the checkpoint state serialises");
    let mut files = vec![
        ("model.safetensors", Content::Tensors(&state.model)),
        ("optimizer.safetensors", Content::Tensors(&state.moments)),
        ("state.json", Content::Bytes(&json)),
    ];
    files.extend(extra.iter().map(|(f, b)| (f.as_str(), Content::Bytes(b))));
    if let Err(e) = write_files(&tmp, &files, fail) {
        // Best effort: the error below is the one to report.
        let _ = fs::remove_dir_all(&tmp);
        return Err(failed(root, &tmp, &files, e));
    }
    for op in publish_steps(root, &name, root.join(&name).exists()) {
        apply(op, root, keep.max(1), state.steps_done)?;
    }
    Ok(root.join(name))
}

/// Writes `files` into the new directory `tmp`, each synced, then the
/// directory; `fail` fails the second file as a full disk would.
fn write_files(tmp: &Path, files: &[(&str, Content)], fail: bool) -> Result<(), CheckpointError> {
    if tmp.exists() {
        fs::remove_dir_all(tmp).map_err(io(tmp))?;
    }
    fs::create_dir_all(tmp).map_err(io(tmp))?;
    for (i, (file, content)) in files.iter().enumerate() {
        let path = tmp.join(file);
        let bytes = content.encode(&path)?;
        if fail && i == 1 {
            return Err(io(&path)(std::io::Error::new(
                ErrorKind::StorageFull,
                format!("no space left on device (injected by {FAIL_WRITE_ENV})"),
            )));
        }
        write_atomic(&path, &bytes)?;
    }
    sync_dir(tmp)
}

/// The error of a failed write into `tmp` (already removed): a file
/// system error becomes [`CheckpointError::Write`] with the bytes the
/// checkpoint needs and what `root` still holds; others stay as they are.
fn failed(
    root: &Path,
    tmp: &Path,
    files: &[(&str, Content)],
    e: CheckpointError,
) -> CheckpointError {
    let CheckpointError::Io { path, source } = e else {
        return e;
    };
    let needed_bytes = files
        .iter()
        .map(|(file, c)| c.encode(&tmp.join(file)).map_or(0, |b| b.len() as u64))
        .sum();
    let latest = root.join(LATEST);
    let kept = match fs::read_to_string(&latest) {
        Ok(name) => format!("{} still names {}", latest.display(), name.trim()),
        Err(_) => format!("{} holds no earlier checkpoint", root.display()),
    };
    CheckpointError::Write {
        path,
        error: source,
        needed_bytes,
        kept,
    }
}

/// One file-system step of publishing a complete temporary directory.
#[derive(Debug, PartialEq, Eq)]
enum Op {
    /// Rename a directory.
    Rename(PathBuf, PathBuf),
    /// Delete a directory and what it holds.
    RemoveDir(PathBuf),
    /// Sync a directory, so that the renames inside it are on disk.
    SyncDir(PathBuf),
    /// Replace `latest` (atomically) with this checkpoint's name.
    WriteLatest(String),
    /// Delete the checkpoints beyond the newest `keep`.
    Prune,
}

/// The steps that publish `root/.NAME.tmp` as `root/NAME`, in order: the
/// rename (a checkpoint of the same name, written before a resume, goes
/// only once the new one is in place), a sync of `root`, `latest`, a
/// second sync of `root` so that `latest`'s rename is on disk, and only
/// then the pruning of older checkpoints: a crash at any point leaves
/// `latest` naming a complete checkpoint that is still there.
fn publish_steps(root: &Path, name: &str, replacing: bool) -> Vec<Op> {
    let (dir, tmp) = (root.join(name), root.join(format!(".{name}.tmp")));
    let mut steps = Vec::new();
    if replacing {
        let old = root.join(format!(".{name}.old"));
        steps.push(Op::Rename(dir.clone(), old.clone()));
        steps.push(Op::Rename(tmp, dir));
        steps.push(Op::RemoveDir(old));
    } else {
        steps.push(Op::Rename(tmp, dir));
    }
    steps.push(Op::SyncDir(root.to_path_buf()));
    steps.push(Op::WriteLatest(name.to_string()));
    steps.push(Op::SyncDir(root.to_path_buf()));
    steps.push(Op::Prune);
    steps
}

/// Carries out `op` in `root`, keeping `keep` checkpoints and never the
/// one of step `latest`.
fn apply(op: Op, root: &Path, keep: usize, latest: usize) -> Result<(), CheckpointError> {
    match op {
        Op::Rename(from, to) => fs::rename(&from, &to).map_err(io(&from)),
        Op::RemoveDir(dir) => fs::remove_dir_all(&dir).map_err(io(&dir)),
        Op::SyncDir(dir) => sync_dir(&dir),
        Op::WriteLatest(name) => write_atomic(&root.join(LATEST), format!("{name}\n").as_bytes()),
        Op::Prune => prune(root, keep, latest),
    }
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

    #[test]
    fn a_failed_write_removes_its_temp_dir_names_the_bytes_and_keeps_latest() {
        let root = std::env::temp_dir().join(format!("ferrotron-ckpt-fail-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        let extra = [("config.toml".to_string(), b"x = 1\n".to_vec())];
        let first = write_with(&root, &state(2), None, &extra, 1, false).unwrap();
        // The bytes a checkpoint needs: its files as written.
        let written: u64 = fs::read_dir(&first)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        let e = write_with(&root, &state(4), None, &extra, 1, true).unwrap_err();
        let CheckpointError::Write {
            path, needed_bytes, ..
        } = &e
        else {
            panic!("not a write error: {e}");
        };
        assert!(
            path.ends_with(".step-4.tmp/optimizer.safetensors"),
            "{path}"
        );
        assert_eq!(*needed_bytes, written);
        let line = e.to_string();
        for needle in [
            "no space left on device",
            &format!("needs {written} bytes"),
            "temporary files were removed",
            "latest still names step-2",
        ] {
            assert!(line.contains(needle), "'{line}' lacks '{needle}'");
        }
        let mut names: Vec<String> = fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["latest", "step-2"]);
        assert_eq!(read_state(&resolve(&root).unwrap()).unwrap().step, 2);
        // Without an earlier checkpoint the error says so.
        fs::remove_dir_all(&root).unwrap();
        fs::create_dir_all(&root).unwrap();
        let e = write_with(&root, &state(2), None, &[], 1, true).unwrap_err();
        assert!(e.to_string().contains("holds no earlier checkpoint"), "{e}");
        assert_eq!(fs::read_dir(&root).unwrap().count(), 0);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn latest_is_synced_before_older_checkpoints_are_pruned() {
        let root = Path::new("/run/checkpoints");
        let p = |s: &str| root.join(s);
        let sync = || Op::SyncDir(root.to_path_buf());
        assert_eq!(
            publish_steps(root, "step-4", false),
            [
                Op::Rename(p(".step-4.tmp"), p("step-4")),
                sync(),
                Op::WriteLatest("step-4".into()),
                sync(),
                Op::Prune,
            ]
        );
        assert_eq!(
            publish_steps(root, "step-4", true),
            [
                Op::Rename(p("step-4"), p(".step-4.old")),
                Op::Rename(p(".step-4.tmp"), p("step-4")),
                Op::RemoveDir(p(".step-4.old")),
                sync(),
                Op::WriteLatest("step-4".into()),
                sync(),
                Op::Prune,
            ]
        );
    }
}
