//! [`NcclRuntime`] for CubeCL's CUDA runtime, through the CUDA driver API
//! (cudarc, loaded at run time as CubeCL loads it).

use std::any::Any;

use burn_cubecl::cubecl::client::ComputeClient;
use burn_cubecl::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_cubecl::cubecl::server::Handle;
use cudarc::driver::result::{ctx, device, primary_ctx, stream};
use cudarc::driver::sys::CUstream;

use super::cube::NcclRuntime;
use super::{DevicePtr, Streams};
use crate::comm::CommError;

/// The streams of CUDA device `index`: its primary context, which CubeCL
/// runs on.
struct CudaStreams {
    index: usize,
}

impl Streams for CudaStreams {
    fn bind_and_drain(&self) -> Result<(), String> {
        let ordinal = i32::try_from(self.index).map_err(|e| e.to_string())?;
        let dev = device::get(ordinal).map_err(|e| format!("cuDeviceGet({ordinal}): {e:?}"))?;
        // SAFETY: `dev` came from `cuDeviceGet`; the primary context is
        // the one CubeCL retained for this device, so the retain only
        // counts one more user of it.
        unsafe {
            let c =
                primary_ctx::retain(dev).map_err(|e| format!("cuDevicePrimaryCtxRetain: {e:?}"))?;
            ctx::set_current(c).map_err(|e| format!("cuCtxSetCurrent: {e:?}"))?;
        }
        ctx::synchronize().map_err(|e| format!("cuCtxSynchronize: {e:?}"))
    }

    fn create_stream(&self) -> Result<usize, String> {
        stream::create(stream::StreamKind::NonBlocking)
            .map(|s| s as usize)
            .map_err(|e| format!("cuStreamCreate: {e:?}"))
    }

    fn wait(&self, s: usize) -> Result<(), String> {
        // SAFETY: `s` came from `create_stream` and is not destroyed yet.
        unsafe { stream::synchronize(s as CUstream) }
            .map_err(|e| format!("cuStreamSynchronize: {e:?}"))
    }

    fn destroy_stream(&self, s: usize) {
        // SAFETY: as in `wait`; released once, by `DeviceComm`'s drop.
        let _ = unsafe { stream::destroy(s as CUstream) };
    }
}

impl NcclRuntime for CudaRuntime {
    fn streams(device: &CudaDevice) -> Box<dyn Streams> {
        Box::new(CudaStreams {
            index: device.index,
        })
    }

    fn address(
        client: &ComputeClient<Self>,
        handle: &Handle,
    ) -> Result<(DevicePtr, Box<dyn Any + Send>), CommError> {
        let resource = client
            .get_resource(handle.clone())
            .map_err(|e| CommError::Transport(format!("a CUDA buffer's address: {e:?}")))?;
        // The resource's `ptr` includes the handle's offset
        // (cubecl-cuda's `GpuStorage::get`).
        let ptr = resource.resource().ptr;
        Ok((ptr, Box::new(resource)))
    }
}
