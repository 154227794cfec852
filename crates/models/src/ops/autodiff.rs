//! [`KernelBackend`] for the autodiff backend over a backend with fused
//! kernels: each fused forward becomes one graph node whose backward is the
//! kernels' own backward. Nodes keep their inputs (and what the forward
//! returned for the backward: log-sum-exp, norm statistics, the
//! cross-entropy gradient) as state; nothing is recomputed by autodiff.

use std::sync::Arc;

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::Autodiff;
use burn::tensor::ops::{FloatTensor, IntTensor};
use ferrotron_kernels::attention::AttentionOptions;
use ferrotron_parallel::context::{AnyBlockKernel, BlockAttention};

use super::attention::recompute::Core;
use super::fused::{FusedKernels, KernelBackend};

impl<B: FusedKernels, C: CheckpointStrategy> KernelBackend for Autodiff<B, C> {
    fn has_fused_kernels() -> bool {
        true
    }

    fn ring_block_attention(
        device: &Self::Device,
        head_dim: usize,
        slopes: Option<Vec<f32>>,
    ) -> Option<Arc<dyn BlockAttention + Send>> {
        B::ring_block_attention(device, head_dim, slopes)
    }

    fn ring_block_attention_on_device(
        device: &Self::Device,
        head_dim: usize,
        slopes: Option<Vec<f32>>,
    ) -> AnyBlockKernel {
        B::ring_block_attention_on_device(device, head_dim, slopes)
    }

    fn recomputed_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        super::attention::recompute::node::<B, C>(q, k, v, bias, Core::Reference)
    }

    fn chunked_linear_cross_entropy(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        super::linear_cross_entropy::node::autodiff_node::<B, C>(x, weight, targets)
    }

    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        slopes: Option<FloatTensor<Self>>,
        options: AttentionOptions,
    ) -> FloatTensor<Self> {
        super::attention::cube::node::<B, C>(q, k, v, slopes, options)
    }

    fn fused_bias_add(y: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self> {
        super::bias::cube::node::<B, C>(y, bias)
    }

    fn fused_embedding(table: FloatTensor<Self>, ids: IntTensor<Self>) -> FloatTensor<Self> {
        super::embedding::cube::node::<B, C>(table, ids)
    }

    fn fused_gelu_tanh(x: FloatTensor<Self>) -> FloatTensor<Self> {
        super::gelu::cube::node::<B, C>(x)
    }

    fn fused_swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        super::swiglu::cube::node::<B, C>(gate, up)
    }

    fn fused_rms_norm(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        eps: f32,
    ) -> FloatTensor<Self> {
        super::norm::cube::rms_node::<B, C>(x, weight, eps)
    }

    fn fused_layer_norm(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        eps: f32,
    ) -> FloatTensor<Self> {
        super::norm::cube::layer_node::<B, C>(x, weight, bias, eps)
    }

    fn fused_rope(x: FloatTensor<Self>, inv_freq: FloatTensor<Self>) -> FloatTensor<Self> {
        super::rope::cube::node::<B, C>(x, inv_freq)
    }

    fn fused_cross_entropy(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        super::cross_entropy::cube::node::<B, C>(logits, targets)
    }
}
