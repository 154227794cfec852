//! Bytes of training state a rank holds, by class (as llm.c prints them).

use serde::{Deserialize, Serialize};

/// Training state held by one rank, bytes. Activations are not counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryBytes {
    /// Model parameters held between steps.
    pub param_bytes: usize,
    /// Accumulated gradients held when the optimizer step begins.
    pub grad_bytes: usize,
    /// Optimizer state (AdamW's two moments).
    pub optimizer_bytes: usize,
}

impl MemoryBytes {
    /// Parameters + gradients + optimizer state, bytes.
    pub fn total(&self) -> usize {
        self.param_bytes + self.grad_bytes + self.optimizer_bytes
    }

    /// One line for a human: `parameters 1.2 MiB | gradients ... | optimizer state ...`.
    pub fn describe(&self) -> String {
        let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
        format!(
            "parameters {:.2} MiB | gradients {:.2} MiB | optimizer state {:.2} MiB",
            mib(self.param_bytes),
            mib(self.grad_bytes),
            mib(self.optimizer_bytes)
        )
    }
}

/// The memory this machine can still give to new processes, bytes:
/// `MemAvailable` of `/proc/meminfo` (Linux: free memory plus the caches
/// the kernel can drop); `None` where there is no such file or line.
pub fn available_memory_bytes() -> Option<u64> {
    parse_kb_field(
        &std::fs::read_to_string("/proc/meminfo").ok()?,
        "MemAvailable",
    )
}

/// The line `FIELD:  N kB` of a `/proc` text (`/proc/meminfo`,
/// `/proc/self/status`), in bytes.
pub(crate) fn parse_kb_field(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.split(':').next() == Some(field))?;
    let mut words = line[field.len() + 1..].split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => n.checked_mul(1024),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_are_read_in_kibibytes() {
        let text = "MemTotal:       24576000 kB\nMemAvailable:  100 kB\n";
        assert_eq!(parse_kb_field(text, "MemTotal"), Some(24_576_000 * 1024));
        assert_eq!(parse_kb_field(text, "MemAvailable"), Some(100 * 1024));
        assert_eq!(parse_kb_field("MemFree: 1 kB\n", "MemAvailable"), None);
        assert_eq!(parse_kb_field("MemAvailable: 12\n", "MemAvailable"), None);
        #[cfg(target_os = "linux")]
        assert!(available_memory_bytes().is_some_and(|b| b > 1 << 20));
    }
}
