//! Ferrotron engine: numerics on one device.
//!
//! Backends, the optimizer and its schedule, data, checkpoint I/O and metrics.
//! Nothing here knows about ranks; `ferrotron-parallel` builds on it.

pub mod backend;
pub mod checkpoint;
pub mod data;
pub mod lm;
pub mod metrics;
pub mod optim;
pub mod params;
pub mod precision;
