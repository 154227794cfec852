//! Errors the user caused (exit code 2) versus failures while running (exit 1).

/// Bad input: a flag, file or value the user can fix. Exits with code 2.
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
