//! `parallelism.comm`: which transport carries the collectives of a multi-rank run,
//! and opening the job's communicator over it.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;

use ferrotron_engine::backend::BackendKind;
use ferrotron_parallel::comm::nccl::{NcclLibrary, LIBRARY_ENV};
use ferrotron_parallel::comm::{Communicator, SingleProcess};
use ferrotron_parallel::launch::LaunchInfo;

use crate::config::CommChoice;
use crate::error::usage;

/// The transport chosen for a run.
#[derive(Clone)]
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
) -> Result<Transport, String> {
    match choice {
        CommChoice::Auto | CommChoice::Mpi => Ok(Transport::Mpi),
        CommChoice::Nccl if !kind.is_cpu() => Err(format!(
            "nccl with --backend {kind}: the NCCL communicator moves host buffers and does not take {kind} device buffers yet; use --comm mpi (or auto)"
        )),
        CommChoice::Nccl => match library {
            None => Err(format!(
                "nccl with --backend {kind}: NCCL and RCCL work on GPU memory and {kind} tensors are in host memory; \
                 set {LIBRARY_ENV} to a library that works on host memory (the test double built from crates/nccl-double) \
                 to run the CPU path through NCCL, or use --comm mpi"
            )),
            Some(path) => NcclLibrary::load_from(Some(path))
                .map(|lib| Transport::Nccl(Arc::new(lib)))
                .map_err(|e| format!("nccl: {e}")),
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
