//! Ferrotron parallel execution.
//!
//! The training step executor ([`trainer::Trainer`]), the communicators
//! ([`comm`]), how a process learns its rank ([`launch`]), the device mesh
//! ([`mesh`]) and data parallelism ([`data`]). Tensor and pipeline
//! parallelism and ZeRO will wrap the same executor (DESIGN.md): a
//! single-device run is the parallel code with every degree set to 1.

pub mod comm;
pub mod data;
pub mod launch;
pub mod mesh;
pub mod trainer;
pub mod zero;
