//! The parallel crate's integration tests, one test binary (each binary
//! links the whole of Burn, so the files are modules of one). The
//! multi-rank tests re-run this binary under `mpirun`, selecting an ignored
//! worker test by its full name (`module::worker`).

#[cfg(feature = "mpi")]
mod contract;

mod mpi_comm;
mod mpi_timeout;
mod nccl_comm;
mod plan_published;
