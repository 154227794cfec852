//! NCCL / RCCL on device buffers.
//!
//! [`DeviceComm`] runs all-reduce, all-gather and reduce-scatter on buffers
//! that live where the library reads them (GPU memory for NCCL and RCCL;
//! host memory for the repository's test double), ordered against the
//! device's own work by a [`Streams`]:
//!
//! 1. bind the device to the calling thread and wait until everything
//!    queued on it has finished ([`Streams::bind_and_drain`]: CubeCL's
//!    streams are private and non-blocking, so nothing short of a wait on
//!    the whole context orders a collective after the kernels that wrote
//!    its input);
//! 2. queue the collective on Ferrotron's own stream, made once when the
//!    communicator is created;
//! 3. wait for that stream ([`Streams::wait`]), so that CubeCL may use the
//!    buffers again once the call returns.
//!
//! On a CubeCL device the caller runs each call inside
//! `ComputeClient::exclusive`, which keeps every other use of the device
//! out meanwhile, and creates the communicator there too, so that NCCL binds
//! it to that device ([`cube`], with the cuda and rocm features). The
//! buffers' element type is the wire's ([`wire`]): `--reduce-dtype bf16`
//! sends bf16 (`ncclBfloat16`), half the bytes of f32.
//!
//! [`HostStreams`] is the [`Streams`] of host memory (nothing to bind or
//! wait for): with the test double it runs this whole path on a machine
//! without a GPU.

mod any;
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub mod cube;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "rocm")]
mod hip;
mod tensors;
pub mod wire;

pub use any::{AnyCollectives, Collectives};
pub use tensors::{OpenCollectives, Route, SharedCollectives, TensorCollectives};

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use crate::comm::{check_blocks, CommError, Communicator};

use super::comm::NcclComm;
use super::communicator::nccl_error;
use super::library::NcclLibrary;
use super::types::{NcclDataType, NcclReduceOp};
use super::NcclError;

/// A device address as an integer (`CUdeviceptr`, or a pointer's value),
/// so that it crosses into `ComputeClient::exclusive`'s closure.
pub type DevicePtr = u64;

/// How collectives are ordered against a device's own work.
pub trait Streams: Send + Sync {
    /// Makes the device current on the calling thread and waits until all
    /// work queued on it, on any stream, has finished.
    fn bind_and_drain(&self) -> Result<(), String>;
    /// A new non-blocking stream on the current device, as an integer
    /// (`CUstream` / `hipStream_t`; 0 is the default stream).
    fn create_stream(&self) -> Result<usize, String>;
    /// Waits until `stream` has run everything queued on it.
    fn wait(&self, stream: usize) -> Result<(), String>;
    /// Releases `stream` (from [`Streams::create_stream`]).
    fn destroy_stream(&self, stream: usize);
}

/// The [`Streams`] of host memory: calls complete when they return, on the
/// default stream.
pub struct HostStreams;

impl Streams for HostStreams {
    fn bind_and_drain(&self) -> Result<(), String> {
        Ok(())
    }

    fn create_stream(&self) -> Result<usize, String> {
        Ok(0)
    }

    fn wait(&self, _stream: usize) -> Result<(), String> {
        Ok(())
    }

    fn destroy_stream(&self, _stream: usize) {}
}

/// One rank's NCCL communicator on device buffers, with its own stream.
pub struct DeviceComm {
    /// Held for the whole of each call: NCCL takes one call at a time.
    nccl: Mutex<NcclComm>,
    streams: Box<dyn Streams>,
    stream: usize,
}

// SAFETY: the NCCL communicator is an opaque handle that any thread may
// use, one call at a time; every call holds the mutex. The stream is an
// opaque handle of the same kind, used only under that mutex.
unsafe impl Send for DeviceComm {}
// SAFETY: as for `Send`.
unsafe impl Sync for DeviceComm {}

/// An error of the device side as a communicator error.
fn device_error(what: &str, e: String) -> CommError {
    CommError::Transport(format!("NCCL on device buffers: {what}: {e}"))
}

impl DeviceComm {
    /// Creates this rank's communicator over the ranks of `host` (collective
    /// over `host`) and its stream, with the device of `streams` bound: on a
    /// GPU, call it inside `ComputeClient::exclusive`.
    pub fn init(
        lib: Arc<NcclLibrary>,
        host: &dyn Communicator,
        streams: Box<dyn Streams>,
    ) -> Result<Self, CommError> {
        streams
            .bind_and_drain()
            .map_err(|e| device_error("binding the device", e))?;
        let nccl = NcclComm::init(lib, host).map_err(nccl_error)?;
        let stream = streams
            .create_stream()
            .map_err(|e| device_error("creating a stream", e))?;
        Ok(Self {
            nccl: Mutex::new(nccl),
            streams,
            stream,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.lock().rank()
    }

    /// Ranks in the communicator.
    pub fn world_size(&self) -> usize {
        self.lock().world_size()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, NcclComm> {
        self.nccl.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The three steps of the module doc around `call`, which queues one
    /// NCCL operation on the stream it is given.
    fn run(
        &self,
        call: impl FnOnce(&NcclComm, *mut c_void) -> Result<(), NcclError>,
    ) -> Result<(), CommError> {
        let nccl = self.lock();
        self.streams
            .bind_and_drain()
            .map_err(|e| device_error("waiting for the device", e))?;
        call(&nccl, self.stream as *mut c_void).map_err(nccl_error)?;
        self.streams
            .wait(self.stream)
            .map_err(|e| device_error("waiting for the NCCL stream", e))
    }

    /// Sums `count` values of `dtype` at `send` over the ranks into `recv`
    /// on every rank (`send == recv`: in place).
    ///
    /// # Safety
    ///
    /// `send` and `recv` are addresses the library can read and write (its
    /// device's memory), valid for `count` values of `dtype` until the call
    /// returns and not otherwise used meanwhile.
    pub unsafe fn all_reduce_sum(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: NcclDataType,
    ) -> Result<(), CommError> {
        self.run(|c, stream| {
            // SAFETY: the caller's contract; the call completes within `run`.
            unsafe {
                c.all_reduce(
                    send as *const c_void,
                    recv as *mut c_void,
                    count,
                    dtype,
                    NcclReduceOp::Sum,
                    stream,
                )
            }
        })
    }

    /// Every rank's `count` values at `send` concatenated in rank order
    /// into `recv` (`count x world_size` values) on every rank.
    ///
    /// # Safety
    ///
    /// As [`DeviceComm::all_reduce_sum`], `recv` valid for `count x
    /// world_size` values.
    pub unsafe fn all_gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: NcclDataType,
    ) -> Result<(), CommError> {
        self.run(|c, stream| {
            // SAFETY: the caller's contract; the call completes within `run`.
            unsafe {
                c.all_gather(
                    send as *const c_void,
                    recv as *mut c_void,
                    count,
                    dtype,
                    stream,
                )
            }
        })
    }

    /// `send` (`count x world_size` values) summed over the ranks; block
    /// `rank` of the sum (`count` values) into `recv`.
    ///
    /// # Safety
    ///
    /// As [`DeviceComm::all_reduce_sum`], `send` valid for `count x
    /// world_size` values.
    pub unsafe fn reduce_scatter_sum(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: NcclDataType,
    ) -> Result<(), CommError> {
        self.run(|c, stream| {
            // SAFETY: the caller's contract; the call completes within `run`.
            unsafe {
                c.reduce_scatter(
                    send as *const c_void,
                    recv as *mut c_void,
                    count,
                    dtype,
                    NcclReduceOp::Sum,
                    stream,
                )
            }
        })
    }

    /// Posts every send of `sends` and every receive of `recvs` in one
    /// NCCL group (`ncclGroupStart`, `ncclSend`/`ncclRecv` each, then
    /// `ncclGroupEnd`) and returns when all have completed: two ranks that
    /// send to each other in one exchange cannot deadlock. Each entry is
    /// `(peer, address, count)`, values of `dtype`. NCCL has no tags: the
    /// messages between two ranks match in the order they are posted, so
    /// both ends list them in the same order (see
    /// [`TensorCollectives::exchange`]).
    ///
    /// # Safety
    ///
    /// As [`DeviceComm::all_reduce_sum`], each address valid for its
    /// `count` values of `dtype`.
    pub unsafe fn exchange(
        &self,
        sends: &[(usize, DevicePtr, usize)],
        recvs: &[(usize, DevicePtr, usize)],
        dtype: NcclDataType,
    ) -> Result<(), CommError> {
        self.run(|c, stream| {
            let lib = c.library();
            lib.group_start()?;
            let mut posted = Ok(());
            for &(peer, at, count) in sends {
                // SAFETY: the caller's contract; the group completes
                // within `run`.
                posted = posted.and_then(|()| unsafe {
                    c.send(at as *const c_void, count, dtype, peer, stream)
                });
            }
            for &(peer, at, count) in recvs {
                // SAFETY: as for the sends.
                posted = posted.and_then(|()| unsafe {
                    c.recv(at as *mut c_void, count, dtype, peer, stream)
                });
            }
            // The group is closed even when a post failed, so that NCCL's
            // per-thread group state is clean for the next call.
            let ended = lib.group_end();
            posted.and(ended)
        })
    }

    /// Host memory: [`DeviceComm::all_reduce_sum`] of `values` (bf16 or
    /// f32 bit patterns as `dtype` says) in place, for communicators on
    /// [`HostStreams`].
    pub fn host_all_reduce_sum<T: Copy>(
        &self,
        values: &mut [T],
        dtype: NcclDataType,
    ) -> Result<(), CommError> {
        check_elem::<T>(dtype)?;
        let p = values.as_mut_ptr() as DevicePtr;
        // SAFETY: host memory valid for the whole call, which completes
        // before returning; only a host-memory library reads it.
        unsafe { self.all_reduce_sum(p, p, values.len(), dtype) }
    }

    /// Host memory: [`DeviceComm::all_gather`] of `send` into `recv`.
    pub fn host_all_gather<T: Copy>(
        &self,
        send: &[T],
        recv: &mut [T],
        dtype: NcclDataType,
    ) -> Result<(), CommError> {
        check_elem::<T>(dtype)?;
        check_blocks("all_gather", send.len(), recv.len(), self.world_size())?;
        let (s, r) = (send.as_ptr() as DevicePtr, recv.as_mut_ptr() as DevicePtr);
        // SAFETY: as in `host_all_reduce_sum`, lengths checked above.
        unsafe { self.all_gather(s, r, send.len(), dtype) }
    }

    /// Host memory: [`DeviceComm::reduce_scatter_sum`] of `send` into `recv`.
    pub fn host_reduce_scatter_sum<T: Copy>(
        &self,
        send: &[T],
        recv: &mut [T],
        dtype: NcclDataType,
    ) -> Result<(), CommError> {
        check_elem::<T>(dtype)?;
        check_blocks(
            "reduce_scatter_sum",
            recv.len(),
            send.len(),
            self.world_size(),
        )?;
        let (s, r) = (send.as_ptr() as DevicePtr, recv.as_mut_ptr() as DevicePtr);
        // SAFETY: as in `host_all_reduce_sum`, lengths checked above.
        unsafe { self.reduce_scatter_sum(s, r, recv.len(), dtype) }
    }
}

impl DeviceComm {
    /// Host memory: [`DeviceComm::exchange`] of `sends` (`(peer, values)`)
    /// and `recvs` (`(peer, buffer)`, each filled with exactly its length).
    pub fn host_exchange<T: Copy>(
        &self,
        sends: &[(usize, &[T])],
        recvs: &mut [(usize, &mut [T])],
        dtype: NcclDataType,
    ) -> Result<(), CommError> {
        check_elem::<T>(dtype)?;
        let sends: Vec<_> = sends
            .iter()
            .map(|(peer, v)| (*peer, v.as_ptr() as DevicePtr, v.len()))
            .collect();
        let recvs: Vec<_> = recvs
            .iter_mut()
            .map(|(peer, v)| (*peer, v.as_mut_ptr() as DevicePtr, v.len()))
            .collect();
        // SAFETY: as in `host_all_reduce_sum`: each slice is valid for its
        // length for the whole call, which completes before returning.
        unsafe { self.exchange(&sends, &recvs, dtype) }
    }
}

impl Drop for DeviceComm {
    fn drop(&mut self) {
        if self.streams.bind_and_drain().is_ok() {
            self.streams.destroy_stream(self.stream);
        }
    }
}

/// Refuses host values whose size is not `dtype`'s.
fn check_elem<T>(dtype: NcclDataType) -> Result<(), CommError> {
    if std::mem::size_of::<T>() != dtype.size_bytes() {
        return Err(CommError::BadLength {
            op: "device collective",
            detail: format!(
                "{}-byte values for {dtype:?}, which has {} bytes",
                std::mem::size_of::<T>(),
                dtype.size_bytes()
            ),
        });
    }
    Ok(())
}
