//! Rotary position embedding (rotate-half layout, as Hugging Face Llama).

use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Tensor, TensorPrimitive};

use super::fused::KernelBackend;

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

/// `x * cos + rotate_half(x) * sin` with `rotate_half([a, b]) = [-b, a]`, for
/// `x` `[batch, heads, len, head_dim]` and tables `[1, 1, len, head_dim]`.
pub fn rope_reference<B: Backend>(
    x: Tensor<B, 4>,
    cos: &Tensor<B, 4>,
    sin: &Tensor<B, 4>,
) -> Tensor<B, 4> {
    let d = x.dims()[3];
    let a = x.clone().narrow(3, 0, d / 2);
    let b = x.clone().narrow(3, d / 2, d / 2);
    let rotated = Tensor::cat(vec![b.neg(), a], 3);
    x * cos.clone() + rotated * sin.clone()
}
