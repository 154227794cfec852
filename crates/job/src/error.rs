//! Errors the user caused (exit code 2) versus failures while running
//! (exit 1), and the configuration errors [`crate::JobConfig::validate`]
//! reports all at once.

use std::fmt;

/// Bad input: a flag, key, file or value the user can fix. Exits with code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Wraps a message as a [`UsageError`].
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    UsageError(message.into()).into()
}

/// Exit code of a run stopped by a signal after writing a checkpoint
/// (`EX_TEMPFAIL`: try again, with `--resume`).
pub const INTERRUPTED_EXIT: u8 = 75;

/// A run stopped on request (SIGINT, SIGTERM) with a checkpoint to resume
/// from. Exits with [`INTERRUPTED_EXIT`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Interrupted(pub String);

/// One problem of a job's configuration: of a key (`optimizer.lr: --lr
/// must be positive, got 0`), or of a file, the launch or the machine.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigError {
    /// `section.key`, when the problem is a key's.
    pub key: Option<String>,
    /// The key's flag (`--lr`), or the file, launch or resource the
    /// problem is about.
    pub subject: String,
    /// What is wrong and what would be right.
    pub problem: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.key {
            Some(key) => write!(f, "{key}: {} {}", self.subject, self.problem),
            None => write!(f, "{}: {}", self.subject, self.problem),
        }
    }
}

/// Every problem found, one line each (a [`UsageError`] for the CLI).
pub fn usage_lines(errors: &[ConfigError]) -> anyhow::Error {
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    usage(lines.join("\nerror: "))
}
