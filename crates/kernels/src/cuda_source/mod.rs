//! The CUDA C++ source of every kernel a launcher issues, without a GPU:
//! a CubeCL runtime ([`CudaSourceRuntime`]) whose server compiles each
//! launch with CubeCL's own CUDA compiler (the one `cubecl-cuda` hands to
//! NVRTC) against the properties of an NVIDIA architecture
//! ([`CudaArch`]), records the source and runs nothing.
//!
//! The launchers run unchanged on it, so the kernel each one picks (the
//! attention's tiles for the architecture's shared memory, the matrix
//! units where its `mma` instructions exist) is the kernel a real device
//! of that architecture would compile. `scripts/cuda_compile_check.sh`
//! feeds the recorded sources to NVRTC (from NVIDIA's `pip` wheels) and
//! reports each kernel's registers, spills and shared memory, which is
//! what a lease would otherwise be spent finding out.
//!
//! Memory is bookkeeping only: buffers can be created and passed to
//! launches, but nothing is stored and reading one is an error.

mod properties;
mod server;

pub use properties::CudaArch;
pub use server::{CudaSourceDevice, CudaSourceRuntime, CudaSourceServer, KernelSource, Recorded};

use cubecl::client::ComputeClient;
use cubecl::prelude::Runtime;

/// A client whose launches are compiled to CUDA C++ for `arch` and
/// recorded ([`recorded`]), never run.
pub fn client(arch: CudaArch) -> ComputeClient<CudaSourceRuntime> {
    CudaSourceRuntime::client(&CudaSourceDevice { arch })
}

/// The sources recorded on `client` since the last call, in launch order
/// (each distinct kernel once), after every launch submitted so far.
pub fn recorded(client: &ComputeClient<CudaSourceRuntime>) -> Vec<KernelSource> {
    // The server runs submitted launches in order; a sync returns after
    // the last one.
    cubecl::future::block_on(client.sync()).expect("the recording server's sync cannot fail");
    client.info().take()
}
