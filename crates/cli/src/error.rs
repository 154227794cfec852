//! Errors the user caused (exit code 2) versus failures while running (exit 1).

/// Bad input: a flag, file or value the user can fix. Exits with code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Wraps a message as a [`UsageError`].
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    UsageError(message.into()).into()
}
