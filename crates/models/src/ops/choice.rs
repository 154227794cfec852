//! The one value that says how a model computes its hot operations: one
//! resolved [`OpImpl`] per operation (and the head's [`HeadLoss`]),
//! resolved once when the model is built from the backend and the config
//! and handed to every layer. A new operation is one more field here; the
//! layers only call the methods.

use burn::tensor::{Int, Tensor};
use ferrotron_engine::precision::Precision;

use super::attention::AttentionImpl;
use super::fused::KernelBackend;
use super::{bias, embedding, gelu, layer_norm, resolve_kernels};
use super::{rms_norm, swiglu};

use crate::config::{ConfigError, DecoderConfig, Kernels};

/// How the output head and the loss are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadLoss {
    /// The `[rows, vocab]` logits, then [`super::cross_entropy`] with the
    /// model's [`Kernels`].
    Logits,
    /// [`KernelBackend::chunked_linear_cross_entropy`]: the head's matmul,
    /// log-softmax and target pick per block of rows, never forming the
    /// whole logits (the CPU backends in f32, the CubeCL backends with
    /// fused kernels in every precision).
    Chunked,
}

impl HeadLoss {
    /// The head a model of `config` runs with the resolved `kernels` on a
    /// backend with fused kernels (`fused_backend`: the CubeCL backends) or
    /// without (the CPU backends): chunked with the fused kernels in every
    /// precision, and on the CPU backends when `config.kernels` is absent
    /// and the model computes in f32; the whole logits otherwise (see
    /// [`OpsChoice::linear_cross_entropy`]). Tensor parallelism replaces
    /// either by the vocabulary-parallel loss over the logits.
    pub fn choose(config: &DecoderConfig, kernels: Kernels, fused_backend: bool) -> Self {
        let fused = fused_backend && kernels == Kernels::Fused;
        let cpu = config.kernels.is_none() && !fused_backend;
        if fused || (cpu && config.precision == Precision::Fp32) {
            Self::Chunked
        } else {
            Self::Logits
        }
    }
}

/// Which implementation of one operation runs. An operation with no
/// implementation of the kind named runs its reference (cross-entropy has
/// no CPU operation of its own: the head's CPU form is
/// [`HeadLoss::Chunked`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpImpl {
    /// The plain Burn operations (every backend, every dtype).
    Reference,
    /// Ferrotron's CubeCL kernels as Burn custom operations with their own
    /// backward ([`KernelBackend`]'s `fused_*`; wgpu, cuda, rocm).
    Fused,
    /// Ferrotron's CPU operation on the backend's host buffers, one autodiff
    /// node with its own backward ([`KernelBackend`]'s `cpu_*` and
    /// [`KernelBackend::host_attention`]: flex's own in f32, the reference
    /// elsewhere and in other dtypes).
    Cpu,
}

impl From<Kernels> for OpImpl {
    fn from(kernels: Kernels) -> Self {
        match kernels {
            Kernels::Fused => Self::Fused,
            Kernels::Reference => Self::Reference,
        }
    }
}

/// The implementation of every hot operation of a model, one resolved
/// [`OpImpl`] per operation (attention: an [`AttentionImpl`]) and the
/// head's [`HeadLoss`]; each operation's method (and each layer) reads its
/// own field only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpsChoice {
    kernels: Kernels,
    attention: AttentionImpl,
    rope: OpImpl,
    rms_norm: OpImpl,
    layer_norm: OpImpl,
    swiglu: OpImpl,
    gelu: OpImpl,
    bias: OpImpl,
    embedding: OpImpl,
    cross_entropy: OpImpl,
    head_loss: HeadLoss,
}

impl From<Kernels> for OpsChoice {
    /// `kernels` for every operation, the head through the whole logits.
    fn from(kernels: Kernels) -> Self {
        let op = OpImpl::from(kernels);
        Self {
            kernels,
            attention: op.into(),
            rope: op,
            rms_norm: op,
            layer_norm: op,
            swiglu: op,
            gelu: op,
            bias: op,
            embedding: op,
            cross_entropy: op,
            head_loss: HeadLoss::Logits,
        }
    }
}

impl OpsChoice {
    /// The plain Burn reference of every operation (runs on every backend).
    pub fn reference() -> Self {
        Kernels::Reference.into()
    }

    /// What a model of `config` runs on backend `B`:
    ///
    /// - [`OpImpl::Fused`] for attention (on the matrix units when
    ///   `config.attention_matrix_units`), RoPE, the norms, GELU, SwiGLU,
    ///   the linear layers' bias add, the embedding's gradient and the
    ///   logits' cross-entropy where
    ///   [`resolve_kernels`] gives
    ///   [`Kernels::Fused`] (the CubeCL backends), and the head and loss
    ///   chunked in every precision;
    /// - where `config.kernels` is absent and the backend has no fused
    ///   kernels (the CPU backends): attention as the backend's host-buffer
    ///   core ([`AttentionImpl::Host`]) where it has one (flex; f32 only, other
    ///   dtypes run the reference); and when the model computes in f32,
    ///   GELU, SwiGLU, the norms and RoPE as the backend's CPU operations
    ///   ([`KernelBackend::cpu_gelu_tanh`] and the others: Ferrotron's own
    ///   on flex, the reference elsewhere) and the head and loss chunked;
    /// - [`OpImpl::Reference`] otherwise: a bf16 or f16 model on the CPU
    ///   backends (the norms compute in f32 in every precision, but such a
    ///   model keeps Burn's operations throughout, as its head does), and
    ///   an explicit `kernels = "reference"`, which also keeps the plain
    ///   logits path.
    ///
    /// Errors as [`resolve_kernels`].
    pub fn resolve<B: KernelBackend>(config: &DecoderConfig) -> Result<Self, ConfigError> {
        let kernels = resolve_kernels::<B>(config)?;
        let by_kernels = OpImpl::from(kernels);
        let cpu = config.kernels.is_none() && !B::has_fused_kernels();
        let elementwise = if cpu && config.precision == Precision::Fp32 {
            OpImpl::Cpu
        } else {
            by_kernels
        };
        Ok(Self {
            kernels,
            attention: match by_kernels {
                _ if cpu && B::has_host_attention() => AttentionImpl::Host,
                OpImpl::Fused => AttentionImpl::Fused {
                    matrix_units: config.attention_matrix_units,
                },
                other => other.into(),
            },
            rope: elementwise,
            rms_norm: elementwise,
            layer_norm: elementwise,
            swiglu: elementwise,
            gelu: elementwise,
            bias: by_kernels,
            embedding: by_kernels,
            cross_entropy: by_kernels,
            head_loss: HeadLoss::choose(config, kernels, B::has_fused_kernels()),
        })
    }

    /// The kernels setting the model was resolved from (`config.kernels`,
    /// or its default for the backend); the operations read their own
    /// fields below.
    pub fn kernels(&self) -> Kernels {
        self.kernels
    }

    /// The attention core ([`super::attention()`]); the position context of
    /// a pass holds the bias in the form this takes (see
    /// `layers::position`). Decoding with a KV cache runs the reference in
    /// place of FlashAttention ([`OpsChoice::decoding`]), and selective
    /// recomputation turns the reference into its recomputing node
    /// ([`OpsChoice::recomputed_attention`]).
    pub fn attention_impl(&self) -> AttentionImpl {
        self.attention
    }

    /// RoPE ([`super::rope`], through the position context's
    /// [`super::Rope`] form, as [`OpsChoice::attention_impl`]).
    pub fn rope_impl(&self) -> OpImpl {
        self.rope
    }

    /// RMSNorm ([`super::rms_norm`]).
    pub fn rms_norm_impl(&self) -> OpImpl {
        self.rms_norm
    }

    /// LayerNorm ([`super::layer_norm`]).
    pub fn layer_norm_impl(&self) -> OpImpl {
        self.layer_norm
    }

    /// SwiGLU's gating ([`super::swiglu`]).
    pub fn swiglu_impl(&self) -> OpImpl {
        self.swiglu
    }

    /// GELU-tanh ([`OpsChoice::gelu_tanh`]).
    pub fn gelu_impl(&self) -> OpImpl {
        self.gelu
    }

    /// The linear layers' bias add ([`OpsChoice::bias_add`]).
    pub fn bias_impl(&self) -> OpImpl {
        self.bias
    }

    /// The token embedding lookup ([`OpsChoice::embedding`]).
    pub fn embedding_impl(&self) -> OpImpl {
        self.embedding
    }

    /// The cross-entropy of whole logits ([`super::cross_entropy`]: the
    /// head's [`HeadLoss::Logits`] and evaluation).
    pub fn cross_entropy_impl(&self) -> OpImpl {
        self.cross_entropy
    }

    /// How the head and the loss are computed.
    pub fn head_loss(&self) -> HeadLoss {
        self.head_loss
    }

    /// The same choice for a pass that decodes with a KV cache: attention
    /// and RoPE run their reference in place of the fused kernels (whose
    /// positions start at 0 and which take no cached keys).
    pub fn decoding(self) -> Self {
        let rope = match self.rope {
            OpImpl::Fused => OpImpl::Reference,
            other => other,
        };
        let attention = match self.attention {
            AttentionImpl::Fused { .. } => AttentionImpl::Reference,
            other => other,
        };
        Self {
            attention,
            rope,
            ..self
        }
    }

    /// The same choice with the reference attention recomputed in backward
    /// when `on` (selective recomputation, [`AttentionImpl::recomputed`]).
    pub fn recomputed_attention(self, on: bool) -> Self {
        Self {
            attention: self.attention.recomputed(on),
            ..self
        }
    }

    /// GELU-tanh of `x` `[batch, seq, n]` (see
    /// [`super::gelu_tanh_reference`]).
    pub fn gelu_tanh<B: KernelBackend>(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        gelu::gelu_tanh(self.gelu, x)
    }

    /// `y + bias` over the rows of `y` `[rows, n]` (compute dtype) with a
    /// linear layer's bias `[n]` (f32), in `y`'s dtype (see `ops/bias/`).
    pub fn bias_add<B: KernelBackend>(&self, y: Tensor<B, 2>, bias: Tensor<B, 1>) -> Tensor<B, 2> {
        bias::bias_add(self.bias, y, bias)
    }

    /// The rows `ids` `[tokens]` of the embedding `table` `[vocab, dim]`,
    /// in the table's dtype (see `ops/embedding/`).
    pub fn embedding<B: KernelBackend>(
        &self,
        table: Tensor<B, 2>,
        ids: Tensor<B, 1, Int>,
    ) -> Tensor<B, 2> {
        embedding::embedding(self.embedding, table, ids)
    }

    /// `silu(gate) * up` of `[batch, seq, n]` tensors (see
    /// [`super::swiglu`]).
    pub fn swiglu<B: KernelBackend>(&self, gate: Tensor<B, 3>, up: Tensor<B, 3>) -> Tensor<B, 3> {
        swiglu(self.swiglu, gate, up)
    }

    /// RMSNorm of f32 `x` `[batch, seq, hidden]` (see [`super::rms_norm`]).
    pub fn rms_norm<B: KernelBackend>(
        &self,
        x: Tensor<B, 3>,
        weight: Tensor<B, 1>,
        eps: f64,
    ) -> Tensor<B, 3> {
        rms_norm(self.rms_norm, x, weight, eps)
    }

    /// LayerNorm of f32 `x` `[batch, seq, hidden]` (see
    /// [`super::layer_norm`]).
    pub fn layer_norm<B: KernelBackend>(
        &self,
        x: Tensor<B, 3>,
        weight: Tensor<B, 1>,
        bias: Tensor<B, 1>,
        eps: f64,
    ) -> Tensor<B, 3> {
        layer_norm(self.layer_norm, x, weight, bias, eps)
    }

    /// Mean cross-entropy (nats, `[1]`) of the head `weight` `[hidden,
    /// vocab]` applied to `x` `[rows, hidden]` against `targets` `[rows]`,
    /// with the loss contract of [`super::cross_entropy`] (negative targets
    /// ignored, 0 when all are). The matmul runs in `x`'s dtype (`weight` is
    /// cast to it), the softmax and the loss in f32. The chunked head
    /// ([`HeadLoss::Chunked`]) runs on the CPU backends in f32 only: in f16
    /// the loss scale must reach the logits' gradient before its cast to
    /// f16, and the CPU op forms that gradient for an upstream gradient of
    /// 1 (the CubeCL op forms it for a power of two near the number of
    /// rows and rounds the logits' gradient as the plain path does, see
    /// `ops::linear_cross_entropy::cube`); in bf16, 100 training steps of
    /// llama-mini with the CPU op drifted 5 % from the f32 run (the
    /// reference: 1 %; see `crates/cli/tests/cli/mixed_precision.rs`).
    pub fn linear_cross_entropy<B: KernelBackend>(
        &self,
        x: Tensor<B, 2>,
        weight: Tensor<B, 2>,
        targets: Tensor<B, 1, Int>,
    ) -> Tensor<B, 1> {
        super::linear_cross_entropy::linear_cross_entropy(
            self.head_loss,
            self.cross_entropy,
            x,
            weight,
            targets,
        )
    }
}

#[cfg(test)]
mod tests;
