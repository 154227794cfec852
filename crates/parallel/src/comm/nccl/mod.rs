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
//! broadcast over it. The collectives take raw device pointers and a raw
//! `cudaStream_t` / `hipStream_t`. No glue to CubeCL buffers exists yet: in
//! cubecl 0.10 a buffer's device address is reachable
//! (`ComputeClient::get_resource`), but the stream the runtime launches on
//! is private, so NCCL work cannot be ordered with CubeCL kernels except by
//! full synchronisation. Training does not use this module yet; it moves
//! gradients through the host communicator.

mod comm;
mod error;
mod library;
mod types;
mod unique_id;

pub use comm::NcclComm;
pub use error::NcclError;
pub use library::{NcclLibrary, LIBRARY_ENV, LIBRARY_NAMES};
pub use types::{result_name, NcclDataType, NcclReduceOp};
pub use unique_id::{UniqueId, UNIQUE_ID_BYTES, UNIQUE_ID_WORDS};
