//! CubeCL's kernel caches on disk, on by default for Ferrotron's runs.
//!
//! CubeCL compiles every kernel at its first launch in a process and
//! autotunes Burn's matrix products and reductions for every new shape. On
//! an H100 (2026-11-25) the first three bf16 steps of `gpt-mini` took 211 s,
//! nearly all of it compiling 273 kernels and autotuning; with both caches
//! filled the same run took 2 s. CubeCL 0.10 keeps its autotune results on
//! disk by default but not its compiled kernels. [`install`] turns both on,
//! in one folder ([`folder`]: `FERROTRON_KERNEL_CACHE`, else
//! `$XDG_CACHE_HOME/ferrotron/cubecl`, else `~/.cache/ferrotron/cubecl`),
//! unless the user configures CubeCL with a file of their own
//! (`cubecl.toml`, `CubeCL.toml`, `burn.toml` or `Burn.toml` in the working
//! directory or a parent), which then decides alone.
//!
//! CubeCL reads its configuration once per process, at the first client it
//! opens, so every GPU entry point calls [`install`] before opening one.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use cubecl::config::autotune::AutotuneLevel;
use cubecl::config::cache::CacheConfig;
use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};

/// The environment variable naming the cache folder (`off` turns the
/// caches off, as CubeCL's own default has them: autotune results only).
pub const CACHE_VAR: &str = "FERROTRON_KERNEL_CACHE";

/// The files CubeCL reads its configuration from (cubecl-runtime 0.10,
/// `CubeClRuntimeConfig::{file_names, section_file_names}`).
const CUBECL_FILES: [&str; 4] = ["cubecl.toml", "CubeCL.toml", "burn.toml", "Burn.toml"];

/// Where CubeCL's caches went, for a log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelCache {
    /// Compiled kernels and autotune results in this folder.
    Folder(PathBuf),
    /// The user's CubeCL configuration file (this one) decides.
    UserFile(PathBuf),
    /// `FERROTRON_KERNEL_CACHE=off`: CubeCL's defaults.
    Off,
    /// No folder: neither the variable, `XDG_CACHE_HOME` nor `HOME` is set.
    NoFolder,
    /// CubeCL had read its configuration in this process already.
    TooLate,
}

impl fmt::Display for KernelCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const FIRST_USE: &str = "a shape's first step compiles and autotunes its kernels, \
             minutes on a GPU the first time";
        match self {
            Self::Folder(dir) => write!(
                f,
                "kernel cache {} ({FIRST_USE}, seconds once cached; {CACHE_VAR} moves it, \
                 {CACHE_VAR}=off turns it off)",
                dir.display()
            ),
            Self::UserFile(file) => {
                write!(f, "kernel cache as {} says ({FIRST_USE})", file.display())
            }
            Self::Off => write!(
                f,
                "kernel cache off ({CACHE_VAR}=off): {FIRST_USE} and again in every run"
            ),
            Self::NoFolder => write!(
                f,
                "kernel cache off: no folder for it ({CACHE_VAR}, XDG_CACHE_HOME and HOME are \
                 unset); {FIRST_USE} and again in every run"
            ),
            Self::TooLate => write!(
                f,
                "kernel cache unchanged: CubeCL had read its configuration in this process"
            ),
        }
    }
}

/// What [`install`] did: the caches, and whether the autotune level is
/// `minimal`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installed {
    /// Where the caches are.
    pub cache: KernelCache,
    /// Whether CubeCL's autotune level was set to `minimal`.
    pub minimal_autotune: bool,
}

/// Installs CubeCL's configuration for this process, once: the user's
/// files and variables as CubeCL would read them, the caches in
/// [`folder`] when no file of theirs exists, and the autotune level
/// `minimal` when `minimal_autotune` (an adapter that runs on the CPU).
/// Later calls return the first call's result.
pub fn install(minimal_autotune: bool) -> &'static Installed {
    static INSTALLED: OnceLock<Installed> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let user_file = std::env::current_dir()
            .ok()
            .and_then(|dir| user_config_file(&dir));
        let cache = match user_file {
            Some(file) => KernelCache::UserFile(file),
            None => folder(
                std::env::var_os(CACHE_VAR),
                std::env::var_os("XDG_CACHE_HOME"),
                std::env::var_os("HOME"),
            ),
        };
        let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
        if let KernelCache::Folder(dir) = &cache {
            config.compilation.cache = Some(CacheConfig::File(dir.clone()));
            config.autotune.cache = CacheConfig::File(dir.clone());
        }
        if minimal_autotune {
            config.autotune.level = AutotuneLevel::Minimal;
        }
        let mut slot = CubeClRuntimeConfig::storage().lock();
        if slot.is_some() {
            return Installed {
                cache: KernelCache::TooLate,
                minimal_autotune: false,
            };
        }
        *slot = Some(Arc::new(config));
        Installed {
            cache,
            minimal_autotune,
        }
    })
}

/// The cache folder from the values of `FERROTRON_KERNEL_CACHE` (`var`),
/// `XDG_CACHE_HOME` and `HOME`, first set and non-empty wins.
pub fn folder(var: Option<OsString>, xdg: Option<OsString>, home: Option<OsString>) -> KernelCache {
    let set = |v: Option<OsString>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = set(var) {
        return if dir == Path::new("off") {
            KernelCache::Off
        } else {
            KernelCache::Folder(dir)
        };
    }
    match (set(xdg), set(home)) {
        (Some(xdg), _) => KernelCache::Folder(xdg.join("ferrotron/cubecl")),
        (None, Some(home)) => KernelCache::Folder(home.join(".cache/ferrotron/cubecl")),
        (None, None) => KernelCache::NoFolder,
    }
}

/// The first of CubeCL's configuration files in `dir` or a parent, as
/// CubeCL searches them.
fn user_config_file(dir: &Path) -> Option<PathBuf> {
    dir.ancestors().find_map(|d| {
        CUBECL_FILES
            .iter()
            .map(|name| d.join(name))
            .find(|file| file.is_file())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> Option<OsString> {
        Some(s.into())
    }

    #[test]
    fn the_variable_wins_then_xdg_then_home() {
        assert_eq!(
            folder(os("/scratch/k"), os("/x"), os("/h")),
            KernelCache::Folder("/scratch/k".into())
        );
        assert_eq!(folder(os("off"), os("/x"), os("/h")), KernelCache::Off);
        assert_eq!(
            folder(os(""), os("/x"), os("/h")),
            KernelCache::Folder("/x/ferrotron/cubecl".into())
        );
        assert_eq!(
            folder(None, None, os("/h")),
            KernelCache::Folder("/h/.cache/ferrotron/cubecl".into())
        );
        assert_eq!(folder(None, os(""), None), KernelCache::NoFolder);
    }

    #[test]
    fn a_cubecl_file_in_a_parent_folder_is_found() {
        let root = std::env::temp_dir().join(format!("kernel-cache-{}", std::process::id()));
        let deep = root.join("a/b");
        std::fs::create_dir_all(&deep).unwrap();
        // Nothing in `root` yet: what is found lies above it.
        assert_eq!(
            user_config_file(&deep),
            user_config_file(&std::env::temp_dir())
        );
        std::fs::write(root.join("burn.toml"), "").unwrap();
        assert_eq!(user_config_file(&deep), Some(root.join("burn.toml")));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
