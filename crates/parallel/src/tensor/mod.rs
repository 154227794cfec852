//! Tensor parallelism, Megatron-LM style (Shoeybi et al. 2019): the
//! attention heads and the MLP's hidden units are split over the ranks of
//! the TP group, as are the vocabulary rows of the embedding and the head.
//!
//! - [`ops`]: the communication operators `f` ([`copy_to_tp`]) and `g`
//!   ([`reduce_from_tp`]) as autodiff operations on every backend
//!   ([`TpOps`]), and [`gather_from_tp`].
//! - [`vocab`]: the vocabulary-parallel embedding and cross-entropy.
//! - [`PartialGrads`]: the sum over the group of the gradients that
//!   sequence parallelism leaves partial.
//! - [`plan`]: which parameter is split along which dimension ([`Split`],
//!   a table the model declares), and the cutting and joining of whole
//!   tensors for checkpoints ([`ShardPlan`]).
//!
//! The model code stays single-device apart from where these operators
//! stand (as in Megatron-Core's model spec); the trainer learns from the
//! [`ShardPlan`] which gradients are replicated (for the global norm) and
//! how to join a checkpoint.

mod collective;
mod group;
pub mod ops;
mod partial;
pub mod plan;
pub mod vocab;

#[cfg(all(test, feature = "flex"))]
mod dtype_tests;

pub use group::TpGroup;
pub use ops::{
    column_input, copy_to_tp, gather_from_sp, gather_from_tp, reduce_from_tp, row_output,
    scatter_to_sp, TpOps,
};
pub use partial::PartialGrads;
pub use plan::{ShardError, ShardPlan, Split};
pub use vocab::{
    embedding_part, padded_vocab, vocab_parallel_cross_entropy, VocabShard,
    DEFAULT_VOCAB_DIVISIBLE_BY,
};
