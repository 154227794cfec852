//! Dynamic loss scaling for fp16 training (Micikevicius et al. 2018,
//! "Mixed Precision Training"), with the defaults of PyTorch's
//! `torch.amp.GradScaler` (and apex's dynamic scaler): initial scale
//! 2^16, halved on an overflow, doubled after 2000 consecutive clean steps.
//!
//! The loss is multiplied by the scale before backward, so that small
//! fp16 gradients do not flush to zero; the step divides the accumulated
//! f32 gradients by it again (folded into the clipping factor). A step
//! whose gradients overflowed (a non-finite global norm, which every rank
//! sees because the norm is all-reduced) is skipped and the scale halved;
//! every rank takes the same decision from the same norm, so the scalers
//! of all ranks stay equal without communicating.

use serde::{Deserialize, Serialize};

/// Default initial scale, 2^16 (`GradScaler(init_scale=65536.0)`).
pub const DEFAULT_INIT_SCALE: f64 = 65536.0;

/// Default clean steps before the scale doubles (`growth_interval=2000`).
pub const DEFAULT_WINDOW: usize = 2000;

/// The scale never drops below this (Megatron's `--min-loss-scale` 1):
/// an overflow at scale 1 is a real non-finite gradient, not a scaling
/// problem.
pub const MIN_SCALE: f64 = 1.0;

/// The scaler's settings (`--loss-scale-init`, `--loss-scale-window`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScaleConfig {
    /// Scale of the first step (a power of two keeps the scaling exact).
    pub init: f64,
    /// Consecutive clean steps after which the scale doubles.
    pub window: usize,
}

impl Default for LossScaleConfig {
    fn default() -> Self {
        Self {
            init: DEFAULT_INIT_SCALE,
            window: DEFAULT_WINDOW,
        }
    }
}

/// The scaler's state; what a checkpoint stores to resume it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossScaler {
    /// The factor the next step's loss is multiplied by.
    pub scale: f64,
    /// Clean steps since the scale last changed (or since the start).
    pub clean_steps: usize,
    /// Steps skipped for overflow since the start of the run.
    pub skipped_steps: usize,
    /// Clean steps after which the scale doubles.
    pub window: usize,
}

/// What [`LossScaler::update`] decided about a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleOutcome {
    /// The gradients were finite: apply the step.
    Apply,
    /// The gradients overflowed at a scale above [`MIN_SCALE`]: skip the
    /// step (the scale was halved).
    Overflow,
    /// The gradients were not finite at the smallest scale: not an
    /// overflow of the scaling, a non-finite step for the run's policy.
    NonFinite,
}

impl LossScaler {
    /// A scaler starting at `config.init`.
    pub fn new(config: LossScaleConfig) -> Self {
        Self {
            scale: config.init,
            clean_steps: 0,
            skipped_steps: 0,
            window: config.window.max(1),
        }
    }

    /// Records a step whose scaled gradients were `finite` or not, and
    /// updates the scale for the next one.
    pub fn update(&mut self, finite: bool) -> ScaleOutcome {
        if finite {
            self.clean_steps += 1;
            if self.clean_steps >= self.window {
                self.scale *= 2.0;
                self.clean_steps = 0;
            }
            return ScaleOutcome::Apply;
        }
        self.clean_steps = 0;
        if self.scale <= MIN_SCALE {
            return ScaleOutcome::NonFinite;
        }
        self.scale = (self.scale / 2.0).max(MIN_SCALE);
        self.skipped_steps += 1;
        ScaleOutcome::Overflow
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_halves_and_clean_window_doubles() {
        let mut s = LossScaler::new(LossScaleConfig {
            init: 1024.0,
            window: 3,
        });
        assert_eq!(s.update(false), ScaleOutcome::Overflow);
        assert_eq!(s.update(false), ScaleOutcome::Overflow);
        assert_eq!((s.scale, s.skipped_steps), (256.0, 2));
        assert_eq!(s.update(true), ScaleOutcome::Apply);
        assert_eq!(s.update(true), ScaleOutcome::Apply);
        assert_eq!(s.scale, 256.0);
        assert_eq!(s.update(true), ScaleOutcome::Apply);
        assert_eq!((s.scale, s.clean_steps), (512.0, 0));
        // An overflow restarts the count of clean steps.
        s.update(true);
        s.update(true);
        assert_eq!(s.update(false), ScaleOutcome::Overflow);
        assert_eq!((s.scale, s.clean_steps, s.skipped_steps), (256.0, 0, 3));
    }

    #[test]
    fn defaults_are_torch_grad_scaler_s() {
        let s = LossScaler::new(LossScaleConfig::default());
        assert_eq!((s.scale, s.window), (65536.0, 2000));
    }

    #[test]
    fn non_finite_at_the_smallest_scale_is_not_an_overflow() {
        let mut s = LossScaler::new(LossScaleConfig {
            init: 2.0,
            window: 10,
        });
        assert_eq!(s.update(false), ScaleOutcome::Overflow);
        assert_eq!(s.scale, 1.0);
        assert_eq!(s.update(false), ScaleOutcome::NonFinite);
        assert_eq!((s.scale, s.skipped_steps), (1.0, 1));
    }
}
