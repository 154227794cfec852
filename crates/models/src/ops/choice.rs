//! The one value that says how a model computes its hot operations,
//! resolved once when the model is built from the backend and the config
//! and handed to every layer. A new fused operation (CubeCL or CPU) is one
//! more case here; the layers only call the methods.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, FloatDType, Int, Tensor, TensorPrimitive};
use ferrotron_engine::precision::Precision;

use super::fused::KernelBackend;
use super::{cross_entropy, layer_norm, resolve_kernels};
use super::{rms_norm, swiglu};

use crate::config::{ConfigError, DecoderConfig, Kernels};
use crate::layers::gelu_tanh;

/// A float primitive as a tensor of rank `D`.
fn float<B: KernelBackend, const D: usize>(p: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

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

/// The implementation of every hot operation of a model: attention, RoPE,
/// the norms, SwiGLU (through [`Kernels`]), the head with its loss
/// ([`HeadLoss`]), and whether GELU, SwiGLU, the norms and RoPE run as
/// Ferrotron's CPU operations ([`OpsChoice::cpu_elementwise`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpsChoice {
    kernels: Kernels,
    head_loss: HeadLoss,
    host_attention: bool,
    cpu_elementwise: bool,
}

impl From<Kernels> for OpsChoice {
    /// `kernels` for every operation, the head through the whole logits.
    fn from(kernels: Kernels) -> Self {
        Self {
            kernels,
            head_loss: HeadLoss::Logits,
            host_attention: false,
            cpu_elementwise: false,
        }
    }
}

impl OpsChoice {
    /// The plain Burn reference of every operation (runs on every backend).
    pub fn reference() -> Self {
        Kernels::Reference.into()
    }

    /// What a model of `config` runs on backend `B`: the kernels of
    /// [`resolve_kernels`]; the head and loss chunked with the fused
    /// kernels (the CubeCL backends, every precision); where
    /// `config.kernels` is absent and the backend has no fused kernels (the
    /// CPU backends), the head and loss chunked when the model computes in
    /// f32, the attention core as the backend's host-buffer operation where
    /// it has one (flex), and GELU, SwiGLU, the norms and RoPE as the
    /// backend's CPU operations ([`KernelBackend::cpu_gelu_tanh`] and the
    /// others: Ferrotron's own on flex, the reference elsewhere) when the
    /// model computes in f32. An explicit `kernels = "reference"` keeps the
    /// plain logits path and Burn's operations.
    ///
    /// Errors as [`resolve_kernels`].
    pub fn resolve<B: KernelBackend>(config: &DecoderConfig) -> Result<Self, ConfigError> {
        let kernels = resolve_kernels::<B>(config)?;
        let cpu = config.kernels.is_none() && !B::has_fused_kernels();
        let f32_model = config.precision == Precision::Fp32;
        Ok(Self {
            kernels,
            host_attention: cpu && B::has_host_attention(),
            head_loss: HeadLoss::choose(config, kernels, B::has_fused_kernels()),
            // The norms compute in f32 in every precision; a bf16 or f16
            // model keeps Burn's operations throughout, as its head does.
            cpu_elementwise: cpu && f32_model,
        })
    }

    /// The kernels of attention, RoPE, the norms, SwiGLU and the logits'
    /// cross-entropy.
    pub fn kernels(&self) -> Kernels {
        self.kernels
    }

    /// How the head and the loss are computed.
    pub fn head_loss(&self) -> HeadLoss {
        self.head_loss
    }

    /// Whether every layer's attention core runs on the backend's host
    /// buffers (flex) as one node that keeps only `q`, `k`, `v` and
    /// recomputes the probabilities in backward
    /// ([`KernelBackend::host_attention`]), whatever `--recompute` says.
    pub fn host_attention(&self) -> bool {
        self.host_attention
    }

    /// Whether GELU, SwiGLU, the norms and RoPE call the backend's CPU
    /// operations ([`KernelBackend::cpu_gelu_tanh`],
    /// [`KernelBackend::cpu_swiglu`], [`KernelBackend::cpu_rms_norm`],
    /// [`KernelBackend::cpu_layer_norm`], and [`KernelBackend::cpu_rope`]
    /// through the position context's [`crate::ops::Rope::Host`]).
    pub fn cpu_elementwise(&self) -> bool {
        self.cpu_elementwise
    }

    /// Whether attention and RoPE take the fused kernels' position form
    /// (tables built on the host, see `layers::position`).
    pub fn fused_positions(&self) -> bool {
        self.kernels == Kernels::Fused
    }

    /// GELU-tanh of `x` `[batch, seq, n]` (see [`crate::layers::gelu_tanh`]).
    pub fn gelu_tanh<B: KernelBackend>(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        if self.cpu_elementwise {
            float(B::cpu_gelu_tanh(x.into_primitive().tensor()))
        } else {
            gelu_tanh(x)
        }
    }

    /// `silu(gate) * up` of `[batch, seq, n]` tensors (see
    /// [`super::swiglu`]).
    pub fn swiglu<B: KernelBackend>(&self, gate: Tensor<B, 3>, up: Tensor<B, 3>) -> Tensor<B, 3> {
        if self.cpu_elementwise {
            float(B::cpu_swiglu(
                gate.into_primitive().tensor(),
                up.into_primitive().tensor(),
            ))
        } else {
            swiglu(self.kernels, gate, up)
        }
    }

    /// RMSNorm of f32 `x` `[batch, seq, hidden]` (see [`super::rms_norm`]).
    pub fn rms_norm<B: KernelBackend>(
        &self,
        x: Tensor<B, 3>,
        weight: Tensor<B, 1>,
        eps: f64,
    ) -> Tensor<B, 3> {
        if self.cpu_elementwise {
            float(B::cpu_rms_norm(
                x.into_primitive().tensor(),
                weight.into_primitive().tensor(),
                eps,
            ))
        } else {
            rms_norm(self.kernels, x, weight, eps)
        }
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
        if self.cpu_elementwise {
            float(B::cpu_layer_norm(
                x.into_primitive().tensor(),
                weight.into_primitive().tensor(),
                bias.into_primitive().tensor(),
                eps,
            ))
        } else {
            layer_norm(self.kernels, x, weight, bias, eps)
        }
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
    /// `ops::linear_cross_entropy_cube`); in bf16, 100 training steps of
    /// llama-mini with the CPU op drifted 5 % from the f32 run (the
    /// reference: 1 %; see `crates/cli/tests/cli/mixed_precision.rs`).
    pub fn linear_cross_entropy<B: KernelBackend>(
        &self,
        x: Tensor<B, 2>,
        weight: Tensor<B, 2>,
        targets: Tensor<B, 1, Int>,
    ) -> Tensor<B, 1> {
        let weight = weight.cast(x.dtype());
        match self.head_loss {
            HeadLoss::Chunked if B::has_fused_kernels() || x.dtype() == DType::F32 => {
                Tensor::from_primitive(TensorPrimitive::Float(B::chunked_linear_cross_entropy(
                    x.into_primitive().tensor(),
                    weight.into_primitive().tensor(),
                    targets.into_primitive(),
                )))
            }
            _ => {
                let [rows, _] = x.dims();
                let logits = x.matmul(weight).cast(FloatDType::F32);
                let vocab = logits.dims()[1];
                cross_entropy(
                    self.kernels,
                    logits.reshape([1, rows, vocab]),
                    targets.reshape([1, rows]),
                )
            }
        }
    }
}
