//! Scaled dot-product attention `softmax(q k^T / sqrt(head_dim) + bias) v`
//! with grouped-query heads, every implementation in this folder:
//! [`attention`] runs the one an [`AttentionImpl`] names (resolved once,
//! `OpsChoice::attention_impl`) on the positional data of the pass, an
//! [`AttentionBias`] (built by `layers::position` in the form that
//! implementation takes).
//!
//! - `reference`: the plain Burn body forming the score matrix (every
//!   backend, every dtype), its gradients in closed form, and both on
//!   primitives.
//! - `recompute`: the reference (or the host core) as one autodiff node
//!   that keeps only its inputs and recomputes the probabilities in
//!   backward (selective recomputation).
//! - `cube`: FlashAttention, the CubeCL kernels of
//!   `ferrotron_kernels::attention` launched on the backend's buffers, and
//!   the autodiff node whose backward is the kernels' backward
//!   ([`KernelBackend::fused_attention`]).
//! - `cpu`: flex's host-buffer core in f32 ([`KernelBackend::attention_core`]),
//!   over the kernel of `cpu_kernel` (flex feature).
//! - `ring`: the per-block kernels of ring attention under context
//!   parallelism, on the host core (`ring::host`) and on the fused
//!   kernels (`ring::cube`).
//!
//! The backend traits must be implemented in one place per backend; their
//! attention methods delegate here in one line.

#[cfg(feature = "flex")]
pub(super) mod cpu;
#[cfg(feature = "flex")]
pub(super) mod cpu_kernel;
pub(super) mod cube;
pub(super) mod recompute;
pub(super) mod reference;
pub(super) mod ring;

use burn::tensor::{DType, Tensor, TensorPrimitive};
use ferrotron_kernels::attention::{AttentionOptions, MatrixUnits};
use ferrotron_parallel::context::RingAttention;

use super::choice::OpImpl;
use super::fused::KernelBackend;
pub use reference::{attention_reference, attention_reference_backward};

/// Which implementation computes a model's attention core: the one
/// resolved choice for attention (`OpsChoice::attention_impl`). Each
/// takes its positional data in one form ([`AttentionImpl::takes_matrix`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionImpl {
    /// [`attention_reference`] in Burn's operations (autodiff keeps the
    /// scores and probabilities). Takes [`AttentionBias::Matrix`].
    Reference,
    /// The reference as one autodiff node that keeps only `q`, `k`, `v`
    /// and recomputes the scores and softmax in backward
    /// ([`attention_reference_backward`]; selective recomputation). Takes
    /// [`AttentionBias::Matrix`].
    Recomputed,
    /// The backend's host-buffer core (flex, f32: `cpu_kernel`'s
    /// `attention_forward`) as one autodiff node that keeps only `q`, `k`,
    /// `v` and recomputes the probabilities in its own backward
    /// ([`KernelBackend::host_attention`]); other dtypes run
    /// [`AttentionImpl::Reference`]. Takes [`AttentionBias::Matrix`].
    Host,
    /// FlashAttention, Ferrotron's CubeCL kernels
    /// ([`KernelBackend::fused_attention`]). Takes [`AttentionBias::Causal`].
    Fused {
        /// The kernels asked for on the matrix units
        /// ([`AttentionOptions::matrix_units`]).
        matrix_units: MatrixUnits,
    },
}

impl From<OpImpl> for AttentionImpl {
    /// The attention of an operation-wide choice: [`OpImpl::Cpu`] is the
    /// host core, [`OpImpl::Fused`] the kernels off the matrix units.
    fn from(op: OpImpl) -> Self {
        match op {
            OpImpl::Reference => Self::Reference,
            OpImpl::Cpu => Self::Host,
            OpImpl::Fused => Self::Fused {
                matrix_units: MatrixUnits::Off,
            },
        }
    }
}

impl AttentionImpl {
    /// Whether this is FlashAttention.
    pub fn is_fused(self) -> bool {
        matches!(self, Self::Fused { .. })
    }

    /// Whether this implementation takes the bias as a matrix
    /// ([`AttentionBias::Matrix`]); FlashAttention takes
    /// [`AttentionBias::Causal`].
    pub fn takes_matrix(self) -> bool {
        !self.is_fused()
    }

    /// The same implementation with the reference recomputed in backward
    /// (selective recomputation) when `on`, and not when `!on`; the other
    /// implementations are unchanged (FlashAttention and the host core keep
    /// only their inputs and recompute the rest already).
    pub fn recomputed(self, on: bool) -> Self {
        match self {
            Self::Reference if on => Self::Recomputed,
            Self::Recomputed if !on => Self::Reference,
            other => other,
        }
    }
}

/// The positional part of attention for one forward pass (the causal mask
/// and ALiBi), as data in the form the pass's [`AttentionImpl`] takes
/// (built by `layers::position::PositionContext::new`).
#[derive(Clone, Debug)]
pub enum AttentionBias<B: KernelBackend> {
    /// The additive bias `[1, 1 or n_heads, len, keys]` holding the causal
    /// mask (`-inf`) and ALiBi's `slope_h * key_position`.
    Matrix(Tensor<B, 4>),
    /// Queries and keys are the same `len` positions from 0: the causal
    /// mask, applied by the kernel itself, and ALiBi from its slopes
    /// `[n_heads]` (bias `slope_h * (key - query)`, which differs from the
    /// matrix's by a constant per row and so gives the same softmax).
    Causal {
        /// ALiBi slopes, when the family uses ALiBi.
        alibi_slopes: Option<Tensor<B, 1>>,
    },
    /// Context parallelism: this rank's queries, keys and values are its
    /// chunks of the sequences, and the attention runs around the ring
    /// ([`CpOps::ring_attention`](ferrotron_parallel::context::CpOps::ring_attention)),
    /// each block by the ring's kernel (chosen from the [`AttentionImpl`]
    /// when the ring was built) with the causal mask and ALiBi of the
    /// global positions.
    Ring(RingAttention),
}

/// Attention of `q` `[batch, n_heads, len, head_dim]` over `k`, `v`
/// `[batch, n_kv_heads, keys, head_dim]` (query head `h` uses key/value head
/// `h / (n_heads / n_kv_heads)`) with `bias`, computed by `op`; returns
/// `[batch, n_heads, len, head_dim]`.
///
/// Panics when `bias` is not in the form `op` takes (see
/// [`AttentionImpl`]): `layers::position` builds the form from the same
/// choice, so the decoder never makes such a call.
pub fn attention<B: KernelBackend>(
    op: AttentionImpl,
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    bias: &AttentionBias<B>,
) -> Tensor<B, 4> {
    let prim = |t: Tensor<B, 4>| t.into_primitive().tensor();
    let float = |p| Tensor::from_primitive(TensorPrimitive::Float(p));
    match (op, bias) {
        (_, AttentionBias::Ring(ring)) => B::ring_attention(q, k, v, ring),
        (AttentionImpl::Reference, AttentionBias::Matrix(matrix)) => {
            attention_reference(q, k, v, matrix)
        }
        (AttentionImpl::Recomputed, AttentionBias::Matrix(matrix)) => float(
            B::recomputed_attention(prim(q), prim(k), prim(v), prim(matrix.clone())),
        ),
        // Host buffers in f32 only; bf16 and f16 keep the reference.
        (AttentionImpl::Host, AttentionBias::Matrix(matrix)) if q.dtype() != DType::F32 => {
            attention_reference(q, k, v, matrix)
        }
        (AttentionImpl::Host, AttentionBias::Matrix(matrix)) => float(B::host_attention(
            prim(q),
            prim(k),
            prim(v),
            prim(matrix.clone()),
        )),
        (AttentionImpl::Fused { matrix_units }, AttentionBias::Causal { alibi_slopes }) => {
            let options = AttentionOptions {
                causal: true,
                scale: None,
                matrix_units,
            };
            // In the inputs' dtype: the kernels keep f32 scores and sums
            // and round the output (and in backward the gradients) once.
            float(B::fused_attention(
                prim(q),
                prim(k),
                prim(v),
                alibi_slopes.clone().map(|s| s.into_primitive().tensor()),
                options,
            ))
        }
        (op, AttentionBias::Matrix(_) | AttentionBias::Causal { .. }) => panic!(
            "attention: {op:?} takes the bias {}",
            if op.takes_matrix() {
                "as a matrix"
            } else {
                "as the causal form with ALiBi slopes"
            }
        ),
    }
}
