//! Rotary position embedding (rotate-half layout, as Hugging Face Llama),
//! every implementation in this folder: [`rope`] runs the one its [`Rope`]
//! form names (the form `layers::position` builds from
//! `OpsChoice::rope_impl`).
//!
//! - `reference`: the plain Burn body (every backend, every dtype).
//! - `cube`: the CubeCL kernels of `ferrotron_kernels::rope` launched on
//!   the backend's buffers (the angles computed in the kernel from the
//!   inverse frequencies), and the autodiff node whose backward is the
//!   kernels' backward ([`KernelBackend::fused_rope`]).
//! - `cpu`: flex's one-pass host-buffer operation (`cpu_kernel::rope`) as
//!   one autodiff node ([`KernelBackend::cpu_rope`], flex feature).
//!
//! The backend traits must be implemented in one place per backend; their
//! RoPE methods delegate here in one line.

#[cfg(feature = "flex")]
pub(super) mod cpu;
#[cfg(feature = "flex")]
pub(super) mod cpu_kernel;
pub(super) mod cube;
pub(super) mod reference;

use burn::tensor::{FloatDType, Tensor, TensorPrimitive};

use super::fused::KernelBackend;
pub use reference::rope_reference;

/// How RoPE is applied in one forward pass, in the form of RoPE's
/// implementation (`OpsChoice::rope_impl`, turned into this form by
/// `layers::position::PositionContext::new`).
#[derive(Clone, Debug)]
pub enum Rope<B: KernelBackend> {
    /// Reference path: `(cos, sin)` tables, each `[1, 1, len, head_dim]`,
    /// for the pass's positions.
    Tables(Tensor<B, 4>, Tensor<B, 4>),
    /// The same tables, RoPE run as the backend's CPU operation
    /// ([`KernelBackend::cpu_rope`]: flex's one-pass node in f32, the
    /// reference elsewhere).
    Host(Tensor<B, 4>, Tensor<B, 4>),
    /// Fused path at positions `0..len`: the kernel computes the angles
    /// `position * inv_freq[i]` itself.
    Fused {
        /// The per-pair inverse frequencies `[head_dim / 2]` (radians per
        /// position), scaling included.
        inv_freq: Tensor<B, 1>,
    },
}

/// RoPE applied to `x` `[batch, heads, len, head_dim]`, computed in f32
/// whatever `x`'s dtype (mixed precision), the result in `x`'s dtype
/// (rounded once: the fused kernel reads and writes that dtype, the other
/// forms cast up and back).
pub fn rope<B: KernelBackend>(x: Tensor<B, 4>, rope: &Rope<B>) -> Tensor<B, 4> {
    let dtype = x.dtype();
    match rope {
        Rope::Tables(cos, sin) => rope_reference(x.cast(FloatDType::F32), cos, sin).cast(dtype),
        Rope::Host(cos, sin) => {
            let y: Tensor<B, 4> = Tensor::from_primitive(TensorPrimitive::Float(B::cpu_rope(
                x.cast(FloatDType::F32).into_primitive().tensor(),
                cos.clone().into_primitive().tensor(),
                sin.clone().into_primitive().tensor(),
            )));
            y.cast(dtype)
        }
        Rope::Fused { inv_freq } => Tensor::from_primitive(TensorPrimitive::Float(B::fused_rope(
            x.into_primitive().tensor(),
            inv_freq.clone().into_primitive().tensor(),
        ))),
    }
}
