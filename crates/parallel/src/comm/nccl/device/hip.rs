//! [`NcclRuntime`] for CubeCL's HIP runtime (RCCL), through the HIP
//! runtime API CubeCL itself links.

use std::any::Any;

use burn_cubecl::cubecl::client::ComputeClient;
use burn_cubecl::cubecl::hip::{AmdDevice, HipRuntime};
use burn_cubecl::cubecl::server::Handle;
use cubecl_hip_sys::{
    hipDeviceSynchronize, hipError_t_hipSuccess, hipSetDevice, hipStreamCreateWithFlags,
    hipStreamDestroy, hipStreamNonBlocking, hipStreamSynchronize, hipStream_t,
};

use super::cube::NcclRuntime;
use super::{DevicePtr, Streams};
use crate::comm::CommError;

/// The streams of HIP device `index`.
struct HipStreams {
    index: usize,
}

/// `Ok` for `hipSuccess`, else the call and its code.
fn check(call: &str, code: cubecl_hip_sys::hipError_t) -> Result<(), String> {
    if code == hipError_t_hipSuccess {
        Ok(())
    } else {
        Err(format!("{call}: HIP error {code}"))
    }
}

impl Streams for HipStreams {
    fn bind_and_drain(&self) -> Result<(), String> {
        let ordinal = i32::try_from(self.index).map_err(|e| e.to_string())?;
        // SAFETY: plain HIP runtime calls on a device index.
        unsafe {
            check("hipSetDevice", hipSetDevice(ordinal))?;
            check("hipDeviceSynchronize", hipDeviceSynchronize())
        }
    }

    fn create_stream(&self) -> Result<usize, String> {
        let mut s: hipStream_t = std::ptr::null_mut();
        // SAFETY: `s` is a valid out-pointer.
        check("hipStreamCreateWithFlags", unsafe {
            hipStreamCreateWithFlags(&mut s, hipStreamNonBlocking)
        })?;
        Ok(s as usize)
    }

    fn wait(&self, s: usize) -> Result<(), String> {
        // SAFETY: `s` came from `create_stream` and is not destroyed yet.
        check("hipStreamSynchronize", unsafe {
            hipStreamSynchronize(s as hipStream_t)
        })
    }

    fn destroy_stream(&self, s: usize) {
        // SAFETY: as in `wait`; released once, by `DeviceComm`'s drop.
        let _ = unsafe { hipStreamDestroy(s as hipStream_t) };
    }
}

impl NcclRuntime for HipRuntime {
    fn streams(device: &AmdDevice) -> Box<dyn Streams> {
        Box::new(HipStreams {
            index: device.index,
        })
    }

    fn address(
        client: &ComputeClient<Self>,
        handle: &Handle,
    ) -> Result<(DevicePtr, Box<dyn Any + Send>), CommError> {
        let resource = client
            .get_resource(handle.clone())
            .map_err(|e| CommError::Transport(format!("a HIP buffer's address: {e:?}")))?;
        // The resource's `ptr` includes the handle's offset
        // (cubecl-hip's `GpuStorage::get`).
        let ptr = resource.resource().ptr as DevicePtr;
        Ok((ptr, Box::new(resource)))
    }
}
