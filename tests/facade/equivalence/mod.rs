//! What the multi-rank equivalence tests share. A test runs the one-rank
//! jobs in its own process, then starts this binary's ignored worker test
//! on several ranks under `mpirun` (with a deadline), whose ranks run the
//! multi-rank jobs through [`ferrotron::Job::on`], one after another on one
//! communicator; rank 0 of each job writes its run directory, and the test
//! compares those directories with the one-rank ones (`metrics.jsonl`,
//! `model.safetensors`; `ferrotron_test_support::runs`).
//!
//! Needs the `mpi` feature (`scripts/test --mpi` builds it) and Open MPI's
//! `mpirun`; without the feature the tests skip with a printed reason,
//! which `scripts/test --mpi` turns into a failure.
#![allow(dead_code)] // each test module uses a different subset

pub mod jobs;
pub mod layouts;
