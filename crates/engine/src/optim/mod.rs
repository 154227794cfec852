//! Optimisation: AdamW, the learning-rate schedule and gradient clipping.

mod adamw;
mod adamw_host;
mod clip;
mod schedule;

pub use adamw::{AdamW, AdamWConfig, FusedAdamW};
pub use adamw_host::AdamWCoefficients;
pub use clip::{clip_factor, clip_global_norm, global_grad_norm, grad_squares, scale_grads};
pub use schedule::LrSchedule;
