//! The model as the planner sees it: a decoder's shape, its tensors unit by
//! unit (as `crates/models`' decoder visits them), and its FLOPs per token.

use serde::Serialize;

/// Shape and family switches of a decoder-only transformer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelShape {
    /// Vocabulary size `V`.
    pub vocab: usize,
    /// Width of the residual stream `h`.
    pub hidden: usize,
    /// Transformer blocks `l`.
    pub layers: usize,
    /// Query heads `a`.
    pub heads: usize,
    /// Key/value heads (`heads` for multi-head attention).
    pub kv_heads: usize,
    /// Inner width of the MLP `f`.
    pub ffn: usize,
    /// Rows of a learned position embedding (GPT-2), if any.
    pub learned_positions: Option<usize>,
    /// LayerNorm (gain and bias) rather than RMSNorm (gain only).
    pub layer_norm: bool,
    /// Linear layers carry biases.
    pub bias: bool,
    /// SwiGLU MLP (gate, up, down) rather than GELU (up, down).
    pub gated_mlp: bool,
    /// The head reuses the token embedding.
    pub tied_head: bool,
    /// A norm follows the embedding (BLOOM).
    pub embed_norm: bool,
}

impl ModelShape {
    /// A GPT-3-style model (Megatron's GPT: learned positions of `seq`
    /// rows, LayerNorm, biases, GELU MLP of `4h`, tied head), the shape of
    /// the published configurations the planner is checked against.
    pub fn gpt(vocab: usize, hidden: usize, layers: usize, heads: usize, seq: usize) -> Self {
        Self {
            vocab,
            hidden,
            layers,
            heads,
            kv_heads: heads,
            ffn: 4 * hidden,
            learned_positions: Some(seq),
            layer_norm: true,
            bias: true,
            gated_mlp: false,
            tied_head: true,
            embed_norm: false,
        }
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Width of the key (or value) projection, `kv_heads x head_dim`.
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim()
    }

    fn norm(&self, out: &mut Vec<usize>) {
        out.push(self.hidden);
        if self.layer_norm {
            out.push(self.hidden);
        }
    }

    /// A linear layer `inp -> outp` on one of `tp` ranks: column-parallel
    /// splits the output (and bias), row-parallel the input (bias whole).
    fn linear(&self, out: &mut Vec<usize>, inp: usize, outp: usize, tp: usize, column: bool) {
        if column {
            out.push(inp * outp / tp);
            if self.bias {
                out.push(outp / tp);
            }
        } else {
            out.push(inp / tp * outp);
            if self.bias {
                out.push(outp);
            }
        }
    }

    /// Elements of every tensor of one block on one of `tp` ranks, in the
    /// decoder's visiting order (attention norm, q, k, v, o, MLP norm, up,
    /// gate, down; each linear's weight then bias).
    pub fn block_tensors(&self, tp: usize) -> Vec<usize> {
        let (h, kv, f) = (self.hidden, self.kv_width(), self.ffn);
        let mut t = Vec::new();
        self.norm(&mut t);
        self.linear(&mut t, h, h, tp, true);
        self.linear(&mut t, h, kv, tp, true);
        self.linear(&mut t, h, kv, tp, true);
        self.linear(&mut t, h, h, tp, false);
        self.norm(&mut t);
        self.linear(&mut t, h, f, tp, true);
        if self.gated_mlp {
            self.linear(&mut t, h, f, tp, true);
        }
        self.linear(&mut t, f, h, tp, false);
        t
    }

    /// The embedding unit's tensors on one of `tp` ranks (token embedding
    /// split over the vocabulary, position embedding, embedding norm).
    pub fn embedding_tensors(&self, tp: usize) -> Vec<usize> {
        let mut t = vec![self.vocab.div_ceil(tp) * self.hidden];
        if let Some(rows) = self.learned_positions {
            t.push(rows * self.hidden);
        }
        if self.embed_norm {
            self.norm(&mut t);
        }
        t
    }

    /// The head unit's tensors on one of `tp` ranks: the final norm and an
    /// untied head; `copy_tied` adds the copy of a tied embedding that a
    /// last pipeline stage holds (Megatron).
    pub fn head_tensors(&self, tp: usize, copy_tied: bool) -> Vec<usize> {
        let mut t = Vec::new();
        self.norm(&mut t);
        if !self.tied_head || copy_tied {
            t.push(self.hidden * self.vocab.div_ceil(tp));
        }
        t
    }

    /// Every parameter, a tied head counted once.
    pub fn num_params(&self) -> usize {
        let blocks: usize = self.block_tensors(1).iter().sum();
        self.embedding_tensors(1).iter().sum::<usize>()
            + self.layers * blocks
            + self.head_tensors(1, false).iter().sum::<usize>()
    }

    /// Weights one token multiplies in one block's matmuls.
    pub fn block_matmul_params(&self) -> f64 {
        let (h, kv, f) = (self.hidden as f64, self.kv_width() as f64, self.ffn as f64);
        let mats = if self.gated_mlp { 3.0 } else { 2.0 };
        2.0 * h * h + 2.0 * h * kv + mats * h * f
    }

    /// Model FLOPs of one token in one block, forward and backward, at
    /// sequence length `seq`: `6 x` the block's matmul weights plus
    /// `12 s h` for attention scores and values. For GPT shapes, `l` blocks
    /// plus [`ModelShape::head_flops_per_token`] are Megatron's
    /// `72 B s l h^2 (1 + s/6h + V/12lh)` over the `B s` tokens.
    pub fn block_flops_per_token(&self, seq: usize) -> f64 {
        6.0 * self.block_matmul_params() + 12.0 * (seq * self.hidden) as f64
    }

    /// FLOPs of one token in the head's matmul, forward and backward: `6 h V`.
    pub fn head_flops_per_token(&self) -> f64 {
        6.0 * (self.hidden * self.vocab) as f64
    }

    /// Model FLOPs per token of a training step (no recomputation).
    pub fn train_flops_per_token(&self, seq: usize) -> f64 {
        self.layers as f64 * self.block_flops_per_token(seq) + self.head_flops_per_token()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt3_175b_has_175b_parameters_and_megatrons_flops() {
        // Brown et al. 2020, Table 2.1: 96 layers, d_model 12288, 96 heads.
        let m = ModelShape::gpt(51200, 12288, 96, 96, 2048);
        let p = m.num_params() as f64;
        assert!((p / 175e9 - 1.0).abs() < 0.01, "{p}");
        let (b, s, l, h, v) = (1.0, 2048.0, 96.0, 12288.0, 51200.0);
        let megatron = 72.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * l * h));
        let ours = m.train_flops_per_token(2048) * s;
        assert!(
            (ours / megatron - 1.0).abs() < 1e-12,
            "{ours} vs {megatron}"
        );
    }

    #[test]
    fn tensor_parallel_ranks_hold_their_share_plus_replicated_norms_and_biases() {
        let m = ModelShape::gpt(1000, 64, 2, 4, 32);
        let whole: usize = m.block_tensors(1).iter().sum();
        let part: usize = m.block_tensors(2).iter().sum();
        // Replicated: 2 LayerNorms (2h each), o and down biases (h each).
        let replicated = 4 * 64 + 2 * 64;
        assert_eq!(2 * part - replicated, whole);
    }
}
