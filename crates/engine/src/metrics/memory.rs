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

/// The machine's total memory in bytes: `MemTotal` of `/proc/meminfo`
/// (Linux); `None` where there is no such file or line.
pub fn machine_memory_bytes() -> Option<u64> {
    parse_mem_total(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// `MemTotal:  N kB` of a `/proc/meminfo` text, in bytes.
fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
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
    fn mem_total_is_read_in_kibibytes() {
        let text = "MemTotal:       24576000 kB\nMemFree:  100 kB\n";
        assert_eq!(parse_mem_total(text), Some(24_576_000 * 1024));
        assert_eq!(parse_mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(parse_mem_total("MemTotal: 12\n"), None);
        #[cfg(target_os = "linux")]
        assert!(machine_memory_bytes().is_some_and(|b| b > 1 << 20));
    }
}
