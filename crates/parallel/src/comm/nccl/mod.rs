//! NCCL and RCCL through one binding loaded at run time.
//!
//! RCCL (AMD) exports NCCL's C API unchanged, so one `dlopen` binding of
//! that API serves both: [`NcclLibrary::load`] opens the file named by
//! `FERROTRON_NCCL_LIBRARY` ([`LIBRARY_ENV`]) if set, otherwise the first of
//! `libnccl.so.2`, `libnccl.so`, `librccl.so.1`, `librccl.so`
//! ([`LIBRARY_NAMES`]). Nothing is linked at build time, so every build
//! compiles this module and a binary without either library runs CPU jobs;
//! asking for NCCL there returns an [`NcclError`] that names every file
//! tried and what to install or set.
//!
//! [`NcclComm::init`] bootstraps a communicator over an existing host
//! [`Communicator`](crate::comm::Communicator) (MPI): rank 0's unique id is
//! broadcast over it. Its collectives take raw pointers and a raw
//! `cudaStream_t` / `hipStream_t`.
//!
//! [`NcclCommunicator`] puts it behind the `Communicator` trait: every
//! group of the job gets its own NCCL communicator (`split`), every call
//! runs under a watchdog thread (`watchdog.rs`), and the trait's host buffers go to
//! the library as they are. That is right for a library that works on host
//! memory, such as the repository's test double (`crates/nccl-double`),
//! with which the CPU training path runs through this binding.
//!
//! [`device::DeviceComm`] runs all-reduce, all-gather and reduce-scatter on
//! device buffers, on a stream of Ferrotron's own, ordered against the
//! device's work; with the cuda or rocm feature, [`device::cube`] feeds it
//! the buffers of CubeCL tensors. The trainer's gradient sync does not use
//! it yet: it moves host buffers (docs/parallelism.md, "NCCL").

mod comm;
mod communicator;
pub mod device;
mod error;
mod library;
pub mod memory;
mod names;
mod types;
mod unique_id;
mod watchdog;

pub use comm::NcclComm;
pub use communicator::NcclCommunicator;
pub use error::NcclError;
pub use library::NcclLibrary;
pub use names::{LIBRARY_ENV, LIBRARY_NAMES};
pub use types::{result_name, NcclDataType, NcclReduceOp};
pub use unique_id::{UniqueId, UNIQUE_ID_BYTES, UNIQUE_ID_WORDS};
