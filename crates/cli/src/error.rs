//! Errors the user caused (exit code 2) versus failures while running (exit
//! 1): the job layer's, so that its errors and the command's are one type.

pub use ferrotron_job::error::{usage, Interrupted, UsageError, INTERRUPTED_EXIT};
