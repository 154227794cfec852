//! The decoder-only transformer shared by GPT-2, Llama and BLOOM.

use std::cell::RefCell;
use std::sync::Arc;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Int, Tensor, TensorData};
use ferrotron_engine::lm::{CausalLm, LmUnit, LmUnits};
use ferrotron_parallel::comm::nccl::device::SharedCollectives;
use ferrotron_parallel::comm::Communicator;
use ferrotron_parallel::context::AnyBlockKernel;
use ferrotron_parallel::tensor::{
    column_input, embedding_part, gather_from_tp, row_output, vocab_parallel_cross_entropy,
    ShardError, TpGroup, VocabShard,
};

use crate::config::{ConfigError, DecoderConfig, Kernels, Position};
use crate::context_parallel::{block_kernel, device_block_kernel, ContextParallel};
use crate::init::{Init, PartSource};
use crate::layers::position::{Heads, PositionContext};
use crate::layers::{Attention, LayerKv, Mlp, Norm};
use crate::ops::{KernelBackend, OpsChoice};
use crate::part::{ModelPart, PartError};
use crate::tensor_parallel::check_tp;

/// One pre-norm transformer block: `x + attn(norm(x))`, then `x + mlp(norm(x))`.
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    /// Norm before attention.
    pub attn_norm: Norm<B>,
    /// Self-attention.
    pub attn: Attention<B>,
    /// Norm before the MLP.
    pub mlp_norm: Norm<B>,
    /// Feed-forward block.
    pub mlp: Mlp<B>,
}

impl<B: KernelBackend> Block<B> {
    /// The block applied to `x` `[batch, len, hidden]`, attending to and
    /// extending `kv` when decoding incrementally.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        pos: &PositionContext<B>,
        kv: Option<&mut Option<LayerKv<B>>>,
    ) -> Tensor<B, 3> {
        let x = x.clone() + self.attn.forward(self.attn_norm.forward(x), pos, kv);
        x.clone() + self.mlp.forward(self.mlp_norm.forward(x))
    }
}

/// Keys and values of every layer for incremental decoding.
#[derive(Clone, Debug)]
pub struct KvCache<B: Backend> {
    layers: Vec<Option<LayerKv<B>>>,
    len: usize,
}

impl<B: Backend> KvCache<B> {
    /// An empty cache for a model of `n_layers` blocks.
    pub fn new(n_layers: usize) -> Self {
        Self {
            layers: vec![None; n_layers],
            len: 0,
        }
    }

    /// Number of positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The decoder: embeddings, `n_layers` blocks, final norm and output head.
///
/// Under tensor parallelism (see [`Decoder::shard`]) each rank holds a
/// block of `vocab` rows of the embedding (and columns of the head), and
/// its share of every block's heads and MLP units.
#[derive(Module, Debug)]
pub struct Decoder<B: Backend> {
    /// Token embeddings `[vocab, hidden]` (also the head when tied).
    pub embed: Param<Tensor<B, 2>>,
    /// Learned position embeddings `[max_seq_len, hidden]` (GPT-2).
    pub pos_embed: Option<Param<Tensor<B, 2>>>,
    /// LayerNorm after the embedding (BLOOM).
    pub embed_norm: Option<Norm<B>>,
    /// The transformer blocks.
    pub layers: Vec<Block<B>>,
    /// Norm before the head.
    pub final_norm: Norm<B>,
    /// Output head `[hidden, vocab]` when not tied to `embed`.
    pub head: Option<Param<Tensor<B, 2>>>,
    #[module(skip)]
    config: DecoderConfig,
    #[module(skip)]
    ops: OpsChoice,
    #[module(skip)]
    tp: TpGroup,
    /// This rank's block of the vocabulary (all of it on one rank).
    #[module(skip)]
    vocab: VocabShard,
    /// The context-parallel ring (one rank: none; see
    /// [`Decoder::with_context_parallel`]).
    #[module(skip)]
    cp: ContextParallel,
    /// Selective recomputation of the reference attention core (see
    /// [`LmUnits::with_attention_recompute`]).
    #[module(skip)]
    recompute_attention: bool,
}

impl<B: KernelBackend> Decoder<B> {
    /// A freshly initialised model. The same `seed` gives the same weights on
    /// every backend: `N(0, init_std^2)` for matrices and embeddings, scaled by
    /// `1/sqrt(2 n_layers)` for the two residual output projections (GPT-2),
    /// zero biases, unit norm gains; each value drawn by a counter-based
    /// generator keyed by the seed, the parameter's name and the element's
    /// index (see `crate::init`), so [`Decoder::new_part`] builds any
    /// rank's part alone with the same values.
    ///
    /// The hot operations run as [`OpsChoice::resolve`] picks for `config`
    /// on `B` (see [`Decoder::ops`]).
    pub fn new(config: &DecoderConfig, seed: u64, device: &B::Device) -> Result<Self, ConfigError> {
        match Self::new_part(config, seed, device, &ModelPart::whole()) {
            Ok(model) => Ok(model),
            Err(PartError::Config(e)) => Err(e),
            Err(e) => unreachable!("a whole model on one rank cuts nothing: {e}"),
        }
    }

    /// This rank's `part` of the model [`Decoder::new`] builds with the
    /// same `config` and `seed`, built alone: its TP block of every
    /// parameter (the vocabulary padded with zero rows), its stage's
    /// units (the others one-element placeholders; the last stage also
    /// builds a tied embedding's copy), computing over the part's TP
    /// group. The same as [`Decoder::shard`] of the whole model (and
    /// `Trainer::parallel`'s placement of it), bit for bit, without ever
    /// holding more than the part.
    ///
    /// # Errors
    /// An invalid `config`, or one the TP degree cannot split.
    pub fn new_part(
        config: &DecoderConfig,
        seed: u64,
        device: &B::Device,
        part: &ModelPart,
    ) -> Result<Self, PartError> {
        let init = Init::<B>::sharded(seed, device, part.plan.clone(), part.tp.rank());
        Self::drawn(config, &init, part)
    }

    /// This rank's `part` as placeholders only (every tensor `[1; D]`),
    /// with the source of its values: the shape of each parameter of the
    /// part and any flat range of it, drawn alone, equal to the same
    /// elements of [`Decoder::new_part`]'s tensors. A ZeRO-3 rank hands
    /// both to `Trainer::parallel_from_source`, which draws only its DP
    /// pieces, so it never holds its whole part.
    ///
    /// # Errors
    /// As [`Decoder::new_part`].
    pub fn placeholder_part(
        config: &DecoderConfig,
        seed: u64,
        device: &B::Device,
        part: &ModelPart,
    ) -> Result<(Self, PartSource), PartError> {
        let specs = RefCell::new(Vec::new());
        let init = Init::<B>::sharded(seed, device, part.plan.clone(), part.tp.rank());
        let model = Self::drawn(config, &init.recording(&specs), part)?;
        Ok((model, PartSource::new(seed, specs.into_inner())))
    }

    /// `part` of the model of `config` with its values from `init`.
    fn drawn(config: &DecoderConfig, init: &Init<B>, part: &ModelPart) -> Result<Self, PartError> {
        config.validate()?;
        let tp = part.tp.size();
        check_tp(config, tp)?;
        let ops = OpsChoice::resolve::<B>(config)?;
        let c = config;
        let unit = |u: LmUnit| init.holding(part.holds(u));
        let out_std = c.init_std / (2.0 * c.n_layers as f64).sqrt();
        let norm_of = (c.norm, c.hidden_size, c.norm_eps);
        let (first, last) = (unit(LmUnit::Embedding), unit(LmUnit::Head));
        // The last stage keeps a copy of an embedding tied to the head.
        let embed_init = first
            .holding(part.holds(LmUnit::Embedding) || (c.tied_head && part.holds(LmUnit::Head)));
        let embed = embed_init.normal("embed", [c.vocab_size, c.hidden_size], c.init_std)?;
        let pos_embed = (c.position == Position::Learned)
            .then(|| first.normal("pos_embed", [c.max_seq_len, c.hidden_size], c.init_std))
            .transpose()?;
        let embed_norm = c
            .embed_norm
            .then(|| Norm::new(&first, "embed_norm", norm_of, ops))
            .transpose()?;
        let layers = (0..c.n_layers)
            .map(|i| {
                let init = unit(LmUnit::Block(i));
                let name = |sub: &str| format!("layers.{i}.{sub}");
                Ok(Block {
                    attn_norm: Norm::new(&init, &name("attn_norm"), norm_of, ops)?,
                    attn: Attention::new(&init, &name("attn"), c, out_std, ops)?,
                    mlp_norm: Norm::new(&init, &name("mlp_norm"), norm_of, ops)?,
                    mlp: Mlp::new(&init, &name("mlp"), c, out_std, ops)?,
                })
            })
            .collect::<Result<_, ShardError>>()?;
        let final_norm = Norm::new(&last, "final_norm", norm_of, ops)?;
        let head = (!c.tied_head)
            .then(|| last.normal("head", [c.hidden_size, c.vocab_size], c.init_std))
            .transpose()?;
        let model = Self {
            embed,
            pos_embed,
            embed_norm,
            layers,
            final_norm,
            head,
            config: c.clone(),
            ops,
            tp: TpGroup::single(),
            vocab: VocabShard::new(c.vocab_size, 1, 0, 1),
            cp: ContextParallel::single(),
            recompute_attention: false,
        };
        if tp == 1 {
            return Ok(model);
        }
        let vocab = part.plan.vocab_shard(part.tp.rank());
        Ok(model.split_over(part.tp.clone(), vocab))
    }

    /// The TP degree the model computes over (1: the whole model).
    pub fn tp_degree(&self) -> usize {
        self.tp.size()
    }

    /// The TP group the model computes over, as its layers hold it (with
    /// their device collectives, if any).
    pub fn tp_group(&self) -> &TpGroup {
        &self.tp
    }

    /// The model computing its training loss ([`LmUnits`], [`CausalLm`])
    /// over the context-parallel ring `ring` (the CP group): each rank
    /// takes its chunks of every sequence (`ferrotron_parallel::context`'s
    /// load-balanced split; the sequence length must divide by `2 x cp`),
    /// attends around the ring and scores its own targets, the loss
    /// summed over the ring. Logits ([`Decoder::forward`], generation)
    /// stay whole on each rank. Every rank of the ring must run the same
    /// passes.
    ///
    /// # Errors
    /// A build without the `flex` feature (whose CPU attention core
    /// computes the ring's blocks) unless the model runs the fused kernels
    /// on a GPU backend (whose attention computes them).
    pub fn with_context_parallel(self, ring: Arc<dyn Communicator>) -> Result<Self, ConfigError> {
        let fused = self.ops.attention_impl().is_fused() && B::has_fused_kernels();
        if ring.world_size() > 1 && !cfg!(feature = "flex") && !fused {
            return Err(ConfigError {
                field: "cp",
                problem: "context parallelism needs the fused kernels on a GPU backend or the \
                          flex feature (whose CPU attention core computes the ring's blocks)"
                    .into(),
            });
        }
        Ok(Self {
            cp: ContextParallel::new(ring),
            ..self
        })
    }

    /// The model whose ring ([`Decoder::with_context_parallel`]) runs on
    /// the tensors of backend `C` (the inner backend under autodiff) over
    /// `collectives`, opened over the CP group's ranks in its order: the
    /// K/V and the `dk`, `dv` sums cross the ring as device tensors
    /// (`ferrotron_parallel::context::RingAttention::with_device`), and
    /// on the fused kernels of the GPU backends each block's attention
    /// runs on them too ([`crate::context_parallel::device_block_kernel`]).
    pub fn with_ring_on_device<C: Backend>(self, collectives: SharedCollectives<C>) -> Self {
        Self {
            cp: self.cp.with_device(collectives),
            ..self
        }
    }

    /// The CP degree the model computes over (1: whole sequences).
    pub fn cp_degree(&self) -> usize {
        self.cp.size()
    }

    /// The model, whose parameters are already cut to this rank's part,
    /// computing over `tp` with vocabulary block `vocab`.
    pub(crate) fn split_over(self, tp: TpGroup, vocab: VocabShard) -> Self {
        let layers = self
            .layers
            .into_iter()
            .map(|b| Block {
                attn: b.attn.split_heads(tp.clone()),
                mlp: b.mlp.split_units(tp.clone()),
                ..b
            })
            .collect();
        Self {
            layers,
            tp,
            vocab,
            ..self
        }
    }

    /// The configuration the model was built from.
    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    /// The kernels the model runs (resolved from `config().kernels` for
    /// this backend when the model was built).
    pub fn kernels(&self) -> Kernels {
        self.ops.kernels()
    }

    /// How the model computes its hot operations, head and loss (resolved
    /// from the config for this backend when the model was built).
    pub fn ops(&self) -> OpsChoice {
        self.ops
    }

    /// The positions of `len` tokens after `start` cached ones, in the
    /// forms of the model's attention and RoPE (see [`OpsChoice::decoding`]
    /// when `cached`).
    fn positions(
        &self,
        start: usize,
        len: usize,
        cached: bool,
        device: &B::Device,
    ) -> PositionContext<B> {
        let c = &self.config;
        let ops = if cached {
            self.ops.decoding()
        } else {
            self.ops
        };
        let ops = ops.recomputed_attention(self.recompute_attention);
        let heads = self.heads();
        PositionContext::new(&c.position, &heads, c.head_dim(), start, len, &ops, device)
    }

    /// The attention heads this rank computes.
    fn heads(&self) -> Heads {
        let n = self.config.n_heads;
        let per_rank = n / self.tp.size();
        let first = self.tp.rank() * per_rank;
        Heads {
            total: n,
            range: first..first + per_rank,
        }
    }

    /// The positions of this rank's chunks of `seq`-token sequences under
    /// context parallelism, attending around the ring.
    fn ring_positions(&self, seq: usize, device: &B::Device) -> PositionContext<B> {
        let c = &self.config;
        let slopes = (c.position == Position::Alibi).then(|| self.heads().alibi_slopes());
        let attention = self.ops.attention_impl();
        let on_device = if self.cp.on_device() {
            device_block_kernel::<B>(attention, device, c.head_dim(), slopes.clone())
        } else {
            AnyBlockKernel::none()
        };
        let kernel = block_kernel::<B>(attention, device, c.head_dim(), slopes);
        let ring = self.cp.ring(seq, kernel, on_device);
        let at = self.cp.positions(seq);
        PositionContext::ring(&c.position, c.head_dim(), &at, ring, &self.ops, device)
    }

    /// Logits `[batch, seq, vocab]`, f32, for token ids `[batch, seq]` (under
    /// tensor parallelism gathered from every rank's vocabulary block; the
    /// loss never gathers them).
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.forward_from(tokens, 0, None)
    }

    /// Logits `[batch, len, vocab]` for `len` new tokens, attending to and
    /// extending `cache`.
    pub fn forward_cached(
        &self,
        tokens: Tensor<B, 2, Int>,
        cache: &mut KvCache<B>,
    ) -> Tensor<B, 3> {
        let start = cache.len;
        cache.len += tokens.dims()[1];
        self.forward_from(tokens, start, Some(cache))
    }

    fn forward_from(
        &self,
        tokens: Tensor<B, 2, Int>,
        start: usize,
        mut cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        let t = tokens.dims()[1];
        let device = tokens.device();
        let mut x = self.embed_from(tokens, start, None);
        let pos = self.positions(start, t, cache.is_some(), &device);
        for (i, layer) in self.layers.iter().enumerate() {
            let kv = cache.as_mut().map(|c| &mut c.layers[i]);
            x = layer.forward(x, &pos, kv);
        }
        self.whole_logits(self.head_logits(x).cast(FloatDType::F32))
    }

    /// Logits `[batch, len, vocab]` from this rank's block `[batch, len,
    /// vocab block]`: every rank's block side by side, padding dropped.
    fn whole_logits(&self, block: Tensor<B, 3>) -> Tensor<B, 3> {
        if self.tp.size() == 1 {
            return block;
        }
        gather_from_tp(block, &self.tp).narrow(2, 0, self.vocab.vocab)
    }

    /// Mean cross-entropy (nats, `[1]`) of the last block's output `x`
    /// `[batch, len, hidden]` against `targets` `[batch, len]`: final norm,
    /// then on one rank the head and the loss as the model's ops compute
    /// them; under TP the vocabulary-parallel form over this rank's block
    /// of the logits.
    fn loss_of(&self, x: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        if self.tp.size() == 1 {
            let x = self.final_norm.forward(x);
            let [b, t, h] = x.dims();
            let rows = x.reshape([b * t, h]);
            let targets = targets.reshape([b * t]);
            return self
                .ops
                .linear_cross_entropy(rows, self.head_weight(), targets);
        }
        let logits = self.head_logits(x);
        let [b, t, len] = logits.dims();
        vocab_parallel_cross_entropy(
            logits.reshape([b * t, len]),
            targets.reshape([b * t]),
            &self.vocab,
            &self.tp,
        )
    }

    /// Hidden states `[batch, len, hidden]` of `tokens` `[batch, len]` at
    /// positions `start..start+len` (under context parallelism at the
    /// global positions `at`, `len` of them): token (and position)
    /// embeddings, then the embedding norm (BLOOM), in the config's compute
    /// precision (every later layer computes in the dtype of its input).
    /// Under sequence parallelism this rank's block of the positions,
    /// `[batch, len / tp, hidden]`.
    fn embed_from(
        &self,
        tokens: Tensor<B, 2, Int>,
        start: usize,
        at: Option<&[usize]>,
    ) -> Tensor<B, 3> {
        let c = &self.config;
        let [b, t] = tokens.dims();
        let end = at.map_or(start + t, |at| at.iter().max().map_or(0, |p| p + 1));
        assert!(
            end <= c.max_seq_len,
            "sequence of {end} tokens exceeds max_seq_len {}",
            c.max_seq_len
        );
        let flat = tokens.reshape([b * t]);
        let rows = if self.tp.size() == 1 {
            self.ops.embedding(self.embed.val(), flat)
        } else {
            embedding_part(self.embed.val(), flat, &self.vocab)
        };
        // The residual stream runs in the compute precision from here on.
        let mut x =
            row_output(rows.reshape([b, t, c.hidden_size]), &self.tp).cast(c.precision.dtype());
        let len = x.dims()[1];
        if let Some(pe) = &self.pos_embed {
            // This rank's positions: all of them, or its block under SP.
            let block = if self.tp.sequence_parallel() {
                self.tp.rank() * len
            } else {
                0
            };
            let rows = match at {
                None => pe.val().narrow(0, start + block, len),
                Some(at) => {
                    let mine: Vec<i64> = at[block..block + len].iter().map(|&p| p as i64).collect();
                    let mine = TensorData::new(mine, [len]);
                    pe.val()
                        .select(0, Tensor::<B, 1, Int>::from_data(mine, &x.device()))
                }
            };
            x = x.clone() + rows.cast(x.dtype()).unsqueeze::<3>();
        }
        if let Some(n) = &self.embed_norm {
            x = n.forward(x);
        }
        x
    }

    /// This rank's block of the logits, `[batch, len, vocab block]` (all
    /// of `vocab` on one rank), of the last block's output `x` `[batch,
    /// len, hidden]`: final norm, then the (column-parallel) head, in `x`'s
    /// dtype (the loss casts them to f32).
    fn head_logits(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let c = &self.config;
        let x = column_input(self.final_norm.forward(x), &self.tp);
        let [b, t, _] = x.dims();
        let x = x.reshape([b * t, c.hidden_size]);
        let dtype = x.dtype();
        x.matmul(self.head_weight().cast(dtype))
            .reshape([b, t, self.vocab.len])
    }

    /// The head `[hidden, vocab block]`: its own matrix, or the embedding
    /// transposed when tied.
    fn head_weight(&self) -> Tensor<B, 2> {
        match &self.head {
            Some(h) => h.val(),
            None => self.embed.val().transpose(),
        }
    }
}

impl<B: KernelBackend> CausalLm<B> for Decoder<B> {
    fn loss(&self, inputs: Tensor<B, 2, Int>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        let (x, context) = self.embed(inputs);
        let x = (0..self.layers.len()).fold(x, |x, i| self.block(i, x, &context));
        self.head_loss(x, targets)
    }
}

impl<B: KernelBackend> LmUnits<B> for Decoder<B> {
    type Context = PositionContext<B>;

    fn num_blocks(&self) -> usize {
        self.layers.len()
    }

    fn embed(&self, inputs: Tensor<B, 2, Int>) -> (Tensor<B, 3>, PositionContext<B>) {
        let seq = inputs.dims()[1];
        let pos = self.block_context(seq, &inputs.device());
        if self.cp.size() == 1 {
            return (self.embed_from(inputs, 0, None), pos);
        }
        let at = self.cp.positions(seq);
        (self.embed_from(self.cp.split(inputs), 0, Some(&at)), pos)
    }

    fn block_context(&self, seq_len: usize, device: &B::Device) -> PositionContext<B> {
        if self.cp.size() > 1 {
            return self.ring_positions(seq_len, device);
        }
        self.positions(0, seq_len, false, device)
    }

    fn hidden_dims(&self, batch: usize, seq_len: usize) -> [usize; 3] {
        let seq_len = seq_len / self.cp.size();
        let len = if self.tp.sequence_parallel() {
            seq_len / self.tp.size()
        } else {
            seq_len
        };
        [batch, len, self.config.hidden_size]
    }

    fn hidden_dtype(&self) -> FloatDType {
        self.config.precision.dtype()
    }

    fn block(&self, index: usize, x: Tensor<B, 3>, context: &PositionContext<B>) -> Tensor<B, 3> {
        self.layers[index].forward(x, context, None)
    }

    fn head_loss(&self, x: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        if self.cp.size() == 1 {
            return self.loss_of(x, targets);
        }
        let targets = self.cp.split(targets);
        let local = self.loss_of(x, targets.clone());
        self.cp.loss(local, &targets)
    }

    fn with_attention_recompute(self, on: bool) -> Self {
        Self {
            recompute_attention: on,
            ..self
        }
    }

    fn visit_unit<V: ModuleVisitor<B>>(&self, unit: LmUnit, visitor: &mut V) {
        match unit {
            LmUnit::Embedding => {
                self.embed.visit(visitor);
                self.pos_embed.visit(visitor);
                self.embed_norm.visit(visitor);
            }
            LmUnit::Block(i) => self.layers[i].visit(visitor),
            LmUnit::Head => {
                self.final_norm.visit(visitor);
                self.head.visit(visitor);
            }
        }
    }

    fn visit_tied<V: ModuleVisitor<B>>(&self, visitor: &mut V) {
        if self.head.is_none() {
            self.embed.visit(visitor);
        }
    }
}
