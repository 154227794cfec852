//! Where [`super::NcclCommunicator`]'s host buffers meet the library.
//!
//! The [`Communicator`](crate::comm::Communicator) contract moves host
//! `f32` slices. [`HostMemory`] hands them to the library as they are (a
//! library on host memory: the test double). On a GPU the library reads
//! device memory only, so [`device::cube`](super::device::cube)'s
//! `Staged` copies each slice into a device buffer, runs the call there
//! and copies the results back: the values cross PCIe as they do under
//! MPI, and the transfer between ranks is NCCL's.

use std::ffi::c_void;

use super::NcclError;
use crate::comm::CommError;

/// One buffer of a call, in the order the call takes their addresses.
pub enum Buf<'a> {
    /// Read by the library.
    In(&'a [f32]),
    /// Written by the library.
    Out(&'a mut [f32]),
    /// Read and written (in place).
    InOut(&'a mut [f32]),
}

impl Buf<'_> {
    /// Values in the buffer.
    pub fn len(&self) -> usize {
        match self {
            Buf::In(b) => b.len(),
            Buf::Out(b) | Buf::InOut(b) => b.len(),
        }
    }

    /// Whether the buffer holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A library call on the addresses of its buffers and a stream: queues the
/// operation(s) and returns.
pub type Call<'c> = dyn FnMut(&[u64], *mut c_void) -> Result<(), NcclError> + Send + 'c;

/// The memory a communicator's library reads, and how calls are ordered
/// on it.
pub trait Memory: Send + Sync {
    /// Runs `task` with the device bound to the calling thread and no other
    /// use of it meanwhile (on a GPU, inside `ComputeClient::exclusive`):
    /// communicators are created there, so that NCCL binds the device.
    fn exclusive(&self, task: &mut (dyn FnMut() + Send)) -> Result<(), CommError>;
    /// Runs `call` on the addresses of `bufs` (in their order), each `In`
    /// and `InOut` holding its values, and leaves the library's results in
    /// each `Out` and `InOut` once it returns.
    fn run(&self, bufs: &mut [Buf<'_>], call: &mut Call<'_>) -> Result<(), CommError>;
}

/// Host memory: the slices' own addresses, the default stream, nothing to
/// bind (the test double runs each call to its end before returning).
pub struct HostMemory;

impl Memory for HostMemory {
    fn exclusive(&self, task: &mut (dyn FnMut() + Send)) -> Result<(), CommError> {
        task();
        Ok(())
    }

    fn run(&self, bufs: &mut [Buf<'_>], call: &mut Call<'_>) -> Result<(), CommError> {
        let ptrs: Vec<u64> = bufs
            .iter_mut()
            .map(|b| match b {
                Buf::In(s) => s.as_ptr() as u64,
                Buf::Out(s) | Buf::InOut(s) => s.as_mut_ptr() as u64,
            })
            .collect();
        call(&ptrs, std::ptr::null_mut()).map_err(super::communicator::nccl_error)
    }
}
