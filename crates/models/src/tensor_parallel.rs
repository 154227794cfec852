//! The decoder under tensor parallelism: which parameter is split along
//! which dimension (one table for every family, since GPT-2, Llama and
//! BLOOM share the decoder's parameter names; Hugging Face's fused
//! `c_attn` / `query_key_value` are split into q, k and v on import), the
//! checks a TP degree must pass, and the cutting of a whole model into
//! this rank's part.
//!
//! Megatron-LM's layout (Shoeybi et al. 2019): q, k, v and the MLP's up
//! and gate projections are column-parallel (weights `[in, out]` cut along
//! `out`, their biases too); the attention output and the MLP's down
//! projection are row-parallel (cut along `in`; their biases are added
//! once, after the sum over ranks, so every rank holds them whole); the
//! token embedding and an untied head are cut along the vocabulary;
//! norms and learned position embeddings are replicated.

use ferrotron_engine::params::map_named_tensors;
use ferrotron_parallel::tensor::{ShardError, ShardPlan, Split, TpGroup};

use crate::config::{ConfigError, DecoderConfig};
use crate::decoder::Decoder;
use crate::ops::KernelBackend;

/// The split of every parameter of [`Decoder`], by name suffix.
pub const DECODER_SHARDS: [(&str, Split); 25] = [
    ("embed", Split::Vocab(0)),
    ("head", Split::Vocab(1)),
    ("pos_embed", Split::Replicated),
    ("attn.q.weight", Split::Even(1)),
    ("attn.q.bias", Split::Even(0)),
    ("attn.k.weight", Split::Even(1)),
    ("attn.k.bias", Split::Even(0)),
    ("attn.v.weight", Split::Even(1)),
    ("attn.v.bias", Split::Even(0)),
    ("attn.o.weight", Split::Even(0)),
    ("attn.o.bias", Split::Replicated),
    ("mlp.up.weight", Split::Even(1)),
    ("mlp.up.bias", Split::Even(0)),
    ("mlp.gate.weight", Split::Even(1)),
    ("mlp.gate.bias", Split::Even(0)),
    ("mlp.down.weight", Split::Even(0)),
    ("mlp.down.bias", Split::Replicated),
    ("attn_norm.weight", Split::Replicated),
    ("attn_norm.bias", Split::Replicated),
    ("mlp_norm.weight", Split::Replicated),
    ("mlp_norm.bias", Split::Replicated),
    ("final_norm.weight", Split::Replicated),
    ("final_norm.bias", Split::Replicated),
    ("embed_norm.weight", Split::Replicated),
    ("embed_norm.bias", Split::Replicated),
];

/// The sharding plan of a model of `config` over `tp` ranks, its
/// vocabulary padded to a multiple of `divisible_by x tp`.
///
/// # Errors
/// `tp` does not divide the attention heads, the key/value heads or the
/// MLP's hidden units (each error names both numbers).
pub fn shard_plan(
    config: &DecoderConfig,
    tp: usize,
    divisible_by: usize,
) -> Result<ShardPlan, ConfigError> {
    check_tp(config, tp)?;
    Ok(ShardPlan::new(
        &DECODER_SHARDS,
        config.vocab_size,
        tp,
        divisible_by,
    ))
}

/// Whether a model of `config` can be split over `tp` ranks (its heads
/// and MLP units divide by `tp`), in any compute precision: the TP
/// collectives carry the compute dtype (`ferrotron_parallel::tensor`).
pub fn check_tp(config: &DecoderConfig, tp: usize) -> Result<(), ConfigError> {
    let counts = [
        ("n_heads", config.n_heads, "attention heads"),
        ("n_kv_heads", config.n_kv_heads, "key/value heads"),
        ("ffn_size", config.ffn_size, "MLP hidden units"),
    ];
    for (field, n, what) in counts {
        if !n.is_multiple_of(tp) {
            return Err(ConfigError {
                field,
                problem: format!("({n} {what}) must be divisible by --tp {tp}"),
            });
        }
    }
    Ok(())
}

impl<B: KernelBackend> Decoder<B> {
    /// This rank's part of the whole model `self` under tensor parallelism
    /// over `group` with `plan` (from [`shard_plan`] for this model's
    /// config and the group's size): every parameter cut per the table,
    /// the layers computing over `group`, with sequence parallelism when
    /// the plan has it (the sequence length must then divide by the group
    /// size). Parameter ids are kept. On a group of one rank, the model
    /// itself.
    pub fn shard(self, plan: &ShardPlan, group: TpGroup) -> Result<Self, ShardError> {
        if group.size() == 1 {
            return Ok(self);
        }
        let rank = group.rank();
        let cut = map_named_tensors(self, |name, data| plan.shard(name, data, rank))?;
        let group = group.with_sequence_parallel(plan.sequence_parallel());
        Ok(cut.split_over(group, plan.vocab_shard(rank)))
    }
}
