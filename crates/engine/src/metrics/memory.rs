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
