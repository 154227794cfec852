//! The Open MPI communicator (cargo feature `mpi`), with a timeout on every
//! operation.
//!
//! # Why a timeout, and how
//!
//! A blocking MPI collective waits forever for a rank that hangs (stuck,
//! stopped, or sleeping past the others). Here every operation is started
//! with MPI's nonblocking call (`MPI_Iallreduce`, `MPI_Ibarrier`,
//! `MPI_Isend`, ...) and its request is tested until it completes or the
//! communicator's timeout passes; a waiting rank re-tests without sleeping
//! (yielding the core) for its first millisecond, then sleeps 200 µs
//! between tests, so it does not burn a core.
//!
//! On timeout the error must name the rank(s) that are missing. Nothing is
//! sent for that on the normal path: a rank that times out *announces* it
//! (operation and number, e.g. `all_reduce #17`) to every rank the
//! operation waits for, with a dedicated tag on a communicator duplicated
//! from the world and reserved for these notices, and collects answers for
//! a grace period (a tenth of the timeout, between 100 ms and 2 s). Every
//! rank that is itself waiting in an operation answers announcements
//! between its tests, with its own position; every rank that times out
//! announces too. A rank not heard from in the grace period never arrived
//! (it is computing, stuck or stopped); a rank that answers from another
//! operation is named with that operation. The error reads, for example,
//! `all_reduce #17 did not complete within 2s: rank 2 never arrived (ranks
//! 0, 1 did)`.
//!
//! The cost on the normal path: the operation works on heap copies of the
//! buffers ([`lent`] says why; those of at most 32 MiB are reused from
//! call to call, larger ones freed after it), that is two copies of the
//! data per call, plus one `MPI_Improbe` per sleeping test. Measured on 2
//! ranks of a shared 2-core machine: a 25 MiB all-reduce took about 100 ms
//! against about 70 ms for the blocking `MPI_Allreduce` (the nonblocking
//! call alone is as fast as the blocking one), 1024 values about 11 µs
//! against 4 µs.
//!
//! After a timeout the operation cannot be cancelled (MPI has no way to
//! cancel a collective): the communicator is marked failed, every later
//! call returns an error at once, and the caller is expected to
//! [`abort`](Communicator::abort) the job, which makes `mpirun` end every
//! process, the hung one included. A failed communicator that is dropped
//! skips `MPI_Finalize` (it could wait for the missing rank).
//!
//! # Groups and threads
//!
//! [`Communicator::split`] makes a communicator over a subset of the ranks
//! (`MPI_Comm_split`), with its own notices, counters and timeout; its
//! errors name ranks by their number in the world, so a timeout in a
//! data-parallel group still says which process is missing. Every
//! communicator of the process shares the MPI environment, finalized when
//! the last one is dropped.
//!
//! MPI is initialized with `MPI_THREAD_SERIALIZED` and each communicator
//! holds a lock for the whole of an operation, so the type is `Send + Sync`
//! (Burn modules holding a group handle must be `Send`) while MPI never
//! sees two calls at once from one communicator. Different communicators
//! are used by the training step one after the other, never concurrently.

mod lent;
mod op;
mod report;
mod wait;

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::mpi::collective::SystemOperation;
use ::mpi::datatype::Equivalence;
use ::mpi::environment::{Threading, Universe};
use ::mpi::request::StaticScope;
use ::mpi::topology::{Color, SimpleCommunicator};
use ::mpi::traits::{Communicator as _, CommunicatorCollectives, Destination, Root, Source};

use self::lent::Spares;
use self::op::Op;
use self::wait::Peers;
use super::{
    check_blocks, check_rank, CommError, Communicator, Incoming, Outgoing, DEFAULT_TIMEOUT,
};

/// An MPI communicator: `MPI_COMM_WORLD` of a job started by `mpirun` (or
/// `srun` with PMIx), or a group split from it ([`Communicator::split`]).
///
/// The world communicator starts the MPI environment; `MPI_Finalize` runs
/// when the last communicator is dropped, so create exactly one world per
/// process and keep it for the whole run. Every operation fails with
/// [`CommError::Timeout`] if it does not complete within the timeout (see
/// the module doc); errors inside MPI calls abort the job (MPI's default
/// `MPI_ERRORS_ARE_FATAL`).
pub struct MpiCommunicator {
    /// The ranks of this communicator; freed before MPI is finalized.
    comm: ManuallyDrop<SimpleCommunicator>,
    /// A duplicate of `comm` that carries only timeout notices; freed
    /// before MPI is finalized.
    notices: ManuallyDrop<SimpleCommunicator>,
    /// World rank of each rank of `comm` (the names used in errors).
    world_ranks: Vec<usize>,
    timeout: Duration,
    /// Operations started so far, per [`Op`] (indexed by its code).
    counts: [AtomicU64; Op::ALL.len()],
    /// Set when an operation timed out.
    failed: AtomicBool,
    /// Held for the whole of an operation: one MPI call sequence at a time.
    serial: Mutex<()>,
    /// Buffers for the next operations.
    spares: Spares,
    /// The MPI environment, finalized when its last holder is dropped; a
    /// failed communicator never lets go of its share.
    universe: ManuallyDrop<Arc<Universe>>,
}

// SAFETY: the MPI handles are plain identifiers that MPI lets any thread
// use under MPI_THREAD_SERIALIZED, which `init_with_timeout` asks for; every
// operation holds `serial` while it calls MPI, so calls on one communicator
// never overlap, and the counters, flag and spare buffers are atomics or
// behind locks.
unsafe impl Send for MpiCommunicator {}
// SAFETY: as for `Send`: shared use goes through `serial`.
unsafe impl Sync for MpiCommunicator {}

impl MpiCommunicator {
    /// Initializes MPI with the default timeout, [`DEFAULT_TIMEOUT`] (600 s).
    /// Fails if MPI was already initialized in this process.
    pub fn init() -> Result<Self, CommError> {
        Self::init_with_timeout(DEFAULT_TIMEOUT)
    }

    /// Initializes MPI; every operation fails with [`CommError::Timeout`]
    /// if it has not completed `timeout` after it started. Fails if MPI was
    /// already initialized in this process or `timeout` is zero.
    pub fn init_with_timeout(timeout: Duration) -> Result<Self, CommError> {
        if timeout.is_zero() {
            return Err(CommError::Transport(
                "the communicator timeout must be positive".into(),
            ));
        }
        let (universe, _) = ::mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| CommError::Transport("MPI was already initialized".into()))?;
        let world = universe.world();
        let world_ranks = (0..world.size() as usize).collect();
        Ok(Self::over(world, world_ranks, timeout, Arc::new(universe)))
    }

    /// A communicator over `comm`, whose rank `r` is world rank `world_ranks[r]`.
    fn over(
        comm: SimpleCommunicator,
        world_ranks: Vec<usize>,
        timeout: Duration,
        universe: Arc<Universe>,
    ) -> Self {
        Self {
            notices: ManuallyDrop::new(comm.duplicate()),
            comm: ManuallyDrop::new(comm),
            world_ranks,
            timeout,
            counts: Default::default(),
            failed: AtomicBool::new(false),
            serial: Mutex::new(()),
            spares: Spares::default(),
            universe: ManuallyDrop::new(universe),
        }
    }

    /// Whether an operation timed out (the communicator is then unusable).
    pub(super) fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Holds the operation lock (a poisoned lock is still a lock: the
    /// panicking operation left MPI in no worse state than an error would).
    fn serialize(&self) -> std::sync::MutexGuard<'_, ()> {
        self.serial.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for MpiCommunicator {
    fn drop(&mut self) {
        if !self.has_failed() {
            // SAFETY: each dropped once, here, and never used again; both
            // communicators must be freed before `MPI_Finalize`, which runs
            // when the last share of the universe goes.
            unsafe {
                ManuallyDrop::drop(&mut self.notices);
                ManuallyDrop::drop(&mut self.comm);
                ManuallyDrop::drop(&mut self.universe);
            }
        }
    }
}

impl Communicator for MpiCommunicator {
    fn rank(&self) -> usize {
        self.comm.rank() as usize
    }

    fn world_size(&self) -> usize {
        self.comm.size() as usize
    }

    fn split(&self, color: usize, key: usize) -> Result<Arc<dyn Communicator>, CommError> {
        let to_i32 = |what: &str, v: usize| {
            i32::try_from(v).map_err(|_| {
                CommError::Transport(format!("split: {what} {v} does not fit MPI's int"))
            })
        };
        let (color, key) = (to_i32("color", color)?, to_i32("key", key)?);
        // MPI_Comm_split blocks without a timeout: a timed barrier first
        // makes sure every rank has arrived, so it returns at once.
        self.barrier()?;
        let group = {
            let _serial = self.serialize();
            self.comm
                .split_by_color_with_key(Color::with_value(color), key)
        }
        .ok_or_else(|| CommError::Transport("split: MPI returned no communicator".into()))?;
        let size = group.size() as usize;
        let mut split = Self::over(
            group,
            (0..size).collect(),
            self.timeout,
            Arc::clone(&self.universe),
        );
        // The world rank of every member, for the group's error messages
        // (exact in f32 below 2^24 ranks).
        let me = self.world_ranks[self.rank()] as f32;
        let mut ranks = vec![0.0; size];
        split.all_gather(&[me], &mut ranks)?;
        split.world_ranks = ranks.into_iter().map(|r| r as usize).collect();
        Ok(Arc::new(split))
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CommError> {
        let _serial = self.serialize();
        let at = self.start(Op::AllReduce)?;
        let send = self.spares.lend_copy(buf);
        let mut recv = self.spares.lend_scratch(buf.len());
        // SAFETY: one view of each buffer, used only by this request.
        let req = self.comm.immediate_all_reduce_into(
            StaticScope,
            unsafe { send.view() },
            unsafe { recv.view_mut() },
            SystemOperation::sum(),
        );
        self.finish(req, at, Peers::All)?;
        // SAFETY: the request completed.
        unsafe {
            self.spares.reclaim(recv, Some(buf));
            self.spares.reclaim(send, None);
        }
        Ok(())
    }

    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        check_blocks("all_gather", send.len(), recv.len(), self.world_size())?;
        let _serial = self.serialize();
        let at = self.start(Op::AllGather)?;
        let lent_send = self.spares.lend_copy(send);
        let mut lent_recv = self.spares.lend_scratch(recv.len());
        // SAFETY: one view of each buffer, used only by this request.
        let req =
            self.comm
                .immediate_all_gather_into(StaticScope, unsafe { lent_send.view() }, unsafe {
                    lent_recv.view_mut()
                });
        self.finish(req, at, Peers::All)?;
        // SAFETY: the request completed.
        unsafe {
            self.spares.reclaim(lent_recv, Some(recv));
            self.spares.reclaim(lent_send, None);
        }
        Ok(())
    }

    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        check_blocks(
            "reduce_scatter_sum",
            recv.len(),
            send.len(),
            self.world_size(),
        )?;
        let _serial = self.serialize();
        let at = self.start(Op::ReduceScatter)?;
        let lent_send = self.spares.lend_copy(send);
        let mut lent_recv = self.spares.lend_scratch(recv.len());
        // SAFETY: one view of each buffer, used only by this request.
        let req = self.comm.immediate_reduce_scatter_block_into(
            StaticScope,
            unsafe { lent_send.view() },
            unsafe { lent_recv.view_mut() },
            SystemOperation::sum(),
        );
        self.finish(req, at, Peers::All)?;
        // SAFETY: the request completed.
        unsafe {
            self.spares.reclaim(lent_recv, Some(recv));
            self.spares.reclaim(lent_send, None);
        }
        Ok(())
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        check_rank("broadcast", root, self.world_size())?;
        let _serial = self.serialize();
        let at = self.start(Op::Broadcast)?;
        let mut lent = self.spares.lend_copy(buf);
        // SAFETY: one view of the buffer, used only by this request.
        let req = self
            .comm
            .process_at_rank(root as i32)
            .immediate_broadcast_into(StaticScope, unsafe { lent.view_mut() });
        self.finish(req, at, Peers::All)?;
        // SAFETY: the request completed.
        unsafe { self.spares.reclaim(lent, Some(buf)) };
        Ok(())
    }

    fn send(&self, buf: &[f32], dest: usize, tag: i32) -> Result<(), CommError> {
        check_rank("send", dest, self.world_size())?;
        let _serial = self.serialize();
        let at = self.start(Op::Send)?;
        let lent = self.spares.lend_copy(buf);
        // SAFETY: one view of the buffer, used only by this request.
        let req = self
            .comm
            .process_at_rank(dest as i32)
            .immediate_send_with_tag(StaticScope, unsafe { lent.view() }, tag);
        self.finish(req, at, Peers::One(dest))?;
        // SAFETY: the request completed.
        unsafe { self.spares.reclaim(lent, None) };
        Ok(())
    }

    fn recv(&self, buf: &mut [f32], src: usize, tag: i32) -> Result<(), CommError> {
        check_rank("recv", src, self.world_size())?;
        let _serial = self.serialize();
        let at = self.start(Op::Recv)?;
        let mut lent = self.spares.lend_scratch(buf.len());
        // SAFETY: one view of the buffer, used only by this request.
        let req = self
            .comm
            .process_at_rank(src as i32)
            .immediate_receive_into_with_tag(StaticScope, unsafe { lent.view_mut() }, tag);
        let status = self.finish(req, at, Peers::One(src))?;
        let got = status.count(f32::equivalent_datatype()) as usize;
        let whole = got == buf.len();
        // SAFETY: the request completed.
        unsafe { self.spares.reclaim(lent, whole.then_some(&mut *buf)) };
        if !whole {
            return Err(CommError::BadLength {
                op: "recv",
                detail: format!("expected {} values from rank {src}, got {got}", buf.len()),
            });
        }
        Ok(())
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
        let _serial = self.serialize();
        let at = self.start(Op::Exchange)?;
        let out: Vec<_> = sends
            .iter()
            .map(|s| (s, self.spares.lend_copy(s.values)))
            .collect();
        let mut into: Vec<_> = recvs
            .iter_mut()
            .map(|r| {
                let lent = self.spares.lend_scratch(r.values.len());
                (r, lent)
            })
            .collect();
        // Every request is posted before any is waited for.
        let sent: Vec<_> = out
            .iter()
            .map(|(s, lent)| {
                // SAFETY: one view of the buffer, used only by this request.
                let view = unsafe { lent.view() };
                let to = self.comm.process_at_rank(s.to as i32);
                (to.immediate_send_with_tag(StaticScope, view, s.tag), s.to)
            })
            .collect();
        let received: Vec<_> = into
            .iter_mut()
            .map(|(r, lent)| {
                // SAFETY: one view of the buffer, used only by this request.
                let view = unsafe { lent.view_mut() };
                let from = self.comm.process_at_rank(r.from as i32);
                (
                    from.immediate_receive_into_with_tag(StaticScope, view, r.tag),
                    r.from,
                )
            })
            .collect();
        for (req, to) in sent {
            self.finish(req, at, Peers::One(to))?;
        }
        let mut counts = Vec::with_capacity(received.len());
        for (req, from) in received {
            let status = self.finish(req, at, Peers::One(from))?;
            counts.push(status.count(f32::equivalent_datatype()) as usize);
        }
        for (_, lent) in out {
            // SAFETY: the request completed.
            unsafe { self.spares.reclaim(lent, None) };
        }
        for ((r, lent), got) in into.into_iter().zip(counts) {
            let whole = got == r.values.len();
            // SAFETY: the request completed.
            unsafe { self.spares.reclaim(lent, whole.then_some(&mut *r.values)) };
            if !whole {
                return Err(CommError::BadLength {
                    op: "exchange",
                    detail: format!(
                        "expected {} values from rank {}, got {got}",
                        r.values.len(),
                        r.from
                    ),
                });
            }
        }
        Ok(())
    }

    fn barrier(&self) -> Result<(), CommError> {
        let _serial = self.serialize();
        let at = self.start(Op::Barrier)?;
        let req = self.comm.immediate_barrier();
        self.finish(req, at, Peers::All)?;
        Ok(())
    }

    fn abort(&self, code: i32) -> ! {
        // The whole job, whichever group this is.
        SimpleCommunicator::world().abort(code)
    }
}
