//! What the test crates of Ferrotron share (a dev-dependency only, never
//! published): child processes under a deadline, where the NCCL test
//! double is, skips that `scripts/test --mpi` (CI) turns into failures,
//! reading and comparing run directories, and the small corpora tests
//! write.

pub mod corpus;
pub mod deadline;
pub mod mpirun;
pub mod nccl_double;
pub mod runs;
pub mod skip;
