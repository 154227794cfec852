//! Ferrotron parallel execution.
//!
//! Today this crate holds the training step executor ([`trainer::Trainer`]),
//! which runs on one rank; the communicators, the device mesh, data/tensor/
//! pipeline parallelism and ZeRO will wrap the same executor (DESIGN.md): a
//! single-device run is the parallel code with every degree set to 1.

pub mod trainer;
