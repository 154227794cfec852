//! The contract between a model and the training code.

use burn::module::Module;
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
