//! The contract between a model and the training code.

use burn::module::{Module, ModuleVisitor};
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Int, Tensor};

/// A causal language model that can score next-token predictions.
pub trait CausalLm<B: Backend>: Module<B> {
    /// Mean next-token cross-entropy in nats over all `batch * seq` positions.
    ///
    /// `inputs` and `targets` are token ids of shape `[batch, seq]`; `targets`
    /// are `inputs` shifted left by one token. Returns a tensor of shape `[1]`.
    fn loss(&self, inputs: Tensor<B, 2, Int>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1>;
}

/// One unit of a causal LM: the pieces that ZeRO-3 / FSDP gathers one at a
/// time and that a pipeline places on its stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LmUnit {
    /// Token (and position) embeddings and anything applied before the
    /// first block (BLOOM's embedding norm). Owns a tied embedding.
    Embedding,
    /// Transformer block `i`, `0..num_blocks`.
    Block(usize),
    /// The final norm and the output head (when not tied to the embedding).
    Head,
}

impl LmUnit {
    /// Every unit of a model with `blocks` blocks, in forward order:
    /// embedding, blocks `0..blocks`, head.
    pub fn all(blocks: usize) -> Vec<LmUnit> {
        std::iter::once(LmUnit::Embedding)
            .chain((0..blocks).map(LmUnit::Block))
            .chain(std::iter::once(LmUnit::Head))
            .collect()
    }

    /// The unit's place in [`LmUnit::all`] for a model of `blocks` blocks.
    pub fn index(self, blocks: usize) -> usize {
        match self {
            LmUnit::Embedding => 0,
            LmUnit::Block(i) => i + 1,
            LmUnit::Head => blocks + 1,
        }
    }
}

/// A causal LM that can run its forward pass one unit at a time, so that
/// ZeRO-3 can gather the parameters of one unit just before it runs and
/// free them right after (FSDP's units), and a pipeline can run a range
/// of units.
///
/// Composing the pieces must give exactly [`CausalLm::loss`]:
/// `head_loss(block(n-1, ... block(0, embed(inputs).0) ...), targets)`.
pub trait LmUnits<B: Backend>: CausalLm<B> {
    /// What the blocks need besides the hidden states (positions, masks),
    /// built once per forward pass by [`LmUnits::embed`].
    type Context;

    /// Number of transformer blocks.
    fn num_blocks(&self) -> usize;

    /// Hidden states `[batch, seq, hidden]` of token ids `inputs`
    /// `[batch, seq]` (the [`LmUnit::Embedding`] parameters), and the
    /// blocks' context.
    fn embed(&self, inputs: Tensor<B, 2, Int>) -> (Tensor<B, 3>, Self::Context);

    /// The blocks' context for token ids of shape `[batch, seq_len]`
    /// without running the embedding (what a pipeline stage that does not
    /// hold the embedding needs); the same as [`LmUnits::embed`]'s.
    fn block_context(&self, seq_len: usize, device: &B::Device) -> Self::Context;

    /// Shape of the hidden states between blocks for token ids of shape
    /// `[batch, seq_len]`: `[batch, seq_len, hidden]`, or this rank's block
    /// of the positions under sequence parallelism (what a pipeline stage
    /// receives).
    fn hidden_dims(&self, batch: usize, seq_len: usize) -> [usize; 3];

    /// The dtype of the hidden states between blocks: the model's compute
    /// dtype (f32, or bf16/f16 under mixed precision). A pipeline stage
    /// receives its input as host f32 values and casts them to it.
    fn hidden_dtype(&self) -> FloatDType;

    /// Block `index` applied to hidden states `x` `[batch, seq, hidden]`
    /// (uses that block's parameters only).
    fn block(&self, index: usize, x: Tensor<B, 3>, context: &Self::Context) -> Tensor<B, 3>;

    /// Mean next-token cross-entropy (nats, shape `[1]`) of the last block's
    /// output `x` against `targets` `[batch, seq]` (the [`LmUnit::Head`]
    /// parameters, and a tied embedding).
    fn head_loss(&self, x: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1>;

    /// The model with its attention core (`softmax(q k^T / sqrt(d) + bias)
    /// v`: scores, softmax, weighted sum of the values) recomputed in
    /// backward from `q`, `k` and `v` when `on`, instead of keeping its
    /// `[batch, heads, seq, seq]` intermediates: selective recomputation
    /// (Korthikanti et al. 2022, Sec. 5). The forward values are the same,
    /// the gradients the same up to the order of floating-point sums.
    /// Without autodiff it changes nothing.
    fn with_attention_recompute(self, on: bool) -> Self;

    /// Visits the parameters of `unit` only; every parameter of the model
    /// belongs to exactly one unit.
    fn visit_unit<V: ModuleVisitor<B>>(&self, unit: LmUnit, visitor: &mut V);

    /// Visits the parameters that [`LmUnits::head_loss`] uses but another
    /// unit owns: a token embedding tied to the head (none when untied). A
    /// pipeline's last stage keeps a copy of them.
    fn visit_tied<V: ModuleVisitor<B>>(&self, visitor: &mut V);
}
