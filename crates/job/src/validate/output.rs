//! Checks of what a job writes: the run directory and the Hugging Face
//! export, which must be new or empty and apart from the inputs.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use ferrotron_models::hf::Family;
use ferrotron_models::DecoderConfig;

use super::{Here, Problems, World};
use crate::config::JobConfig;
use crate::resume::Resume;

/// The run directory: the resumed run's, `checkpoint.out`, or
/// `runs/<model>-<unix time>`. A new run's must be empty (checked on rank
/// 0, which creates it) and a multi-rank run must name it.
pub(super) fn run_dir(
    c: &JobConfig,
    world: &World,
    resume: Option<&Resume>,
    here: Here,
    p: &mut Problems,
) -> Option<PathBuf> {
    let out = &c.checkpoint.out;
    if let Some(r) = resume {
        if out.is_some()
            && *out != r.config.checkpoint.out
            && out.as_deref().and_then(|o| std::fs::canonicalize(o).ok()) != Some(r.run.clone())
        {
            p.key(
                "checkpoint",
                "out",
                format!("with --resume: the run's directory is {}", r.run.display()),
            );
        }
        if here == Here::Yes && world.rank == 0 {
            probe("checkpoint", "out", &r.run, p);
        }
        return Some(r.run.clone());
    }
    if world.world_size > 1 && out.is_none() {
        p.key(
            "checkpoint",
            "out",
            "is required in a multi-rank run (every rank must name the same run directory)",
        );
        return None;
    }
    let dir = out
        .clone()
        .unwrap_or_else(|| default_run_dir(&c.model.label()));
    if here == Here::Yes && world.rank == 0 && !is_empty(&dir) {
        p.key(
            "checkpoint",
            "out",
            format!(
                "{}: directory is not empty; choose a new run directory",
                dir.display()
            ),
        );
    }
    if here == Here::Yes && world.rank == 0 {
        probe("checkpoint", "out", &dir, p);
    }
    Some(dir)
}

/// Checks the export (`checkpoint.hf_out`; on rank 0 of a job that runs
/// here, that it can be written) and that no output overlaps another or
/// replaces an input.
pub(super) fn check_outputs(
    c: &JobConfig,
    model: &DecoderConfig,
    out: &Path,
    writer: bool,
    p: &mut Problems,
) {
    if let Some(dir) = &c.checkpoint.hf_out {
        if writer {
            probe("checkpoint", "hf_out", dir, p);
        }
        if let Err(e) = Family::of(model) {
            p.key("checkpoint", "hf_out", format!("{}: {e}", dir.display()));
        }
        if !is_empty(dir) {
            p.key(
                "checkpoint",
                "hf_out",
                format!(
                    "{}: directory is not empty; choose a new directory",
                    dir.display()
                ),
            );
        }
    }
    paths_apart(c, out, p);
}

/// Notes a problem of `section.key` when the directory `dir` could not be
/// created and written: the nearest of it and its ancestors that exists
/// must be a directory that takes a new file (one is created and removed
/// at once), so a read-only or missing file system is found before
/// training rather than at the first checkpoint.
fn probe(section: &str, key: &str, dir: &Path, p: &mut Problems) {
    let mut at = dir;
    while !at.exists() {
        at = match at.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
    }
    let problem = if !at.is_dir() {
        format!("{}: {} is not a directory", dir.display(), at.display())
    } else {
        // Unique in the process too: jobs may be validated on several
        // threads at once.
        static PROBES: AtomicUsize = AtomicUsize::new(0);
        let n = PROBES.fetch_add(1, Ordering::Relaxed);
        let file = at.join(format!(".ferrotron-write-probe-{}-{n}", std::process::id()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&file)
        {
            Ok(_) => {
                let _ = std::fs::remove_file(&file);
                return;
            }
            Err(e) => format!("{}: cannot write in {}: {e}", dir.display(), at.display()),
        }
    };
    p.key(section, key, problem);
}

/// Whether `dir` is missing or empty.
pub fn is_empty(dir: &Path) -> bool {
    !std::fs::read_dir(dir)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
}

/// Refuses outputs that overlap: the run directory `out` and the export
/// inside one another, or an output equal to an input (the corpus, the
/// Hugging Face directory). Paths are compared made absolute, without
/// following links.
fn paths_apart(c: &JobConfig, out: &Path, p: &mut Problems) {
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let out = abs(out);
    let hf_out = c.checkpoint.hf_out.as_deref().map(abs);
    if let Some(hf) = &hf_out {
        if out.starts_with(hf) || hf.starts_with(&out) {
            p.key("checkpoint", "hf_out", format!(
                "{} and --out {}: one is inside the other; the run directory and the export must be apart",
                hf.display(),
                out.display()
            ));
        }
    }
    let outputs = [("out", Some(out)), ("hf_out", hf_out)];
    let inputs = [("--corpus", &c.data.corpus), ("--hf-dir", &c.model.hf_dir)];
    for (key, output) in &outputs {
        for (in_flag, input) in inputs {
            if let (Some(o), Some(i)) = (output, input.as_deref().map(abs)) {
                if *o == i {
                    p.key(
                        "checkpoint",
                        key,
                        format!(
                            "{} is also {in_flag}: an output must not replace an input",
                            o.display()
                        ),
                    );
                }
            }
        }
    }
}

/// Where the run goes when `checkpoint.out` is not given.
fn default_run_dir(model: &str) -> PathBuf {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Path::new("runs").join(format!("{model}-{secs}"))
}
