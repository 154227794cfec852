//! A test double of the NCCL C API: the functions Ferrotron's NCCL binding
//! (`ferrotron_parallel::comm::nccl`) loads, exported with the C ABI from a
//! shared library and implemented over MPI on **host** memory.
//!
//! Ferrotron loads it like NCCL or RCCL, by pointing
//! `FERROTRON_NCCL_LIBRARY` at `libferrotron_nccl_double.so`. With a CPU
//! backend, whose tensors live in host memory, the whole training path then
//! runs through the NCCL communicator and the binding's real code (symbol
//! lookup, unique-id bootstrap, `ncclCommInitRank` per group, every
//! collective, send/receive, groups, destroy), on a machine without a GPU.
//! It is what the multi-rank NCCL tests load; it is no transport for real
//! work.
//!
//! # How it maps NCCL onto MPI
//!
//! The process must be an MPI process whose MPI is initialized (Ferrotron's
//! MPI bootstrap does that); the double uses `MPI_COMM_WORLD`.
//!
//! - `ncclGetUniqueId` writes a token holding a magic tag, the caller's
//!   world rank (the *creator*) and a serial number of the creator.
//! - `ncclCommInitRank(comm, nranks, id, rank)` meets the other members
//!   at the creator, which must itself join the communicator (Ferrotron's
//!   rank 0 of the group does): every member sends its `(rank, world
//!   rank)` to the creator, which answers everyone with the table of world
//!   ranks in communicator order; then the members, and only they, build
//!   the communicator with `MPI_Comm_create_group`. These messages use
//!   `MPI_COMM_WORLD` with tag `31000 + serial mod 1000`.
//! - Collectives are the blocking MPI ones on that communicator
//!   (`MPI_Allreduce`, `MPI_Allgather`, `MPI_Reduce_scatter_block`,
//!   `MPI_Bcast`); they have completed when the call returns, so the
//!   stream argument is ignored. Only `ncclSum` is supported, on
//!   `ncclFloat32`, and on `ncclBfloat16` for all-reduce, all-gather and
//!   reduce-scatter (widened to `f32` and rounded back, as NCCL rounds
//!   each sum; what Ferrotron uses); anything else returns
//!   `ncclInvalidArgument`. Send buffers are copied first, so in-place
//!   calls work as in NCCL.
//! - `ncclSend` / `ncclRecv` outside a group are `MPI_Ssend` / `MPI_Recv`
//!   (a send completes only with its receive, as in NCCL); inside
//!   `ncclGroupStart` / `ncclGroupEnd` they are deferred and started
//!   together as nonblocking calls at the outermost `ncclGroupEnd`, so two
//!   ranks can exchange in both directions. Collectives inside a group
//!   return `ncclInvalidUsage`.
//! - `ncclCommDestroy` and `ncclCommAbort` free the MPI communicator
//!   (skipped once MPI is finalized).
//!
//! Without the `mpi` cargo feature the library is built empty (it exports
//! nothing), so that builds without MPI need no MPI.

#[cfg(feature = "mpi")]
mod api;
#[cfg(feature = "mpi")]
mod bf16;
#[cfg(feature = "mpi")]
mod comm;
#[cfg(feature = "mpi")]
mod group;
#[cfg(feature = "mpi")]
mod id;
#[cfg(feature = "mpi")]
mod result;
