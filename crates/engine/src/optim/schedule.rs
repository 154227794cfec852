//! Linear warm-up followed by cosine decay.

use serde::{Deserialize, Serialize};

/// Learning rate as a function of the optimizer step (0-based).
///
/// Rises linearly from `max_lr / warmup_steps` to `max_lr` over the first
/// `warmup_steps` steps, then follows a half cosine down to `min_lr` at
/// `total_steps`, and stays there.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    /// Peak learning rate.
    pub max_lr: f64,
    /// Final learning rate.
    pub min_lr: f64,
    /// Steps of linear warm-up.
    pub warmup_steps: usize,
    /// Total optimizer steps of the run.
    pub total_steps: usize,
}

impl LrSchedule {
    /// The learning rate to use at optimizer step `step` (0-based).
    pub fn lr(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            return self.max_lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let decay_steps = self.total_steps.saturating_sub(self.warmup_steps);
        if decay_steps == 0 || step >= self.total_steps {
            return self.min_lr;
        }
        let progress = (step - self.warmup_steps) as f64 / decay_steps as f64;
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.min_lr + (self.max_lr - self.min_lr) * cosine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warms_up_linearly_then_decays_by_cosine_to_min() {
        let s = LrSchedule {
            max_lr: 1.0,
            min_lr: 0.1,
            warmup_steps: 4,
            total_steps: 14,
        };
        assert_eq!(s.lr(0), 0.25);
        assert_eq!(s.lr(3), 1.0);
        assert!((s.lr(4) - 1.0).abs() < 1e-12);
        // Half-way through the decay the cosine is at its midpoint.
        assert!((s.lr(9) - 0.55).abs() < 1e-12);
        assert!((s.lr(14) - 0.1).abs() < 1e-12);
        assert!((s.lr(100) - 0.1).abs() < 1e-12);
        for step in 4..14 {
            assert!(s.lr(step + 1) <= s.lr(step));
        }
    }
}
