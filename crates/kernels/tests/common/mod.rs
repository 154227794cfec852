//! Test support shared by the kernel tests: the wgpu client (Vulkan over
//! Mesa's lavapipe on machines without a GPU) and `f32` transfers.

use std::panic::{catch_unwind, AssertUnwindSafe};

use cubecl::prelude::*;
use cubecl::server::Handle;
use cubecl::wgpu::{WgpuDevice, WgpuRuntime};

/// The runtime every kernel test launches on.
pub type TestRuntime = WgpuRuntime;

/// The client of the default wgpu device. Panics with install instructions
/// when wgpu finds no adapter, so a machine without a Vulkan driver fails the
/// tests instead of skipping them.
pub fn client() -> ComputeClient<TestRuntime> {
    catch_unwind(AssertUnwindSafe(|| {
        WgpuRuntime::client(&WgpuDevice::DefaultDevice)
    }))
    .unwrap_or_else(|_| {
        panic!(
            "no wgpu adapter found: the kernel tests need a Vulkan driver; on Debian install \
             the software one with `apt-get install -y mesa-vulkan-drivers libvulkan1` \
             (see README, Kernels)"
        )
    })
}

/// Uploads `values` to a new device buffer.
pub fn upload(client: &ComputeClient<TestRuntime>, values: &[f32]) -> Handle {
    client.create_from_slice(f32::as_bytes(values))
}

/// Reads a device buffer of `f32` values back to the host.
pub fn download(client: &ComputeClient<TestRuntime>, handle: Handle) -> Vec<f32> {
    let bytes = client
        .read_one(handle)
        .expect("reading a kernel output back from the device");
    f32::from_bytes(&bytes).to_vec()
}
