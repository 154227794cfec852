//! `--comm`: which transport carries the collectives of a multi-rank run,
//! and opening the job's communicator over it.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;

use ferrotron_engine::backend::BackendKind;
use ferrotron_parallel::comm::nccl::{NcclLibrary, LIBRARY_ENV};
use ferrotron_parallel::comm::{Communicator, SingleProcess};
use ferrotron_parallel::launch::LaunchInfo;
use serde::{Deserialize, Serialize};

use crate::error::usage;

/// `--comm`: the transport of every process group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CommChoice {
    /// MPI on every backend today (NCCL/RCCL need device buffers, which
    /// the NCCL communicator does not take yet).
    #[default]
    Auto,
    /// Open MPI on host buffers.
    Mpi,
    /// NCCL / RCCL through the run-time binding, bootstrapped over MPI.
    Nccl,
}

/// The transport chosen for a run.
pub enum Transport {
    /// MPI.
    Mpi,
    /// NCCL / RCCL, on this library (used by multi-rank runs, which need
    /// the `mpi` feature).
    Nccl(#[cfg_attr(not(feature = "mpi"), allow(dead_code))] Arc<NcclLibrary>),
}

/// Resolves `--comm` for backend `kind`; `library` is the value of
/// `FERROTRON_NCCL_LIBRARY`. `--comm nccl` needs a CPU backend and that
/// variable naming a library that loads: the NCCL communicator hands the
/// library host buffers, which only a library working on host memory
/// takes (the repository's test double); GPU buffers are not wired yet.
pub fn resolve(
    choice: CommChoice,
    kind: BackendKind,
    library: Option<&OsStr>,
) -> anyhow::Result<Transport> {
    match choice {
        CommChoice::Auto | CommChoice::Mpi => Ok(Transport::Mpi),
        CommChoice::Nccl if !kind.is_cpu() => Err(usage(format!(
            "--comm nccl with --backend {kind}: the NCCL communicator moves host buffers and does not take {kind} device buffers yet; use --comm mpi (or auto)"
        ))),
        CommChoice::Nccl => match library {
            None => Err(usage(format!(
                "--comm nccl with --backend {kind}: NCCL and RCCL work on GPU memory and {kind} tensors are in host memory; \
                 set {LIBRARY_ENV} to a library that works on host memory (the test double built from crates/nccl-double) \
                 to run the CPU path through NCCL, or use --comm mpi"
            ))),
            Some(path) => NcclLibrary::load_from(Some(path))
                .map(|lib| Transport::Nccl(Arc::new(lib)))
                .map_err(|e| usage(format!("--comm nccl: {e}"))),
        },
    }
}

/// The communicator of this job over `transport`: one rank needs none (a
/// [`SingleProcess`]); otherwise MPI's world, with `timeout` on every
/// operation, itself or as the bootstrap of an NCCL communicator.
#[cfg_attr(not(feature = "mpi"), allow(unused_variables))]
pub fn open(
    launch: &LaunchInfo,
    transport: Transport,
    timeout: Duration,
) -> anyhow::Result<Arc<dyn Communicator>> {
    if launch.world_size == 1 {
        return Ok(Arc::new(SingleProcess));
    }
    #[cfg(feature = "mpi")]
    {
        let comm = ferrotron_parallel::comm::MpiCommunicator::init_with_timeout(timeout)
            .map_err(|e| anyhow::anyhow!("starting MPI: {e}"))?;
        if (comm.rank(), comm.world_size()) != (launch.rank, launch.world_size) {
            return Err(usage(format!(
                "{} says rank {} of {}, but MPI says rank {} of {}; multi-rank runs need mpirun or srun with MPI (PMIx)",
                launch.launcher,
                launch.rank,
                launch.world_size,
                comm.rank(),
                comm.world_size()
            )));
        }
        let world: Arc<dyn Communicator> = Arc::new(comm);
        match transport {
            Transport::Mpi => Ok(world),
            Transport::Nccl(lib) => {
                use ferrotron_parallel::comm::nccl::NcclCommunicator;
                match NcclCommunicator::new(lib, world.clone(), timeout) {
                    Ok(nccl) => Ok(Arc::new(nccl)),
                    Err(e) => {
                        // The other ranks may wait for this one: end the job.
                        let line = format!("error (rank {}): starting NCCL: {e}\n", world.rank());
                        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
                        world.abort(1)
                    }
                }
            }
        }
    }
    #[cfg(not(feature = "mpi"))]
    Err(usage(format!(
        "{} started {} ranks, but this ferrotron was built without the `mpi` feature (cargo build --features mpi)",
        launch.launcher, launch.world_size
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(r: anyhow::Result<Transport>) -> String {
        match r {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn auto_and_mpi_choose_mpi_on_every_backend() {
        for kind in [
            BackendKind::Flex,
            BackendKind::Ndarray,
            BackendKind::Cuda,
            BackendKind::Rocm,
        ] {
            for choice in [CommChoice::Auto, CommChoice::Mpi] {
                let lib = Some(OsStr::new("/nonexistent/libnccl.so.2"));
                assert!(matches!(resolve(choice, kind, lib), Ok(Transport::Mpi)));
            }
        }
    }

    #[test]
    fn nccl_on_a_cpu_backend_needs_the_library_variable() {
        let msg = message(resolve(CommChoice::Nccl, BackendKind::Flex, None));
        assert!(msg.starts_with("--comm nccl with --backend flex:"), "{msg}");
        assert!(msg.contains(LIBRARY_ENV), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
    }

    #[test]
    fn nccl_with_a_library_that_does_not_open_names_the_file() {
        let path = "/nonexistent/ferrotron/libnccl.so.2";
        let msg = message(resolve(
            CommChoice::Nccl,
            BackendKind::Flex,
            Some(OsStr::new(path)),
        ));
        assert!(msg.contains(&format!("{LIBRARY_ENV}={path}")), "{msg}");
    }

    #[test]
    fn nccl_on_a_gpu_backend_is_refused_until_device_buffers_are_wired() {
        for kind in [BackendKind::Cuda, BackendKind::Rocm] {
            let msg = message(resolve(CommChoice::Nccl, kind, None));
            assert!(msg.contains("--comm mpi"), "{msg}");
        }
    }
}
