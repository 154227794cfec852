//! The decoder's hot operations, each in up to three implementations: a
//! plain Burn reference that runs on every backend, Ferrotron's fused
//! CubeCL kernels (crate `ferrotron-kernels`) on CubeCL backends (CUDA,
//! ROCm, wgpu), and Ferrotron's CPU operations on flex's host buffers.
//!
//! Each operation is a function of this module (`attention`, `swiglu`,
//! `rms_norm`, `layer_norm`, `rope`, `cross_entropy`) that runs the
//! implementation an [`OpImpl`] (attention: an [`AttentionImpl`]) names:
//! the plain Burn reference (its body beside it), the fused CubeCL
//! kernels, or Ferrotron's CPU operation on the backend's host buffers
//! (one autodiff node each). The layers reach them through one resolved
//! value, [`OpsChoice`], which holds one implementation per operation and
//! how the head and the loss run
//! ([`HeadLoss`]): as one operation over blocks of rows, which never forms
//! the whole logits (`linear_cross_entropy/`: on the CPU backends in f32,
//! with the fused cross-entropy kernel on the CubeCL backends in every
//! precision), or over the whole logits.
//! Attention takes its positional data ([`AttentionBias`]: a bias matrix,
//! or the causal form with ALiBi slopes for FlashAttention) and RoPE its
//! tables ([`Rope`]) in the form their implementation takes, which
//! `layers::position` builds from the same choice.
//!
//! Every operation keeps its implementations in its own folder
//! (`attention/`, `swiglu/`, `norm/`, `rope/`, `gelu/`, `bias/`, `embedding/`,
//! `cross_entropy/`, `linear_cross_entropy/`: the dispatch in `mod.rs`, `reference.rs`,
//! `cube.rs` with the kernel launches and autodiff node, `cpu.rs` with
//! flex's node and `cpu_kernel.rs` with its host-buffer kernel; attention
//! also `recompute.rs` and the ring's block kernels in `ring/`); the
//! backend traits delegate to them in one line per method. `cpu/` holds
//! what the CPU kernels share (buffers, GEMM, vectorised math).
//!
//! The fused path goes through [`KernelBackend`]: the CubeCL backend
//! launches the kernels, and the autodiff backend wraps them in nodes
//! whose backward is the kernels' own backward (FlashAttention-2
//! recomputation, not autodiff of the reference), so no `[seq, seq]`
//! matrix exists in training.
//!
//! Model code stays backend-generic: it asks for an operation, and the
//! choice is made once, when the model is built ([`OpsChoice::resolve`]).

/// Adds each gradient in `$values` to its parent in `$parents`, for the
/// parents that require one, on backend `$b`. (A macro: autodiff's node
/// type is not public.)
macro_rules! register {
    ($b:ty, $grads:expr, $parents:expr, $values:expr) => {
        for (parent, value) in $parents.into_iter().zip($values) {
            if let Some(node) = parent {
                $grads.register::<$b>(node.id, value);
            }
        }
    };
}

mod adamw;
mod attention;
mod autodiff;
mod backends;
mod bias;
mod choice;
#[cfg(feature = "flex")]
mod cpu;
mod cross_entropy;
mod cube;
mod embedding;
mod fused;
mod gelu;
mod linear_cross_entropy;
mod norm;
mod rope;
mod swiglu;

pub use attention::ring::cube::CubeBlockAttention;
#[cfg(feature = "flex")]
pub use attention::ring::host::HostBlockAttention;
pub use attention::{
    attention, attention_reference, attention_reference_backward, AttentionBias, AttentionImpl,
};
#[cfg(feature = "cuda")]
pub use backends::Cuda;
#[cfg(feature = "rocm")]
pub use backends::Rocm;
#[cfg(feature = "wgpu")]
pub use backends::Wgpu;
pub use choice::{HeadLoss, OpImpl, OpsChoice};
pub use cross_entropy::cross_entropy;
pub use fused::{FusedKernels, KernelBackend, TrainBackend};
pub use gelu::gelu_tanh_reference;
pub use linear_cross_entropy::{
    block_rows, block_rows_of, grad_scale, linear_cross_entropy_blocks,
    linear_cross_entropy_cube_blocks, linear_cross_entropy_reference, LinearCrossEntropyGrads,
    BLOCK_BYTES,
};
pub use norm::{layer_norm, rms_norm};
pub use rope::{rope, rope_reference, Rope};
pub use swiglu::swiglu;

use ferrotron_kernels::attention::AttentionShape;

use crate::config::{ConfigError, DecoderConfig, Kernels};

/// The kernels a model of `config` runs on backend `B`: `config.kernels`
/// when the backend and the shape allow it; when absent, fused where the
/// backend has the kernels and the shape fits them, reference otherwise.
///
/// Errors when `"fused"` is asked for on a backend without fused kernels or
/// for a shape they do not support (head dimension over 256).
pub fn resolve_kernels<B: KernelBackend>(config: &DecoderConfig) -> Result<Kernels, ConfigError> {
    let without_kernels = (!B::has_fused_kernels()).then(|| B::name(&Default::default()));
    choose_kernels(config, without_kernels.as_deref())
}

/// [`resolve_kernels`] for a backend known only by name, so a caller can
/// check a configuration before it has a backend type: `without_kernels`
/// names the backend when it has no fused kernels (a CPU backend) and is
/// `None` when it has them.
pub fn choose_kernels(
    config: &DecoderConfig,
    without_kernels: Option<&str>,
) -> Result<Kernels, ConfigError> {
    let shape = AttentionShape {
        batch: 1,
        n_heads: config.n_heads,
        n_kv_heads: config.n_kv_heads,
        seq: 1,
        head_dim: config.head_dim(),
    };
    let unsupported = match without_kernels {
        Some(backend) => Some(format!(
            "backend {backend} has no fused kernels (they run on the CubeCL backends cuda, \
             rocm and wgpu; use \"reference\" on the CPU)"
        )),
        None => shape
            .validate()
            .err()
            .map(|e| format!("the fused kernels refuse this model: {e}")),
    };
    match (config.kernels, unsupported) {
        (Some(Kernels::Fused), Some(why)) => Err(ConfigError {
            field: "kernels",
            problem: format!("fused: {why}"),
        }),
        (Some(choice), _) => Ok(choice),
        (None, None) => Ok(Kernels::Fused),
        (None, Some(_)) => Ok(Kernels::Reference),
    }
}
