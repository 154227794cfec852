//! Every `MpiCommunicator` operation, checked on 2, 3 and 4 ranks under
//! `mpirun` against the communicator contract (`contract/mod.rs`: groups
//! split from the world, the tp2 x dp2 process groups, the tensor
//! collectives). The launcher test
//! re-runs this test binary under `mpirun`, selecting the ignored worker
//! test; a failing assertion on any rank makes `mpirun` exit non-zero. Skipped (with a printed reason) without the
//! `mpi` feature; with it, a missing `mpirun` is a failure. A job still
//! running after `DEADLINE` is killed and fails the test (a hang).

use std::time::Duration;

use ferrotron_test_support::mpirun;
use ferrotron_test_support::skip::skip;

/// When a job that never ends is killed (one job takes seconds).
const DEADLINE: Duration = Duration::from_secs(300);

#[test]
fn mpi_communicator_operations_are_correct_on_2_3_and_4_ranks() {
    if !cfg!(feature = "mpi") {
        skip("built without the `mpi` feature; run `cargo test -p ferrotron-parallel --features mpi`");
        return;
    }
    for ranks in [2, 3, 4] {
        let (o, text) = mpirun::worker(ranks, &[], "mpi_comm::mpi_worker", DEADLINE);
        assert!(o.status.success(), "np {ranks}:\n{text}");
        assert!(text.matches("1 passed").count() >= 2, "np {ranks}:\n{text}");
    }
}

/// One rank's checks; run only under mpirun by the test above.
#[test]
#[ignore = "runs under mpirun, started by mpi_communicator_operations_are_correct_on_2_3_and_4_ranks"]
fn mpi_worker() {
    #[cfg(feature = "mpi")]
    worker::run();
}

#[cfg(feature = "mpi")]
mod worker {
    use std::sync::Arc;

    use ferrotron_parallel::comm::MpiCommunicator;

    pub fn run() {
        crate::contract::check(Arc::new(MpiCommunicator::init().unwrap()));
    }
}
