//! The Open MPI communicator (cargo feature `mpi`).

use ::mpi::collective::SystemOperation;
use ::mpi::datatype::Equivalence;
use ::mpi::environment::Universe;
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::{Communicator as _, CommunicatorCollectives, Destination, Root, Source};

use super::{check_blocks, check_rank, CommError, Communicator};

/// `MPI_COMM_WORLD` of a job started by `mpirun` (or `srun` with PMIx).
///
/// Owns the MPI environment: `MPI_Finalize` runs when it is dropped, so
/// create exactly one per process and keep it for the whole run. Errors
/// inside MPI calls abort the job (MPI's default `MPI_ERRORS_ARE_FATAL`).
pub struct MpiCommunicator {
    world: SimpleCommunicator,
    // Dropped after `world`; finalizes MPI.
    _universe: Universe,
}

impl MpiCommunicator {
    /// Initializes MPI. Fails if MPI was already initialized in this process.
    pub fn init() -> Result<Self, CommError> {
        let universe = ::mpi::initialize()
            .ok_or_else(|| CommError::Transport("MPI was already initialized".into()))?;
        Ok(Self {
            world: universe.world(),
            _universe: universe,
        })
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
        let send = buf.to_vec();
        self.world
            .all_reduce_into(&send[..], buf, SystemOperation::sum());
        Ok(())
    }

    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        check_blocks("all_gather", send.len(), recv.len(), self.world_size())?;
        self.world.all_gather_into(send, recv);
        Ok(())
    }

    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        check_blocks(
            "reduce_scatter_sum",
            recv.len(),
            send.len(),
            self.world_size(),
        )?;
        self.world
            .reduce_scatter_block_into(send, recv, SystemOperation::sum());
        Ok(())
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        check_rank("broadcast", root, self.world_size())?;
        self.world.process_at_rank(root as i32).broadcast_into(buf);
        Ok(())
    }

    fn send(&self, buf: &[f32], dest: usize, tag: i32) -> Result<(), CommError> {
        check_rank("send", dest, self.world_size())?;
        self.world
            .process_at_rank(dest as i32)
            .send_with_tag(buf, tag);
        Ok(())
    }

    fn recv(&self, buf: &mut [f32], src: usize, tag: i32) -> Result<(), CommError> {
        check_rank("recv", src, self.world_size())?;
        let status = self
            .world
            .process_at_rank(src as i32)
            .receive_into_with_tag(buf, tag);
        let got = status.count(f32::equivalent_datatype()) as usize;
        if got != buf.len() {
            return Err(CommError::BadLength {
                op: "recv",
                detail: format!("expected {} values from rank {src}, got {got}", buf.len()),
            });
        }
        Ok(())
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.world.barrier();
        Ok(())
    }

    fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }
}
