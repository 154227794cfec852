//! What the test crates of Ferrotron share (a dev-dependency only, never
//! published): child processes under a deadline, where the NCCL test
//! double is, and skips that `scripts/test --mpi` (CI) turns into failures.

pub mod deadline;
pub mod mpirun;
pub mod nccl_double;
pub mod skip;
