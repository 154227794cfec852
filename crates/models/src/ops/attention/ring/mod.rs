//! The per-block kernels of ring attention under context parallelism
//! (`ferrotron_parallel::context`): a ring step is the decoder's own
//! attention on a block of queries and keys at their global positions,
//! by the host-buffer core (`host`, flex feature) or by the fused CubeCL
//! kernels (`cube` on host buffers, `cube_device` on the device's own
//! tensors, the GPU backends). `context_parallel::block_kernel` picks one
//! from the model's attention implementation.

pub(in crate::ops) mod cube;
mod cube_device;
#[cfg(feature = "flex")]
pub(in crate::ops) mod host;
