//! [`NcclCommunicator`]: the [`Communicator`] contract on NCCL / RCCL,
//! bootstrapped over a host communicator (MPI).

use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::comm::{check_blocks, check_rank, CommError, Communicator, Incoming, Outgoing};

use super::comm::NcclComm;
use super::library::NcclLibrary;
use super::types::{NcclDataType, NcclReduceOp};
use super::watchdog::Watchdog;
use super::NcclError;

/// The operations counted for the watchdog's messages, by index.
const OPS: [&str; 7] = [
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "send",
    "recv",
    "exchange",
];

/// A [`Communicator`] whose collectives and point-to-point calls run on
/// NCCL / RCCL, over the ranks of a host communicator that bootstrapped it.
///
/// # Memory
///
/// The trait's buffers are host slices, and this communicator hands their
/// pointers to the library as they are: it runs on a library that works
/// on host memory, such as Ferrotron's test double
/// (`crates/nccl-double`), which makes the whole CPU training path run
/// through this binding. A real NCCL or RCCL needs device buffers; `ferrotron train`
/// therefore builds this communicator on CPU backends only, and only when
/// `FERROTRON_NCCL_LIBRARY` names a library.
///
/// # Groups, barrier, abort
///
/// [`Communicator::split`] splits the host communicator and creates a new
/// NCCL communicator over the group (rank 0 of the group makes a unique id,
/// broadcast over the group's host communicator, then `ncclCommInitRank`),
/// so every group of the job runs on NCCL. [`Communicator::barrier`] and
/// [`Communicator::abort`] are the host communicator's (a barrier is a host
/// rendezvous, and MPI's names the missing ranks).
///
/// # Timeout
///
/// Every NCCL call runs under a watchdog thread (`watchdog.rs`): past the
/// timeout, the process writes the operation and its number to stderr and
/// exits with code 1, and the launcher ends the job. NCCL cannot name the
/// missing ranks. Sends and receives have no tags in NCCL: the `tag`
/// arguments are ignored, and messages between two ranks match in order.
pub struct NcclCommunicator {
    /// Dropped (`ncclCommDestroy`) before `host`, whose MPI it may use.
    nccl: NcclComm,
    /// The host communicator of the same ranks.
    host: Arc<dyn Communicator>,
    /// This process's rank in the whole job, for the watchdog's message.
    job_rank: usize,
    timeout: Duration,
    /// Operations so far, per entry of [`OPS`]; held for the whole of an
    /// operation, so that NCCL never sees two calls on one communicator at once.
    serial: Mutex<[u64; OPS.len()]>,
    watchdog: Watchdog,
}

// SAFETY: the NCCL communicator is an opaque handle that NCCL lets any
// thread use, one call at a time; every call holds `serial`. The host
// communicator is `Send + Sync` itself.
unsafe impl Send for NcclCommunicator {}
// SAFETY: as for `Send`: shared use goes through `serial`.
unsafe impl Sync for NcclCommunicator {}

impl NcclCommunicator {
    /// An NCCL communicator over the ranks of `host` (collective over
    /// `host`), whose calls may take `timeout`. `host` must be the whole
    /// job (its ranks name the processes in the watchdog's message).
    pub fn new(
        lib: Arc<NcclLibrary>,
        host: Arc<dyn Communicator>,
        timeout: Duration,
    ) -> Result<Self, CommError> {
        let job_rank = host.rank();
        Self::over(lib, host, job_rank, timeout)
    }

    /// An NCCL communicator over `host`, in a process of job rank `job_rank`.
    fn over(
        lib: Arc<NcclLibrary>,
        host: Arc<dyn Communicator>,
        job_rank: usize,
        timeout: Duration,
    ) -> Result<Self, CommError> {
        if timeout.is_zero() {
            return Err(CommError::Transport(
                "the communicator timeout must be positive".into(),
            ));
        }
        // Every rank arrives (under the host's timeout) before NCCL, which
        // has none, is asked to wait for the others in ncclCommInitRank.
        host.barrier()?;
        let nccl = NcclComm::init(lib, &*host).map_err(nccl_error)?;
        let watchdog = Watchdog::start(job_rank, "NCCL", timeout)
            .map_err(|e| CommError::Transport(format!("starting the NCCL watchdog thread: {e}")))?;
        Ok(Self {
            nccl,
            host,
            job_rank,
            timeout,
            serial: Mutex::new([0; OPS.len()]),
            watchdog,
        })
    }

    /// The library this communicator runs on.
    pub fn library(&self) -> &Arc<NcclLibrary> {
        self.nccl.library()
    }

    /// Runs `call` as operation `OPS[op]` under the lock and the watchdog.
    fn run(
        &self,
        op: usize,
        call: impl FnOnce(&NcclComm) -> Result<(), NcclError>,
    ) -> Result<(), CommError> {
        let mut counts = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        counts[op] += 1;
        let _watched = self.watchdog.watch(OPS[op], counts[op]);
        call(&self.nccl).map_err(nccl_error)
    }
}

/// An error of the binding as a communicator error (its message names the
/// NCCL function and code).
fn nccl_error(e: NcclError) -> CommError {
    match e {
        NcclError::Bootstrap(inner) => inner,
        other => CommError::Transport(other.to_string()),
    }
}

/// A host slice as the library's input pointer.
fn input(buf: &[f32]) -> *const c_void {
    buf.as_ptr().cast()
}

/// A host slice as the library's output pointer.
fn output(buf: &mut [f32]) -> *mut c_void {
    buf.as_mut_ptr().cast()
}

/// The default stream: the library works on host memory, synchronously.
const STREAM: *mut c_void = std::ptr::null_mut();

impl Communicator for NcclCommunicator {
    fn rank(&self) -> usize {
        self.nccl.rank()
    }

    fn world_size(&self) -> usize {
        self.nccl.world_size()
    }

    fn split(&self, color: usize, key: usize) -> Result<Arc<dyn Communicator>, CommError> {
        let host = self.host.split(color, key)?;
        let lib = self.nccl.library().clone();
        Ok(Arc::new(Self::over(
            lib,
            host,
            self.job_rank,
            self.timeout,
        )?))
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CommError> {
        let ptr = output(buf);
        // SAFETY: `ptr` is valid for `buf.len()` values, in place, for the
        // whole call, which completes before returning (host memory).
        self.run(0, |c| unsafe {
            c.all_reduce(
                ptr,
                ptr,
                buf.len(),
                NcclDataType::F32,
                NcclReduceOp::Sum,
                STREAM,
            )
        })
    }

    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        check_blocks("all_gather", send.len(), recv.len(), self.world_size())?;
        let n = send.len();
        // SAFETY: both slices are valid and apart for the whole call.
        self.run(1, |c| unsafe {
            c.all_gather(input(send), output(recv), n, NcclDataType::F32, STREAM)
        })
    }

    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        check_blocks(
            "reduce_scatter_sum",
            recv.len(),
            send.len(),
            self.world_size(),
        )?;
        let n = recv.len();
        // SAFETY: both slices are valid and apart for the whole call.
        self.run(2, |c| unsafe {
            c.reduce_scatter(
                input(send),
                output(recv),
                n,
                NcclDataType::F32,
                NcclReduceOp::Sum,
                STREAM,
            )
        })
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        check_rank("broadcast", root, self.world_size())?;
        let ptr = output(buf);
        // SAFETY: in place on a slice valid for the whole call.
        self.run(3, |c| unsafe {
            c.broadcast(ptr, ptr, buf.len(), NcclDataType::F32, root, STREAM)
        })
    }

    fn send(&self, buf: &[f32], dest: usize, _tag: i32) -> Result<(), CommError> {
        check_rank("send", dest, self.world_size())?;
        // SAFETY: the slice is valid for the whole call.
        self.run(4, |c| unsafe {
            c.send(input(buf), buf.len(), NcclDataType::F32, dest, STREAM)
        })
    }

    fn recv(&self, buf: &mut [f32], src: usize, _tag: i32) -> Result<(), CommError> {
        check_rank("recv", src, self.world_size())?;
        let n = buf.len();
        // SAFETY: the slice is valid for the whole call.
        self.run(5, |c| unsafe {
            c.recv(output(buf), n, NcclDataType::F32, src, STREAM)
        })
    }

    fn exchange(
        &self,
        sends: &[Outgoing<'_>],
        recvs: &mut [Incoming<'_>],
    ) -> Result<(), CommError> {
        for s in sends {
            check_rank("exchange", s.to, self.world_size())?;
        }
        for r in recvs.iter() {
            check_rank("exchange", r.from, self.world_size())?;
        }
        // NCCL has no tags: the messages between two ranks match in the
        // order they are posted, so both ends post them in tag order.
        let mut sends: Vec<&Outgoing<'_>> = sends.iter().collect();
        sends.sort_by_key(|s| s.tag);
        let mut recvs: Vec<&mut Incoming<'_>> = recvs.iter_mut().collect();
        recvs.sort_by_key(|r| r.tag);
        let lib = self.nccl.library();
        self.run(6, |c| {
            lib.group_start()?;
            for s in &sends {
                // SAFETY: the slice is valid for the whole call (the group
                // completes before `run` returns).
                unsafe {
                    c.send(
                        input(s.values),
                        s.values.len(),
                        NcclDataType::F32,
                        s.to,
                        STREAM,
                    )?
                };
            }
            for r in &mut recvs {
                let n = r.values.len();
                // SAFETY: as for the sends.
                unsafe { c.recv(output(r.values), n, NcclDataType::F32, r.from, STREAM)? };
            }
            lib.group_end()
        })
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.host.barrier()
    }

    fn abort(&self, code: i32) -> ! {
        self.host.abort(code)
    }
}
