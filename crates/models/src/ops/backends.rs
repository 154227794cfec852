//! The GPU backends with Ferrotron's fused kernels: Burn's CubeCL backend
//! on each runtime, `f32` floats and `i32` ints (what the kernels take).
//!
//! Burn's own `burn::backend::Cuda` and `Rocm` wrap this backend in
//! `burn-fusion`, whose lazy graph cannot run foreign kernels; the decoder's
//! hot paths are the fused kernels instead.

/// NVIDIA GPUs through CubeCL's CUDA runtime (cargo feature `cuda`).
#[cfg(feature = "cuda")]
pub type Cuda = burn_cubecl::CubeBackend<burn_cubecl::cubecl::cuda::CudaRuntime, f32, i32, u8>;

/// AMD GPUs through CubeCL's HIP runtime (cargo feature `rocm`).
#[cfg(feature = "rocm")]
pub type Rocm = burn_cubecl::CubeBackend<burn_cubecl::cubecl::hip::HipRuntime, f32, i32, u8>;

/// Any GPU through CubeCL's wgpu runtime (Vulkan, Metal, DirectX 12), or a
/// CPU Vulkan driver such as Mesa's lavapipe (cargo feature `wgpu`); `u32`
/// booleans, as WGSL stores them.
#[cfg(feature = "wgpu")]
pub type Wgpu = burn_wgpu::CubeBackend<burn_wgpu::WgpuRuntime, f32, i32, u32>;
