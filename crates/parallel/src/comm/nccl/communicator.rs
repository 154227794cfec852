//! [`NcclCommunicator`]: the [`Communicator`] contract on NCCL / RCCL,
//! bootstrapped over a host communicator (MPI).

use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::comm::{check_blocks, check_rank, CommError, Communicator, Incoming, Outgoing};

use super::comm::NcclComm;
use super::library::NcclLibrary;
use super::memory::{Buf, HostMemory, Memory};
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
/// The trait's buffers are host slices. On [`HostMemory`] this
/// communicator hands their pointers to the library as they are: it runs
/// on a library that works on host memory, such as Ferrotron's test double
/// (`crates/nccl-double`), which makes the whole CPU training path run
/// through this binding. A real NCCL or RCCL needs device buffers: with a
/// [`Memory`] of a GPU (`device::cube::Staged`) each call's slices are
/// copied into device buffers, the call runs there on Ferrotron's own
/// stream, and the results are copied back.
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
    /// Where the library reads the buffers.
    memory: Arc<dyn Memory>,
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
    /// `host`), whose calls may take `timeout`, on a library that works on
    /// host memory ([`HostMemory`]). `host` must be the whole job (its
    /// ranks name the processes in the watchdog's message).
    pub fn new(
        lib: Arc<NcclLibrary>,
        host: Arc<dyn Communicator>,
        timeout: Duration,
    ) -> Result<Self, CommError> {
        Self::on(lib, host, Arc::new(HostMemory), timeout)
    }

    /// [`NcclCommunicator::new`] with the buffers in `memory` (on a GPU,
    /// `device::cube::Staged`: each call's values copied to device buffers
    /// and back).
    pub fn on(
        lib: Arc<NcclLibrary>,
        host: Arc<dyn Communicator>,
        memory: Arc<dyn Memory>,
        timeout: Duration,
    ) -> Result<Self, CommError> {
        let job_rank = host.rank();
        Self::over(lib, host, memory, job_rank, timeout)
    }

    /// An NCCL communicator over `host`, in a process of job rank `job_rank`.
    fn over(
        lib: Arc<NcclLibrary>,
        host: Arc<dyn Communicator>,
        memory: Arc<dyn Memory>,
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
        // Created with the device bound, so that NCCL binds it.
        let mut made = None;
        memory.exclusive(&mut || made = Some(NcclComm::init(lib.clone(), &*host)))?;
        let nccl = made
            .expect("Memory::exclusive runs its task")
            .map_err(nccl_error)?;
        let watchdog = Watchdog::start(job_rank, "NCCL", timeout)
            .map_err(|e| CommError::Transport(format!("starting the NCCL watchdog thread: {e}")))?;
        Ok(Self {
            nccl,
            host,
            memory,
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

    /// Runs `call(comm, addresses, stream)` on `bufs` (see [`Memory::run`])
    /// as operation `OPS[op]` under the lock and the watchdog.
    fn run(
        &self,
        op: usize,
        bufs: &mut [Buf<'_>],
        mut call: impl FnMut(&NcclComm, &[u64], *mut c_void) -> Result<(), NcclError> + Send,
    ) -> Result<(), CommError> {
        let mut counts = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        counts[op] += 1;
        let _watched = self.watchdog.watch(OPS[op], counts[op]);
        let comm = Held(&self.nccl);
        self.memory
            .run(bufs, &mut |ptrs, stream| call(comm.get(), ptrs, stream))
    }
}

/// The communicator, handed to [`Memory::run`]'s call, which runs on this
/// thread or the device's, once, while `serial` is held.
struct Held<'a>(&'a NcclComm);

// SAFETY: NCCL lets any thread use a communicator, one call at a time;
// `Held` lives only inside `NcclCommunicator::run`, under `serial`.
unsafe impl Send for Held<'_> {}
// SAFETY: as for `Send`.
unsafe impl Sync for Held<'_> {}

impl Held<'_> {
    fn get(&self) -> &NcclComm {
        self.0
    }
}

/// An error of the binding as a communicator error (its message names the
/// NCCL function and code).
pub(crate) fn nccl_error(e: NcclError) -> CommError {
    match e {
        NcclError::Bootstrap(inner) => inner,
        other => CommError::Transport(other.to_string()),
    }
}

/// An address as the library's input pointer.
fn input(p: u64) -> *const c_void {
    p as *const c_void
}

/// An address as the library's output pointer.
fn output(p: u64) -> *mut c_void {
    p as *mut c_void
}

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
            self.memory.clone(),
            self.job_rank,
            self.timeout,
        )?))
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CommError> {
        let n = buf.len();
        // SAFETY (every call below): `Memory::run` gives addresses of the
        // buffers listed, of the lengths checked here, valid until the
        // call's stream has completed, which `run` waits for.
        self.run(0, &mut [Buf::InOut(buf)], |c, p, stream| unsafe {
            c.all_reduce(
                input(p[0]),
                output(p[0]),
                n,
                NcclDataType::F32,
                NcclReduceOp::Sum,
                stream,
            )
        })
    }

    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        check_blocks("all_gather", send.len(), recv.len(), self.world_size())?;
        let n = send.len();
        self.run(
            1,
            &mut [Buf::In(send), Buf::Out(recv)],
            |c, p, stream| unsafe {
                c.all_gather(input(p[0]), output(p[1]), n, NcclDataType::F32, stream)
            },
        )
    }

    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        check_blocks(
            "reduce_scatter_sum",
            recv.len(),
            send.len(),
            self.world_size(),
        )?;
        let n = recv.len();
        self.run(
            2,
            &mut [Buf::In(send), Buf::Out(recv)],
            |c, p, stream| unsafe {
                c.reduce_scatter(
                    input(p[0]),
                    output(p[1]),
                    n,
                    NcclDataType::F32,
                    NcclReduceOp::Sum,
                    stream,
                )
            },
        )
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        check_rank("broadcast", root, self.world_size())?;
        let n = buf.len();
        self.run(3, &mut [Buf::InOut(buf)], |c, p, stream| unsafe {
            c.broadcast(
                input(p[0]),
                output(p[0]),
                n,
                NcclDataType::F32,
                root,
                stream,
            )
        })
    }

    fn send(&self, buf: &[f32], dest: usize, _tag: i32) -> Result<(), CommError> {
        check_rank("send", dest, self.world_size())?;
        let n = buf.len();
        self.run(4, &mut [Buf::In(buf)], |c, p, stream| unsafe {
            c.send(input(p[0]), n, NcclDataType::F32, dest, stream)
        })
    }

    fn recv(&self, buf: &mut [f32], src: usize, _tag: i32) -> Result<(), CommError> {
        check_rank("recv", src, self.world_size())?;
        let n = buf.len();
        self.run(5, &mut [Buf::Out(buf)], |c, p, stream| unsafe {
            c.recv(output(p[0]), n, NcclDataType::F32, src, stream)
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
        // (peer, values) of every send, then of every receive, in the
        // order of their buffers.
        let peers: Vec<(usize, usize)> = sends
            .iter()
            .map(|s| (s.to, s.values.len()))
            .chain(recvs.iter().map(|r| (r.from, r.values.len())))
            .collect();
        let n_sends = sends.len();
        let mut bufs: Vec<Buf<'_>> = sends.iter().map(|s| Buf::In(s.values)).collect();
        bufs.extend(recvs.iter_mut().map(|r| Buf::Out(&mut *r.values)));
        let lib = self.nccl.library().clone();
        self.run(6, &mut bufs, |c, p, stream| {
            lib.group_start()?;
            for (k, &(peer, n)) in peers.iter().enumerate() {
                // SAFETY: as in `all_reduce_sum`; the group completes
                // before `run` returns.
                unsafe {
                    if k < n_sends {
                        c.send(input(p[k]), n, NcclDataType::F32, peer, stream)?
                    } else {
                        c.recv(output(p[k]), n, NcclDataType::F32, peer, stream)?
                    }
                }
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
