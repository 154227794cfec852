//! Collectives on the buffers of CubeCL tensors (cuda, rocm): each tensor
//! is made contiguous in the wire's dtype, its buffer's device address
//! comes from `ComputeClient::get_resource` (the resource is kept until the
//! collective has completed, so the memory cannot be reused meanwhile),
//! and the call runs inside `ComputeClient::exclusive` as the parent
//! module says. The output is a new buffer of the same client.
//!
//! [`Staged`] is the [`Memory`] of such a device for `NcclCommunicator`,
//! whose contract moves host slices: each call's values are staged
//! through buffers of the device.

use std::any::Any;

use burn::tensor::{DType, FloatDType, Tensor, TensorPrimitive};
use burn_cubecl::cubecl::client::ComputeClient;
use burn_cubecl::cubecl::server::Handle;
use burn_cubecl::element::BoolElement;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime, FloatElement, IntElement};
use ferrotron_engine::precision::Precision;
use std::sync::Arc;

use super::tensors::in_tag_order;
use super::wire::{tensor_dtype, wire_dtype};
use super::{DeviceComm, DevicePtr, Route, Streams, TensorCollectives};
use crate::comm::nccl::memory::{Buf, Call, Memory};
use crate::comm::nccl::{NcclDataType, NcclLibrary};
use crate::comm::{CommError, Communicator};

/// A CubeCL runtime whose buffers NCCL (or RCCL) reads in place.
pub trait NcclRuntime: CubeRuntime {
    /// The device's [`Streams`].
    fn streams(device: &Self::Device) -> Box<dyn Streams>;
    /// The device address of `handle`'s first byte, and the resource that
    /// keeps its memory from being reused while held.
    fn address(
        client: &ComputeClient<Self>,
        handle: &Handle,
    ) -> Result<(DevicePtr, Box<dyn Any + Send>), CommError>;
}

/// A rank's NCCL communicator on one CubeCL device.
pub struct CubeComm<R: NcclRuntime> {
    comm: DeviceComm,
    client: ComputeClient<R>,
    device: R::Device,
}

/// A CubeCL error as a communicator error.
fn cube_error(what: &str, e: impl std::fmt::Debug) -> CommError {
    CommError::Transport(format!("NCCL on device buffers: {what}: {e:?}"))
}

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;

impl<R: NcclRuntime> CubeComm<R> {
    /// This rank's communicator on `device` over the ranks of `host`
    /// (collective), created with the device bound, inside `exclusive`.
    pub fn init(
        lib: Arc<NcclLibrary>,
        host: &dyn Communicator,
        device: &R::Device,
    ) -> Result<Self, CommError> {
        let client = R::client(device);
        let streams = R::streams(device);
        let comm = client
            .exclusive(move || DeviceComm::init(lib, host, streams))
            .map_err(|e| cube_error("entering the device", e))??;
        Ok(Self {
            comm,
            client,
            device: device.clone(),
        })
    }

    /// Runs `call(comm, send, recv, dtype)` on `t` cast to `dtype` and made
    /// contiguous, into a new buffer of `out` values, inside `exclusive`;
    /// returns that buffer as an f32 tensor `[out]`.
    fn collective<F, I, BT>(
        &self,
        t: Tensor<Cube<R, F, I, BT>, 1>,
        dtype: NcclDataType,
        out: usize,
        call: impl FnOnce(&DeviceComm, DevicePtr, DevicePtr, NcclDataType) -> Result<(), CommError>
            + Send,
    ) -> Result<Tensor<Cube<R, F, I, BT>, 1>, CommError>
    where
        F: FloatElement,
        I: IntElement,
        BT: BoolElement,
    {
        let wire = tensor_dtype(dtype);
        let (send, _) = Self::sendable(t, wire);
        let recv = self.client.empty(out * dtype.size_bytes());
        let (s, keep_send) = R::address(&self.client, &send.handle)?;
        let (r, keep_recv) = R::address(&self.client, &recv)?;
        let comm = &self.comm;
        self.client
            .exclusive(move || call(comm, s, r, dtype))
            .map_err(|e| cube_error("entering the device", e))??;
        drop((keep_send, keep_recv, send));
        Ok(self.received(recv, out, wire))
    }

    /// `t` cast to the `wire` dtype and made contiguous, with its length.
    fn sendable<F, I, BT>(
        t: Tensor<Cube<R, F, I, BT>, 1>,
        wire: FloatDType,
    ) -> (CubeTensor<R>, usize)
    where
        F: FloatElement,
        I: IntElement,
        BT: BoolElement,
    {
        let n = t.dims()[0];
        let t = if t.dtype() == DType::from(wire) {
            t
        } else {
            t.cast(wire)
        };
        (into_contiguous(t.into_primitive().tensor()), n)
    }

    /// The buffer `handle` of `n` values of `wire` that a call wrote, as
    /// an f32 tensor `[n]`.
    fn received<F, I, BT>(
        &self,
        handle: Handle,
        n: usize,
        wire: FloatDType,
    ) -> Tensor<Cube<R, F, I, BT>, 1>
    where
        F: FloatElement,
        I: IntElement,
        BT: BoolElement,
    {
        let result = CubeTensor::new_contiguous(
            self.client.clone(),
            self.device.clone(),
            [n].into(),
            handle,
            DType::from(wire),
        );
        let result = Tensor::from_primitive(TensorPrimitive::Float(result));
        if wire == FloatDType::F32 {
            result
        } else {
            result.cast(FloatDType::F32)
        }
    }
}

impl<R, F, I, BT> TensorCollectives<Cube<R, F, I, BT>> for CubeComm<R>
where
    R: NcclRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    fn all_reduce_sum(
        &self,
        t: Tensor<Cube<R, F, I, BT>, 1>,
        reduce: Precision,
    ) -> Result<Tensor<Cube<R, F, I, BT>, 1>, CommError> {
        let n = t.dims()[0];
        self.collective(t, wire_dtype(reduce), n, |c, s, r, d| {
            // SAFETY: `s` and `r` are this client's buffers of `n` values
            // of `d`, held by `collective` until the call returns.
            unsafe { c.all_reduce_sum(s, r, n, d) }
        })
    }

    fn all_gather(
        &self,
        t: Tensor<Cube<R, F, I, BT>, 1>,
        wire: Precision,
    ) -> Result<Tensor<Cube<R, F, I, BT>, 1>, CommError> {
        let n = t.dims()[0];
        let all = n * self.comm.world_size();
        self.collective(t, wire_dtype(wire), all, |c, s, r, d| {
            // SAFETY: as in `all_reduce_sum`, `r` holding `n x world_size`.
            unsafe { c.all_gather(s, r, n, d) }
        })
    }

    fn reduce_scatter_sum(
        &self,
        t: Tensor<Cube<R, F, I, BT>, 1>,
        reduce: Precision,
    ) -> Result<Tensor<Cube<R, F, I, BT>, 1>, CommError> {
        let w = self.comm.world_size();
        let total = t.dims()[0];
        if !total.is_multiple_of(w) {
            return Err(CommError::BadLength {
                op: "reduce_scatter_sum",
                detail: format!("{total} values do not split over {w} ranks"),
            });
        }
        let n = total / w;
        self.collective(t, wire_dtype(reduce), n, |c, s, r, d| {
            // SAFETY: as in `all_reduce_sum`, `s` holding `n x world_size`.
            unsafe { c.reduce_scatter_sum(s, r, n, d) }
        })
    }

    fn exchange(
        &self,
        mut sends: Vec<(Route, Tensor<Cube<R, F, I, BT>, 1>)>,
        recvs: &[(Route, usize)],
        wire: Precision,
        _device: &R::Device,
    ) -> Result<Vec<Tensor<Cube<R, F, I, BT>, 1>>, CommError> {
        let dtype = wire_dtype(wire);
        let wire = tensor_dtype(dtype);
        sends.sort_by_key(|(route, _)| route.tag);
        let order = in_tag_order(recvs);
        let sent: Vec<(usize, CubeTensor<R>, usize)> = sends
            .into_iter()
            .map(|(route, t)| {
                let (t, n) = Self::sendable(t, wire);
                (route.peer, t, n)
            })
            .collect();
        let bufs: Vec<Handle> = order
            .iter()
            .map(|&i| self.client.empty(recvs[i].1 * dtype.size_bytes()))
            .collect();
        // The resources keep the buffers' memory until the group is done.
        let mut keep = Vec::with_capacity(sent.len() + bufs.len());
        let mut s = Vec::with_capacity(sent.len());
        for (peer, t, n) in &sent {
            let (at, resource) = R::address(&self.client, &t.handle)?;
            keep.push(resource);
            s.push((*peer, at, *n));
        }
        let mut r = Vec::with_capacity(bufs.len());
        for (&i, handle) in order.iter().zip(&bufs) {
            let (at, resource) = R::address(&self.client, handle)?;
            keep.push(resource);
            r.push((recvs[i].0.peer, at, recvs[i].1));
        }
        let comm = &self.comm;
        // SAFETY: every address is a buffer of this client holding its
        // count of `dtype` values, held (`keep`, `sent`, `bufs`) until the
        // group has completed, which it has when the call returns.
        self.client
            .exclusive(move || unsafe { comm.exchange(&s, &r, dtype) })
            .map_err(|e| cube_error("entering the device", e))??;
        drop((keep, sent));
        let mut out = vec![None; recvs.len()];
        for (&i, handle) in order.iter().zip(bufs) {
            out[i] = Some(self.received(handle, recvs[i].1, wire));
        }
        Ok(out.into_iter().flatten().collect())
    }
}

/// CUDA's communicator on device buffers (cargo feature `cuda`).
#[cfg(feature = "cuda")]
pub type CudaComm = CubeComm<burn_cubecl::cubecl::cuda::CudaRuntime>;

/// ROCm's (RCCL) communicator on device buffers (cargo feature `rocm`).
#[cfg(feature = "rocm")]
pub type HipComm = CubeComm<burn_cubecl::cubecl::hip::HipRuntime>;

/// The [`Memory`] of a CubeCL device: each call's host values go into
/// buffers of the device's client, the call runs inside `exclusive` on
/// Ferrotron's stream (the parent module's three steps), and the results
/// are read back. What `NcclCommunicator` runs on, on a GPU.
pub struct Staged<R: NcclRuntime> {
    client: ComputeClient<R>,
    streams: Box<dyn Streams>,
    stream: usize,
}

impl<R: NcclRuntime> Staged<R> {
    /// The memory of `device`, with a stream of its own.
    pub fn new(device: &R::Device) -> Result<Self, CommError> {
        let client = R::client(device);
        let streams = R::streams(device);
        let s = &*streams;
        let stream = client
            .exclusive(move || {
                s.bind_and_drain()?;
                s.create_stream()
            })
            .map_err(|e| cube_error("entering the device", e))?
            .map_err(|e| CommError::Transport(format!("NCCL on device buffers: a stream: {e}")))?;
        Ok(Self {
            client,
            streams,
            stream,
        })
    }
}

/// `values` as bytes, for an upload.
fn bytes_of(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

impl<R: NcclRuntime> Memory for Staged<R> {
    fn exclusive(&self, task: &mut (dyn FnMut() + Send)) -> Result<(), CommError> {
        let s = &*self.streams;
        self.client
            .exclusive(move || {
                let bound = s.bind_and_drain();
                if bound.is_ok() {
                    task();
                }
                bound
            })
            .map_err(|e| cube_error("entering the device", e))?
            .map_err(|e| CommError::Transport(format!("NCCL on device buffers: {e}")))
    }

    fn run(&self, bufs: &mut [Buf<'_>], call: &mut Call<'_>) -> Result<(), CommError> {
        // A device buffer per host buffer (none for an empty one).
        let handles: Vec<Option<Handle>> = bufs
            .iter()
            .map(|b| match b {
                _ if b.is_empty() => None,
                Buf::In(s) => Some(self.client.create_from_slice(&bytes_of(s))),
                Buf::InOut(s) => Some(self.client.create_from_slice(&bytes_of(s))),
                Buf::Out(s) => Some(self.client.empty(4 * s.len())),
            })
            .collect();
        let mut ptrs = Vec::with_capacity(handles.len());
        let mut keep = Vec::with_capacity(handles.len());
        for h in &handles {
            let (p, k) = match h {
                Some(h) => R::address(&self.client, h)?,
                None => (0, Box::new(()) as Box<dyn Any + Send>),
            };
            ptrs.push(p);
            keep.push(k);
        }
        let (s, stream) = (&*self.streams, self.stream);
        self.client
            .exclusive(move || -> Result<(), CommError> {
                s.bind_and_drain()
                    .map_err(|e| CommError::Transport(format!("NCCL on device buffers: {e}")))?;
                call(&ptrs, stream as *mut std::ffi::c_void)
                    .map_err(super::super::communicator::nccl_error)?;
                s.wait(stream)
                    .map_err(|e| CommError::Transport(format!("NCCL on device buffers: {e}")))
            })
            .map_err(|e| cube_error("entering the device", e))??;
        drop(keep);
        for (b, h) in bufs.iter_mut().zip(handles) {
            let (Buf::Out(out) | Buf::InOut(out), Some(h)) = (b, h) else {
                continue;
            };
            let bytes = self
                .client
                .read_one(h)
                .map_err(|e| cube_error("reading a result back", e))?;
            for (v, chunk) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *v = f32::from_ne_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            }
        }
        Ok(())
    }
}

impl<R: NcclRuntime> Drop for Staged<R> {
    fn drop(&mut self) {
        if self.streams.bind_and_drain().is_ok() {
            self.streams.destroy_stream(self.stream);
        }
    }
}
