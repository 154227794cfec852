//! `parallelism.comm`: which transport carries the collectives of a multi-rank run,
//! and opening the job's communicator over it.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;

use burn::tensor::backend::Backend;
use ferrotron_engine::backend::BackendKind;
use ferrotron_parallel::comm::nccl::device::{DeviceComm, HostStreams, SharedCollectives};
use ferrotron_parallel::comm::nccl::{NcclLibrary, LIBRARY_ENV};
use ferrotron_parallel::comm::{CommError, Communicator, SingleProcess};
use ferrotron_parallel::launch::LaunchInfo;

use crate::config::CommChoice;
use crate::error::usage;

/// Whether this build runs multi-rank jobs (the `mpi` feature): without
/// it [`open`] refuses a world of more than one rank.
pub const MPI_BUILT: bool = cfg!(feature = "mpi");

/// The transport chosen for a run.
#[derive(Clone)]
pub enum Transport {
    /// MPI.
    Mpi,
    /// NCCL / RCCL on host buffers, this library (a library on host
    /// memory: the test double; used by multi-rank runs, which need the
    /// `mpi` feature).
    Nccl(#[cfg_attr(not(feature = "mpi"), allow(dead_code))] Arc<NcclLibrary>),
    /// NCCL / RCCL on the buffers of this GPU backend, this library: each
    /// rank's collectives staged through its GPU's memory.
    NcclDevice(
        #[cfg_attr(not(feature = "mpi"), allow(dead_code))] Arc<NcclLibrary>,
        #[cfg_attr(not(feature = "mpi"), allow(dead_code))] BackendKind,
    ),
}

/// Resolves `--comm` for backend `kind`; `library` is the value of
/// `FERROTRON_NCCL_LIBRARY`; `device_layout` says the job has more than
/// one rank and, if it has context parallelism, the fused kernels (whose
/// attention computes the ring's blocks on device tensors).
///
/// - `auto`: NCCL / RCCL on cuda and rocm for such a job whose library
///   loads (`library`, else the first of `LIBRARY_NAMES` that opens); MPI
///   otherwise. Such a job's gradient sync (the reductions and ZeRO's
///   parameter all-gathers), TP operators, sequence parallelism's partial
///   gradients, pipeline messages (activations, their gradients, the
///   tied embedding's sum) and CP ring (keys, values, their gradients'
///   partial sums, and each block's attention) hand NCCL their device
///   tensors; what is left on the host path is small (scalars per step).
///   A CP job on the reference kernels stays on MPI: its ring would
///   compute each block on host buffers (`context::OnHost`, a copy to
///   the host and back per block and step that MPI's host ring does not
///   make).
/// - `mpi`: MPI.
/// - `nccl`: on cuda and rocm, the library as for `auto`, which must
///   load (the calls on host buffers staged through the rank's GPU); on a
///   CPU backend, `library` must name a library that works on host memory
///   (the repository's test double).
pub fn resolve(
    choice: CommChoice,
    kind: BackendKind,
    library: Option<&OsStr>,
    device_layout: bool,
) -> Result<Transport, String> {
    match choice {
        CommChoice::Auto if device_layout && matches!(kind, BackendKind::Cuda | BackendKind::Rocm) => {
            Ok(NcclLibrary::load_from(library)
                .map(|lib| Transport::NcclDevice(Arc::new(lib), kind))
                .unwrap_or(Transport::Mpi))
        }
        CommChoice::Auto | CommChoice::Mpi => Ok(Transport::Mpi),
        CommChoice::Nccl if !kind.is_cpu() => NcclLibrary::load_from(library)
            .map(|lib| Transport::NcclDevice(Arc::new(lib), kind))
            .map_err(|e| format!("nccl with --backend {kind}: {e}; or use --comm mpi")),
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
/// operation, itself or as the bootstrap of an NCCL communicator (on a
/// GPU backend, on the rank's GPU: its launcher's local rank).
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
        let (lib, gpu) = match transport {
            Transport::Mpi => return Ok(world),
            Transport::Nccl(lib) => (lib, None),
            Transport::NcclDevice(lib, kind) => (lib, Some(kind)),
        };
        let nccl = memory(gpu, launch.local_rank).and_then(|memory| {
            ferrotron_parallel::comm::nccl::NcclCommunicator::on(
                lib,
                world.clone(),
                memory,
                timeout,
            )
        });
        match nccl {
            Ok(nccl) => Ok(Arc::new(nccl)),
            Err(e) => {
                // The other ranks may wait for this one: end the job.
                let line = format!("error (rank {}): starting NCCL: {e}\n", world.rank());
                let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
                world.abort(1)
            }
        }
    }
    #[cfg(not(feature = "mpi"))]
    Err(usage(format!(
        "{} started {} ranks, but this ferrotron was built without the `mpi` feature (cargo build --features mpi)",
        launch.launcher, launch.world_size
    )))
}

/// Where the NCCL communicator's buffers go: host memory (`None`), or the
/// memory of GPU `gpu` (the launcher's local rank, the GPU the rank
/// trains on) of backend `kind`.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
#[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(unused_variables))]
fn memory(
    kind: Option<BackendKind>,
    gpu: usize,
) -> Result<
    Arc<dyn ferrotron_parallel::comm::nccl::memory::Memory>,
    ferrotron_parallel::comm::CommError,
> {
    use ferrotron_parallel::comm::nccl::memory::HostMemory;
    match kind {
        None => Ok(Arc::new(HostMemory)),
        #[cfg(feature = "cuda")]
        Some(BackendKind::Cuda) => {
            use burn_cubecl::cubecl::cuda::{CudaDevice, CudaRuntime};
            use ferrotron_parallel::comm::nccl::device::cube::Staged;
            Ok(Arc::new(Staged::<CudaRuntime>::new(&CudaDevice {
                index: gpu,
            })?))
        }
        #[cfg(feature = "rocm")]
        Some(BackendKind::Rocm) => {
            use burn_cubecl::cubecl::hip::{AmdDevice, HipRuntime};
            use ferrotron_parallel::comm::nccl::device::cube::Staged;
            Ok(Arc::new(Staged::<HipRuntime>::new(&AmdDevice {
                index: gpu,
            })?))
        }
        Some(other) => Err(ferrotron_parallel::comm::CommError::Transport(format!(
            "NCCL on {other} buffers is not compiled into this build"
        ))),
    }
}

impl Transport {
    /// What carries the collectives, for the run's log: `MPI`, or NCCL
    /// with its library and the memory its buffers are in.
    pub fn describe(&self) -> String {
        match self {
            Transport::Mpi => "MPI".into(),
            Transport::Nccl(lib) => format!("NCCL ({}) on host memory", lib.path()),
            Transport::NcclDevice(lib, kind) => format!("NCCL ({}) on {kind} buffers", lib.path()),
        }
    }

    /// The NCCL library of an NCCL transport, with the GPU backend whose
    /// buffers it reads (`None`: host memory); `None` for MPI.
    pub(crate) fn nccl(&self) -> Option<(&Arc<NcclLibrary>, Option<BackendKind>)> {
        match self {
            Transport::Mpi => None,
            Transport::Nccl(lib) => Some((lib, None)),
            Transport::NcclDevice(lib, kind) => Some((lib, Some(*kind))),
        }
    }
}

/// The collectives of `lib` over `group` (the DP x CP group) on the
/// gradients' own tensors of backend `B` on `device`: on GPU backend `gpu`
/// (cuda, rocm) NCCL / RCCL reads the device buffers in place
/// (`comm::nccl::device::cube`); without one, a library on host memory
/// (the test double) runs the same path there. A collective over `group`.
pub(crate) fn device_collectives<B: Backend>(
    lib: &Arc<NcclLibrary>,
    gpu: Option<BackendKind>,
    device: &B::Device,
    group: &dyn Communicator,
) -> Result<SharedCollectives<B>, CommError> {
    let Some(kind) = gpu else {
        let comm = DeviceComm::init(lib.clone(), group, Box::new(HostStreams))?;
        return Ok(Arc::new(comm));
    };
    // The communicator typed for the GPU backend, boxed so that it can be
    // taken back as `B`'s: the same type when `B` is that backend, as
    // dispatch makes it.
    let typed = cube_collectives(lib, kind, device, group)?;
    typed
        .downcast::<SharedCollectives<B>>()
        .map(|shared| *shared)
        .map_err(|_| not_backend(kind))
}

/// [`device_collectives`] on GPU backend `kind`: its communicator as the
/// `SharedCollectives` of `ferrotron_models::ops::{Cuda, Rocm}`, boxed.
#[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(unused_variables))]
fn cube_collectives(
    lib: &Arc<NcclLibrary>,
    kind: BackendKind,
    device: &dyn std::any::Any,
    group: &dyn Communicator,
) -> Result<Box<dyn std::any::Any>, CommError> {
    match kind {
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            use ferrotron_parallel::comm::nccl::device::cube::CudaComm;
            let device = device.downcast_ref().ok_or_else(|| not_backend(kind))?;
            let shared: SharedCollectives<ferrotron_models::ops::Cuda> =
                Arc::new(CudaComm::init(lib.clone(), group, device)?);
            Ok(Box::new(shared))
        }
        #[cfg(feature = "rocm")]
        BackendKind::Rocm => {
            use ferrotron_parallel::comm::nccl::device::cube::HipComm;
            let device = device.downcast_ref().ok_or_else(|| not_backend(kind))?;
            let shared: SharedCollectives<ferrotron_models::ops::Rocm> =
                Arc::new(HipComm::init(lib.clone(), group, device)?);
            Ok(Box::new(shared))
        }
        other => Err(CommError::Transport(format!(
            "NCCL on {other} buffers is not compiled into this build"
        ))),
    }
}

/// The error of a trainer whose backend type is not `kind`'s (a caller bug).
fn not_backend(kind: BackendKind) -> CommError {
    CommError::Transport(format!(
        "NCCL on device buffers: the trainer's backend is not {kind}'s"
    ))
}
