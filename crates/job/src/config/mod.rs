//! The job configuration: one sectioned [`JobConfig`] that is both the TOML
//! file (`ferrotron train --config job.toml`) and, through [`JobFlags`],
//! the command line. Every setting is declared once, in `sections.rs`.
//! Flags override the file, the file overrides the defaults.
//!
//! ```
//! use ferrotron_job::JobConfig;
//! let job = JobConfig::from_toml_str("[schedule]\nsteps = 3\n", "job.toml").unwrap();
//! assert_eq!(job.schedule.steps, 3);
//! // The resolved job prints as TOML and reads back identical.
//! let text = job.to_toml();
//! assert_eq!(JobConfig::from_toml_str(&text, "again.toml").unwrap(), job);
//! ```

mod change;
mod choices;
mod sections;
mod table;

use std::path::Path;

pub use change::Change;
pub use choices::{AttentionKernelChoice, CommChoice, Offload, OnNonFinite, PpSchedule};
pub use sections::*;

use crate::error::ConfigError;

/// One key of [`JobConfig`].
#[derive(Debug, PartialEq, Eq)]
pub struct Key {
    /// Its section (`optimizer`).
    pub section: &'static str,
    /// Its name in the section (`lr`).
    pub name: &'static str,
    /// The flag's field name (`comm_timeout` for `--comm-timeout`).
    pub flag_field: &'static str,
}

impl Key {
    /// `section.name`.
    pub fn path(&self) -> String {
        format!("{}.{}", self.section, self.name)
    }

    /// The flag that sets it (`--comm-timeout`).
    pub fn flag(&self) -> String {
        format!("--{}", self.flag_field.replace('_', "-"))
    }

    /// `section.name (--flag)`: how errors name the key.
    pub fn place(&self) -> String {
        format!("{} ({})", self.path(), self.flag())
    }

    /// The key `section.name`.
    pub fn find(section: &str, name: &str) -> Option<&'static Key> {
        KEYS.iter().find(|k| k.section == section && k.name == name)
    }

    /// The keys named `name` in any section.
    fn named(name: &str) -> impl Iterator<Item = &'static Key> + '_ {
        KEYS.iter().filter(move |k| k.name == name)
    }
}

/// How errors name the key `section.name`.
pub(crate) fn place(section: &str, name: &str) -> String {
    Key::find(section, name).map_or_else(|| format!("{section}.{name}"), Key::place)
}

impl ModelSection {
    /// What the job's model is called in the log and the default run
    /// directory: the Hugging Face directory's name, else the preset's.
    pub fn label(&self) -> String {
        self.hf_dir
            .as_deref()
            .and_then(Path::file_name)
            .map_or_else(|| self.name.clone(), |n| n.to_string_lossy().into_owned())
    }
}

impl JobConfig {
    /// Reads a job file; every unknown, misplaced or mistyped key is
    /// reported (one error each), naming the file, the key and, for a key
    /// of another section or an old flat file, the section it belongs in.
    pub fn from_file(path: &Path) -> Result<Self, Vec<ConfigError>> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            vec![ConfigError {
                key: None,
                subject: path.display().to_string(),
                problem: format!("cannot read: {e}"),
            }]
        })?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// Parses the TOML text of a job file named `file` (for messages).
    pub fn from_toml_str(text: &str, file: &str) -> Result<Self, Vec<ConfigError>> {
        let err = |problem: String| ConfigError {
            key: None,
            subject: file.to_string(),
            problem,
        };
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| vec![err(e.message().trim().to_string())])?;
        let mut job = JobConfig::default();
        let mut errors = Vec::new();
        for (section, value) in table {
            match value {
                toml::Value::Table(keys) if SECTIONS.contains(&section.as_str()) => {
                    for (name, value) in keys {
                        match job.set(&section, &name, value) {
                            Some(Ok(())) => {}
                            Some(Err(e)) => {
                                errors.push(err(format!("{}: {e}", place(&section, &name))))
                            }
                            None => errors.push(err(misplaced(&section, &name))),
                        }
                    }
                }
                _ if SECTIONS.contains(&section.as_str()) => errors.push(err(format!(
                    "'{section}' is a section: write it as [{section}] with its keys ({})",
                    keys_of(&section)
                ))),
                _ => errors.push(err(top_level(&section))),
            }
        }
        if errors.is_empty() {
            Ok(job)
        } else {
            Err(errors)
        }
    }

    /// The job as TOML: what `--print-config` prints and the run
    /// directory's `config.toml` holds; [`JobConfig::from_toml_str`] reads
    /// it back identical.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("every job setting serializes as TOML")
    }
}

/// The keys of `section`, for messages.
fn keys_of(section: &str) -> String {
    let names: Vec<&str> = KEYS
        .iter()
        .filter(|k| k.section == section)
        .map(|k| k.name)
        .collect();
    names.join(", ")
}

/// The message for key `name` under `[section]`, which has no such key.
fn misplaced(section: &str, name: &str) -> String {
    let homes: Vec<String> = Key::named(name)
        .map(|k| format!("[{}]", k.section))
        .collect();
    if homes.is_empty() {
        format!(
            "[{section}] has no key '{name}'; its keys are: {}",
            keys_of(section)
        )
    } else {
        format!(
            "[{section}] has no key '{name}': it belongs in {} ({}.{name})",
            homes.join(" or "),
            &homes[0][1..homes[0].len() - 1]
        )
    }
}

/// The message for a top-level key `name` that is not a section: an old
/// flat key, named with the section it moved to, or an unknown one.
fn top_level(name: &str) -> String {
    let old = Key::named(name)
        .next()
        .or_else(|| KEYS.iter().find(|k| k.flag_field == name));
    match old {
        Some(k) => format!(
            "'{name}' is not a section: settings are grouped in sections now; it belongs in [{}] as {}",
            k.section,
            k.path()
        ),
        None => format!(
            "unknown section or key '{name}'; the sections are: {}",
            SECTIONS.join(", ")
        ),
    }
}
