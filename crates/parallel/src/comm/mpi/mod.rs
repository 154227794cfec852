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
//! buffers ([`lent`] says why; they are reused from call to call, so up to
//! twice the largest buffer stays allocated), that is two copies of the
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

mod lent;
mod op;
mod report;
mod wait;

use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::time::Duration;

use ::mpi::collective::SystemOperation;
use ::mpi::datatype::Equivalence;
use ::mpi::environment::Universe;
use ::mpi::request::StaticScope;
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::{Communicator as _, CommunicatorCollectives, Destination, Root, Source};

use self::lent::Spares;
use self::op::Op;
use self::wait::Peers;
use super::{check_blocks, check_rank, CommError, Communicator, DEFAULT_TIMEOUT};

/// `MPI_COMM_WORLD` of a job started by `mpirun` (or `srun` with PMIx).
///
/// Owns the MPI environment: `MPI_Finalize` runs when it is dropped, so
/// create exactly one per process and keep it for the whole run. Every
/// operation fails with [`CommError::Timeout`] if it does not complete
/// within the timeout (see the module doc); errors inside MPI calls abort
/// the job (MPI's default `MPI_ERRORS_ARE_FATAL`).
pub struct MpiCommunicator {
    world: SimpleCommunicator,
    /// A duplicate of `world` that carries only timeout notices; freed
    /// before MPI is finalized.
    notices: ManuallyDrop<SimpleCommunicator>,
    timeout: Duration,
    /// Operations started so far, per [`Op`] (indexed by its code).
    counts: [Cell<u64>; Op::ALL.len()],
    /// Set when an operation timed out.
    failed: Cell<bool>,
    /// Buffers for the next operations.
    spares: Spares,
    /// Finalized on drop unless `failed`.
    universe: ManuallyDrop<Universe>,
}

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
        let universe = ::mpi::initialize()
            .ok_or_else(|| CommError::Transport("MPI was already initialized".into()))?;
        let world = universe.world();
        Ok(Self {
            notices: ManuallyDrop::new(world.duplicate()),
            world,
            timeout,
            counts: Default::default(),
            failed: Cell::new(false),
            spares: Spares::default(),
            universe: ManuallyDrop::new(universe),
        })
    }
}

impl Drop for MpiCommunicator {
    fn drop(&mut self) {
        if !self.failed.get() {
            // SAFETY: each dropped once, here, and never used again; the
            // duplicate communicator must be freed before `MPI_Finalize`.
            unsafe {
                ManuallyDrop::drop(&mut self.notices);
                ManuallyDrop::drop(&mut self.universe);
            }
        }
    }
}

impl Communicator for MpiCommunicator {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn world_size(&self) -> usize {
        self.world.size() as usize
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CommError> {
        let at = self.start(Op::AllReduce)?;
        let send = self.spares.lend_copy(buf);
        let mut recv = self.spares.lend_scratch(buf.len());
        // SAFETY: one view of each buffer, used only by this request.
        let req = self.world.immediate_all_reduce_into(
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
        let at = self.start(Op::AllGather)?;
        let lent_send = self.spares.lend_copy(send);
        let mut lent_recv = self.spares.lend_scratch(recv.len());
        // SAFETY: one view of each buffer, used only by this request.
        let req = self.world.immediate_all_gather_into(
            StaticScope,
            unsafe { lent_send.view() },
            unsafe { lent_recv.view_mut() },
        );
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
        let at = self.start(Op::ReduceScatter)?;
        let lent_send = self.spares.lend_copy(send);
        let mut lent_recv = self.spares.lend_scratch(recv.len());
        // SAFETY: one view of each buffer, used only by this request.
        let req = self.world.immediate_reduce_scatter_block_into(
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
        let at = self.start(Op::Broadcast)?;
        let mut lent = self.spares.lend_copy(buf);
        // SAFETY: one view of the buffer, used only by this request.
        let req = self
            .world
            .process_at_rank(root as i32)
            .immediate_broadcast_into(StaticScope, unsafe { lent.view_mut() });
        self.finish(req, at, Peers::All)?;
        // SAFETY: the request completed.
        unsafe { self.spares.reclaim(lent, Some(buf)) };
        Ok(())
    }

    fn send(&self, buf: &[f32], dest: usize, tag: i32) -> Result<(), CommError> {
        check_rank("send", dest, self.world_size())?;
        let at = self.start(Op::Send)?;
        let lent = self.spares.lend_copy(buf);
        // SAFETY: one view of the buffer, used only by this request.
        let req = self
            .world
            .process_at_rank(dest as i32)
            .immediate_send_with_tag(StaticScope, unsafe { lent.view() }, tag);
        self.finish(req, at, Peers::One(dest))?;
        // SAFETY: the request completed.
        unsafe { self.spares.reclaim(lent, None) };
        Ok(())
    }

    fn recv(&self, buf: &mut [f32], src: usize, tag: i32) -> Result<(), CommError> {
        check_rank("recv", src, self.world_size())?;
        let at = self.start(Op::Recv)?;
        let mut lent = self.spares.lend_scratch(buf.len());
        // SAFETY: one view of the buffer, used only by this request.
        let req = self
            .world
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

    fn barrier(&self) -> Result<(), CommError> {
        let at = self.start(Op::Barrier)?;
        let req = self.world.immediate_barrier();
        self.finish(req, at, Peers::All)?;
        Ok(())
    }

    fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }
}
