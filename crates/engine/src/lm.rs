//! The contract between a model and the training code.

use burn::module::{Module, ModuleVisitor};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

/// A causal language model that can score next-token predictions.
pub trait CausalLm<B: Backend>: Module<B> {
    /// Mean next-token cross-entropy in nats over all `batch * seq` positions.
    ///
    /// `inputs` and `targets` are token ids of shape `[batch, seq]`; `targets`
    /// are `inputs` shifted left by one token. Returns a tensor of shape `[1]`.
    fn loss(&self, inputs: Tensor<B, 2, Int>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1>;
}

/// A causal LM that can run its forward pass one unit at a time, so that
/// ZeRO-3 can gather the parameters of one unit just before it runs and
/// free them right after (FSDP's units).
///
/// The units are the root (every parameter outside the blocks: embeddings,
/// norms outside the blocks, head) and the blocks `0..num_blocks()`.
/// Composing the pieces must give exactly [`CausalLm::loss`]:
/// `head_loss(block(n-1, ... block(0, embed(inputs).0) ...), targets)`.
pub trait StagedLm<B: Backend>: CausalLm<B> {
    /// What the blocks need besides the hidden states (positions, masks),
    /// built once per forward pass by [`StagedLm::embed`].
    type Context;

    /// Number of transformer blocks.
    fn num_blocks(&self) -> usize;

    /// Hidden states `[batch, seq, hidden]` of token ids `inputs`
    /// `[batch, seq]` (uses root parameters only), and the blocks' context.
    fn embed(&self, inputs: Tensor<B, 2, Int>) -> (Tensor<B, 3>, Self::Context);

    /// Block `index` applied to hidden states `x` `[batch, seq, hidden]`
    /// (uses that block's parameters only).
    fn block(&self, index: usize, x: Tensor<B, 3>, context: &Self::Context) -> Tensor<B, 3>;

    /// Mean next-token cross-entropy (nats, shape `[1]`) of the last block's
    /// output `x` against `targets` `[batch, seq]` (root parameters only).
    fn head_loss(&self, x: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1>;

    /// Visits the parameters of block `index` only.
    fn visit_block<V: ModuleVisitor<B>>(&self, index: usize, visitor: &mut V);
}
