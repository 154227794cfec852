//! Complete checkpoints of a run, sharded: `RUN/checkpoints/step-N/` holds
//!
//! | file | what |
//! |---|---|
//! | `rank-RRRRR.safetensors` | what world rank `R` alone stores: its blocks of the parameters and of AdamW's moments `m.NAME` / `v.NAME`, f32 ([`shard`]) |
//! | `index.json` | the layout written from, and for every tensor its global shape and blocks ([`index`]) |
//! | `state.json` | the step, AdamW's update count, the sampler's position ([`CheckpointState`]) |
//! | extra files | what the caller adds (`ferrotron train`: the resolved `config.toml`) |
//!
//! No rank gathers anything: each writes the parts it holds (its TP block
//! of each parameter of its pipeline stage, narrowed to its ZeRO piece),
//! and of the ranks holding the same part only one writes it (the lowest
//! DP rank without ZeRO, TP rank 0 for a parameter TP does not split,
//! stage 0 for a tied embedding), so the checkpoint holds each value once.
//! A load in any layout reads, for each tensor, the blocks overlapping
//! what the rank holds ([`read`]).
//!
//! Written collectively: rank 0 creates `checkpoints/.step-N.tmp`, every
//! rank writes and syncs its file there, and only when every rank has
//! (the agreement is a collective) does rank 0 write `index.json`,
//! `state.json` and the extra files, sync the directory, rename it to
//! `step-N` and sync the parent; then `checkpoints/latest` (the name of
//! the newest directory) is replaced atomically, the parent synced again,
//! and only then are the directories beyond the newest `keep` deleted
//! (`publish_steps`). A crash at any point leaves `latest` naming a
//! complete checkpoint. A write that fails on any rank (a full disk)
//! abandons the checkpoint: rank 0 removes the temporary directory, and
//! the failing rank reports the file, the bytes the whole checkpoint needs
//! and the system's error; `latest` and the earlier checkpoints are
//! untouched.

pub mod background;
pub mod index;
pub mod read;
pub mod region;
pub mod shard;
pub mod stream;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use ferrotron_engine::checkpoint::{write_atomic, CheckpointError};
use ferrotron_engine::data::SamplerState;
use serde::{Deserialize, Serialize};

use self::shard::Shard;
use super::loss_scale::LossScaler;
use crate::comm::{CommError, Communicator};

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
/// process writes (1: the first) fail on its rank's file as a full disk
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

/// Writes rank `world.rank()`'s part of the checkpoint of `shard` into
/// `root` (a run's `checkpoints/`; a collective over `world`, the whole
/// job), asking `values` for the values of each of `shard`'s blocks (by
/// index) as it writes them, one block at a time; rank 0 adds `sampler`
/// and the `extra` files `(name, bytes)`, points `latest` at the
/// checkpoint, keeps the newest `keep` (at least 1) and returns its
/// directory (`None` on the other ranks). A failed write
/// ([`CheckpointError::Write`], on the rank that failed) removes the
/// temporary directory and leaves `latest` and the checkpoints as they
/// were.
pub fn write(
    root: &Path,
    world: &dyn Communicator,
    shard: &Shard,
    values: &mut dyn FnMut(usize) -> Vec<f32>,
    sampler: Option<SamplerState>,
    extra: &[(String, Vec<u8>)],
    keep: usize,
) -> Result<Option<PathBuf>, CheckpointError> {
    let fail = injected_failure()
        .then(|| format!("no space left on device (injected by {FAIL_WRITE_ENV})"));
    let written = Written {
        shard,
        sampler,
        extra,
    };
    write_with(root, world, &written, values, keep, fail)
}

fn comm(root: &Path) -> impl FnOnce(CommError) -> CheckpointError + '_ {
    move |e| CheckpointError::Format {
        path: root.display().to_string(),
        message: format!("writing a checkpoint: {e}"),
    }
}

/// What a checkpoint records besides the blocks' values.
struct Written<'a> {
    shard: &'a Shard,
    sampler: Option<SamplerState>,
    extra: &'a [(String, Vec<u8>)],
}

/// Rank 0's own files of a checkpoint: the index of every rank's
/// `entries`, `state.json` and the extra files.
fn lead_files(w: &Written<'_>, entries: Vec<Vec<shard::Entry>>) -> Vec<(String, Vec<u8>)> {
    let index = shard::index(w.shard, entries);
    let meta = CheckpointState {
        step: w.shard.steps_done,
        optimizer_steps: w.shard.optimizer_steps,
        sampler: w.sampler,
        loss_scaler: w.shard.loss_scaler,
    };
    let mut own = vec![
        (
            index::INDEX.into(),
            serde_json::to_vec_pretty(&index).expect("the index serialises"),
        ),
        (
            "state.json".into(),
            serde_json::to_vec_pretty(&meta).expect("the checkpoint state serialises"),
        ),
    ];
    own.extend(w.extra.iter().cloned());
    own
}

/// [`write`], this rank's file failing as a full disk does (for the
/// reason given) when `fail` is set.
fn write_with(
    root: &Path,
    world: &dyn Communicator,
    w: &Written<'_>,
    values: &mut dyn FnMut(usize) -> Vec<f32>,
    keep: usize,
    fail: Option<String>,
) -> Result<Option<PathBuf>, CheckpointError> {
    let Some(started) = Started::begin(root, world, w.shard.steps_done)? else {
        return Ok(None);
    };
    let blocks = &w.shard.blocks;
    // This rank's file, streamed block by block (no file when it stores nothing).
    let file = if blocks.is_empty() {
        (Vec::new(), Ok(()))
    } else {
        shard::write_file(&started.path, &started.file, blocks, values, fail)
    };
    started.publish(world, w, file, keep)
}

/// A checkpoint begun: its temporary directory exists, and each rank
/// writes its file at [`Started::path`], then every rank calls
/// [`Started::publish`].
struct Started {
    root: PathBuf,
    name: String,
    tmp: PathBuf,
    /// This rank's file: its name and path.
    file: String,
    path: PathBuf,
}

impl Started {
    /// Rank 0 creates the temporary directory of the checkpoint of step
    /// `step` in `root` (a collective over `world`). `None` on the other
    /// ranks if rank 0 could not (rank 0 gets its error).
    fn begin(
        root: &Path,
        world: &dyn Communicator,
        step: usize,
    ) -> Result<Option<Self>, CheckpointError> {
        let name = format!("step-{step}");
        let tmp = root.join(format!(".{name}.tmp"));
        let prepared = if world.rank() == 0 {
            fresh_dir(&tmp, &root.join(format!(".{name}.old")), &root.join(&name))
        } else {
            Ok(())
        };
        if shard::failures(world, prepared.is_ok()).map_err(comm(root))? > 0 {
            return prepared.map(|()| None);
        }
        let file = shard::rank_file(world.rank());
        Ok(Some(Self {
            root: root.to_path_buf(),
            name,
            path: tmp.join(&file),
            tmp,
            file,
        }))
    }

    /// Ends the checkpoint once this rank's `file` was written (its index
    /// entries and whether the write succeeded): a collective over
    /// `world` (see the module doc).
    fn publish(
        self,
        world: &dyn Communicator,
        w: &Written<'_>,
        file: (Vec<shard::Entry>, Result<(), CheckpointError>),
        keep: usize,
    ) -> Result<Option<PathBuf>, CheckpointError> {
        let (root, tmp, lead) = (&self.root, &self.tmp, world.rank() == 0);
        let (entries, written) = file;
        let sent = serde_json::to_vec(&entries).expect("index entries serialise");
        let all = shard::gather_bytes(world, &sent).map_err(comm(root))?;
        let own = if lead {
            let entries = all
                .iter()
                .map(|b| serde_json::from_slice(b).expect("every rank sends its entries"))
                .collect();
            lead_files(w, entries)
        } else {
            Vec::new()
        };
        let blocks = &w.shard.blocks;
        let mine = if blocks.is_empty() {
            0
        } else {
            stream::file_size(&shard::file_tensors(blocks))
        };
        let mine = mine + own.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
        let needed_bytes = shard::gather_u64(world, mine)
            .map_err(comm(root))?
            .iter()
            .sum();
        // Every rank's file is on disk before the index is written.
        let failed_ranks = shard::failures(world, written.is_ok()).map_err(comm(root))?;
        if failed_ranks > 0 {
            if lead {
                // Best effort: the error below is the one to report.
                let _ = fs::remove_dir_all(tmp);
            }
            return match written {
                Err(e) => Err(failed(root, needed_bytes, e)),
                Ok(()) if lead => Err(CheckpointError::Format {
                    path: tmp.display().to_string(),
                    message: format!("{failed_ranks} rank(s) could not write their part (their error says why); the checkpoint was abandoned and its temporary directory removed"),
                }),
                Ok(()) => Ok(None),
            };
        }
        if !lead {
            return Ok(None);
        }
        let published = own
            .iter()
            .try_for_each(|(f, b)| write_atomic(&tmp.join(f), b))
            .and_then(|()| sync_dir(tmp));
        if let Err(e) = published {
            let _ = fs::remove_dir_all(tmp);
            return Err(failed(root, needed_bytes, e));
        }
        let name = &self.name;
        for op in publish_steps(root, name, root.join(name).exists()) {
            apply(op, root, keep.max(1), w.shard.steps_done)?;
        }
        Ok(Some(root.join(name)))
    }
}

/// Creates the empty directory `tmp` for the checkpoint `dir`, first
/// clearing what a crash during an earlier write of the same checkpoint
/// left: its `tmp` is removed; `old`, the checkpoint a replacing publish
/// had moved aside ([`publish_steps`]), which would otherwise make this
/// publish's rename fail on every resume, is removed when `dir` exists
/// (the crash came after the new one was in place), and put back as
/// `dir` when it does not (the crash came between the two renames, and
/// `latest` may name it: see [`resolve`]).
fn fresh_dir(tmp: &Path, old: &Path, dir: &Path) -> Result<(), CheckpointError> {
    if tmp.exists() {
        fs::remove_dir_all(tmp).map_err(io(tmp))?;
    }
    if old.exists() {
        if moved_aside_whole(old, dir) {
            fs::rename(old, dir).map_err(io(old))?;
        } else {
            fs::remove_dir_all(old).map_err(io(old))?;
        }
    }
    fs::create_dir_all(tmp).map_err(io(tmp))
}

/// Whether `old` is the whole checkpoint `dir` that a replacing publish
/// moved aside and a crash kept from being replaced: `dir` is missing,
/// and `old` is a complete checkpoint (its `state.json`, written last, is
/// there; a crash while `old` was being deleted leaves `dir` in place).
fn moved_aside_whole(old: &Path, dir: &Path) -> bool {
    !dir.exists() && old.join("state.json").is_file()
}

/// Removes the temporary and moved-aside directories (`.step-N.tmp`,
/// `.step-N.old`) that crashes left in `root`; run once `latest` names a
/// newer complete checkpoint, so nothing points at them.
fn remove_leftovers(root: &Path) -> Result<(), CheckpointError> {
    for entry in fs::read_dir(root).map_err(io(root))?.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let inner = name
            .strip_prefix('.')
            .and_then(|n| n.strip_suffix(".tmp").or_else(|| n.strip_suffix(".old")));
        if inner.and_then(step_of).is_some() {
            let path = entry.path();
            fs::remove_dir_all(&path).map_err(io(&path))?;
        }
    }
    Ok(())
}

/// The error of a failed write of a checkpoint of `needed_bytes` into
/// `root`'s temporary directory (already removed): a file system error
/// becomes [`CheckpointError::Write`] with what `root` still holds;
/// others stay as they are.
fn failed(root: &Path, needed_bytes: u64, e: CheckpointError) -> CheckpointError {
    let CheckpointError::Io { path, source } = e else {
        return e;
    };
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
/// rename (a checkpoint of the same name, written before a resume, is
/// deleted only once the new one is in place and the renames are synced),
/// a sync of `root`, `latest`, a
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
        // The renames reach the disk before the old copy is deleted.
        steps.push(Op::SyncDir(root.to_path_buf()));
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

/// Deletes all but the newest `keep` checkpoints of `root`, never `latest`,
/// and what crashes left ([`remove_leftovers`]).
fn prune(root: &Path, keep: usize, latest: usize) -> Result<(), CheckpointError> {
    remove_leftovers(root)?;
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
/// When `latest` names a `step-N` that a replacing publish moved aside as
/// `.step-N.old` and a crash kept from being replaced (between its two
/// renames), that whole checkpoint is the one named. Errors name the file
/// that is missing or wrong.
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
    let (dir, old) = (root.join(name), root.join(format!(".{name}.old")));
    Ok(if moved_aside_whole(&old, &dir) {
        old
    } else {
        dir
    })
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

    use crate::comm::SingleProcess;
    use index::Layout;
    use region::Region;
    use shard::HeldBlock;

    /// The values of [`state`]'s blocks, in order.
    const VALUES: [[f32; 2]; 3] = [[1.0, 2.0], [0.5, 0.25], [0.1, 0.2]];

    fn state(step: usize) -> Shard {
        let block = |name: &str| HeldBlock {
            name: name.into(),
            global: vec![2],
            region: Region::whole(vec![0], vec![2]),
        };
        Shard {
            blocks: vec![block("w"), block("m.w"), block("v.w")],
            layout: Layout {
                world: 1,
                tp: 1,
                cp: 1,
                pp: 1,
                pp_virtual: 1,
                dp: 1,
                zero: 0,
            },
            steps_done: step,
            optimizer_steps: step as u64,
            loss_scaler: None,
        }
    }

    fn write(
        root: &Path,
        state: &Shard,
        sampler: Option<SamplerState>,
        extra: &[(String, Vec<u8>)],
        keep: usize,
    ) -> Result<PathBuf, CheckpointError> {
        let w = Written {
            shard: state,
            sampler,
            extra,
        };
        write_with(
            root,
            &SingleProcess,
            &w,
            &mut |i| VALUES[i].to_vec(),
            keep,
            None,
        )
        .map(Option::unwrap)
    }

    fn write_failing(
        root: &Path,
        state: &Shard,
        extra: &[(String, Vec<u8>)],
        fail: bool,
    ) -> Result<PathBuf, CheckpointError> {
        let w = Written {
            shard: state,
            sampler: None,
            extra,
        };
        let fail = fail.then(|| "no space left on device".to_string());
        write_with(
            root,
            &SingleProcess,
            &w,
            &mut |i| VALUES[i].to_vec(),
            1,
            fail,
        )
        .map(Option::unwrap)
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
    fn the_reader_gives_the_tensors_back_and_names_what_is_missing_or_damaged() {
        let root = std::env::temp_dir().join(format!("ferrotron-ckpt-read-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let dir = write(&root, &state(2), None, &[], 1).unwrap();
        let whole = read::Reader::open(&dir).unwrap().read_whole().unwrap();
        let values = |n: &str| whole[n].to_vec::<f32>().unwrap();
        assert_eq!(values("w"), [1.0, 2.0]);
        assert_eq!(values("m.w"), [0.5, 0.25]);
        assert_eq!(values("v.w"), [0.1, 0.2]);
        // Another shape (another architecture or vocabulary) is named.
        let mut reader = read::Reader::open(&dir).unwrap();
        let e = reader
            .read("w", &[3], &Region::whole(vec![0], vec![3]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("index.json") && e.contains("'w'") && e.contains("[2]"),
            "{e}"
        );
        // A flipped byte in a block: the tensor and the file are named.
        let file = dir.join(shard::rank_file(0));
        let mut bytes = fs::read(&file).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&file, &bytes).unwrap();
        let e = read::Reader::open(&dir)
            .unwrap()
            .read_whole()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank-00000.safetensors") && e.contains("XXH3-64") && e.contains("tensor '"),
            "{e}"
        );
        // A block file that is gone, then the index itself.
        fs::remove_file(&file).unwrap();
        let e = index::Index::read(&dir).unwrap_err().to_string();
        assert!(
            e.contains("rank-00000.safetensors") && e.contains("does not exist"),
            "{e}"
        );
        fs::remove_file(dir.join(index::INDEX)).unwrap();
        let e = index::Index::read(&dir).unwrap_err().to_string();
        assert!(e.contains("index.json") && e.contains("missing"), "{e}");
        // A checkpoint of the whole-file format is refused by name.
        fs::write(dir.join("model.safetensors"), b"").unwrap();
        let e = index::Index::read(&dir).unwrap_err().to_string();
        assert!(
            e.contains("model.safetensors") && e.contains("whole-file checkpoint"),
            "{e}"
        );
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_failed_write_removes_its_temp_dir_names_the_bytes_and_keeps_latest() {
        let root = std::env::temp_dir().join(format!("ferrotron-ckpt-fail-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        let extra = [("config.toml".to_string(), b"x = 1\n".to_vec())];
        let first = write_failing(&root, &state(2), &extra, false).unwrap();
        // The bytes a checkpoint needs: its files as written.
        let written: u64 = fs::read_dir(&first)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        let e = write_failing(&root, &state(4), &extra, true).unwrap_err();
        let CheckpointError::Write {
            path, needed_bytes, ..
        } = &e
        else {
            panic!("not a write error: {e}");
        };
        assert!(
            path.ends_with(".step-4.tmp/rank-00000.safetensors"),
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
        let e = write_failing(&root, &state(2), &[], true).unwrap_err();
        assert!(e.to_string().contains("holds no earlier checkpoint"), "{e}");
        assert_eq!(fs::read_dir(&root).unwrap().count(), 0);
        fs::remove_dir_all(&root).unwrap();
    }

    /// A crash between a replacing publish's rename and its removal of
    /// `.step-N.old` left that directory: the next write of step N (a
    /// resumed run) removes it instead of failing on its rename.
    #[test]
    fn a_checkpoint_moved_aside_by_a_killed_publish_does_not_stop_the_next() {
        let root = std::env::temp_dir().join(format!("ferrotron-ckpt-old-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        for step in [3, 4] {
            write(&root, &state(step), None, &[], 3).unwrap();
        }
        let old = root.join(".step-4.old");
        fs::create_dir_all(&old).unwrap();
        fs::write(old.join("rank-00000.safetensors"), b"left by a crash").unwrap();
        fs::write(root.join(LATEST), "step-3\n").unwrap();
        let dir = write(&root, &state(4), None, &[], 3).unwrap();
        assert_eq!(dir, root.join("step-4"));
        assert!(!old.exists(), "the checkpoint moved aside is still there");
        assert_eq!(resolve(&root).unwrap(), dir);
        assert_eq!(read_state(&dir).unwrap().step, 4);
        fs::remove_dir_all(&root).unwrap();
    }

    /// The crash state between a replacing publish's two renames: `latest`
    /// names step 4, which was moved aside as `.step-4.old`, and the new
    /// one waits complete in `.step-4.tmp`.
    fn interrupted_between_renames(tag: &str) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("ferrotron-ckpt-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        for step in [3, 4] {
            write(&root, &state(step), None, &[], 3).unwrap();
        }
        fs::rename(root.join("step-4"), root.join(".step-4.old")).unwrap();
        fs::create_dir_all(root.join(".step-4.tmp")).unwrap();
        fs::write(root.join(".step-4.tmp/state.json"), b"{}").unwrap();
        assert_eq!(fs::read_to_string(root.join(LATEST)).unwrap(), "step-4\n");
        root
    }

    /// Names in `root`, sorted.
    fn names(root: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// After a crash between the two renames, `latest` still loads (the
    /// checkpoint moved aside), and the next checkpoint, once `latest`
    /// names it, removes the leftovers.
    #[test]
    fn a_publish_killed_between_its_renames_leaves_latest_loadable() {
        let root = interrupted_between_renames("renames");
        let dir = resolve(&root).unwrap();
        assert_eq!(dir, root.join(".step-4.old"));
        assert_eq!(read_state(&dir).unwrap().step, 4);
        let next = write(&root, &state(6), None, &[], 3).unwrap();
        assert_eq!(resolve(&root).unwrap(), next);
        assert_eq!(names(&root), ["latest", "step-3", "step-6"]);
        fs::remove_dir_all(&root).unwrap();
    }

    /// After the same crash, a run resumed from step 3 that writes step 4
    /// again puts the moved-aside checkpoint back before replacing it, so
    /// `latest` names a whole checkpoint at every point.
    #[test]
    fn rewriting_a_checkpoint_moved_aside_first_puts_it_back() {
        let root = interrupted_between_renames("rewrite");
        let begun = Started::begin(&root, &SingleProcess, 4).unwrap().unwrap();
        assert_eq!(resolve(&root).unwrap(), root.join("step-4"));
        assert_eq!(read_state(&root.join("step-4")).unwrap().step, 4);
        fs::remove_dir_all(&begun.tmp).unwrap();
        let dir = write(&root, &state(4), None, &[], 3).unwrap();
        assert_eq!(dir, root.join("step-4"));
        assert_eq!(names(&root), ["latest", "step-3", "step-4"]);
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
                sync(),
                Op::RemoveDir(p(".step-4.old")),
                sync(),
                Op::WriteLatest("step-4".into()),
                sync(),
                Op::Prune,
            ]
        );
    }
}
