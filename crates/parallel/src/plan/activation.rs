//! Activation memory per GPU, after Korthikanti et al. 2022, "Reducing
//! Activation Recomputation in Large Transformer Models", Sec. 4.
//!
//! Their per-layer count for a GPT layer with 2-byte activations and 1-byte
//! dropout masks is `sbh (34 + 5as/h)` bytes (Eq. 1); with tensor
//! parallelism `sbh (10 + 24/t + 5as/(ht))` (Eq. 2), with sequence
//! parallelism too `sbh (34/t + 5as/(ht))` (Eq. 3); selective
//! recomputation drops the `5as/h` term, full recomputation keeps only each
//! layer's input, `2sbh` (Table 2). Here the same terms are kept one by one
//! (Sec. 4.1) so that the element size, the absence of dropout (Ferrotron
//! has none), grouped-query attention and a SwiGLU MLP change only their
//! own terms; a GPT shape with bf16 and dropout gives the paper's formulas
//! exactly (tested).
//!
//! Input and output layers (Sec. 4.3): the embedding's dropout mask on the
//! first stage, and on the last the final norm's and the head's inputs and
//! the logits the cross-entropy keeps in fp32, `4 s b V / t`. Ferrotron's
//! trainer runs the head and the loss in blocks of rows where TP is 1
//! (`ferrotron_models::ops::HeadLoss::Chunked`, its default on the GPU
//! backends and on the CPU in f32): its forward forms the head's gradients
//! and keeps them instead of the logits, `d_x` in the activations' type
//! (`e s b h`, where the head's input was) and `d_w` in f32, `4 h V`; the
//! one block of logits it works on at a time is not kept.
//!
//! Context parallelism (a ring of `c` ranks, `ferrotron_parallel::context`)
//! gives each rank `s / c` tokens of every sequence, so every term above
//! is counted for `s / c` tokens. The ring's attention node keeps no
//! probabilities (it merges blocks by their log-sum-exp and recomputes
//! them in backward), so under `c > 1` the `a s^2 b` scores term is
//! dropped; the node keeps, besides `q`, `k` and `v`, f32 host copies of
//! its output and log-sum-exp, `4 (s/c) b (h + a) / t` bytes per layer.
//!
//! Micro-batches in flight on the first pipeline stage: `p` under 1F1B
//! (stage `i` holds `p - i`; Narayanan et al. 2021, Sec. 2.2.1), and
//! `p (1 + (p - 1)/(p v))` under the interleaved schedule of `v` model
//! chunks per stage (Korthikanti et al. 2022, Sec. 4.2.3, Eq. 5).
//!
//! [`ActivationModel::FerrotronCpu`] counts instead what Burn 0.21's
//! autodiff keeps on Ferrotron's default CPU path (f32): the reference ops
//! primitive by primitive, and the CPU operations' nodes (GELU-tanh,
//! SwiGLU, the norms: `ferrotron_models::ops::<op>::cpu`) as they are. A product
//! keeps both factors, a quotient both operands, `exp`, `sqrt` and
//! `sigmoid` their input, a matmul both inputs; sums, means, additions,
//! scalings, reshapes, casts to the same dtype, `gather` and `select` keep
//! no tensor. A tensor kept by several nodes (or a view of one) is one
//! buffer. Per block, in elements, with `T = s b` tokens:
//! - each norm (LayerNorm or RMSNorm, one node) keeps its input and each
//!   row's mean and reciprocal standard deviation: `2 T h + 4 T` for two;
//! - the inputs of the q/k/v projections and of the MLP's first
//!   projections (the norms' outputs): `2 T h`;
//! - q, k and v as flex's attention node keeps them (after RoPE; k and v
//!   at the KV heads' width `h_kv`) and the output projection's input:
//!   `2 T h + 2 T h_kv`;
//! - the attention core: nothing. Flex's host-buffer attention keeps only
//!   q, k, v and recomputes the probabilities in its backward, whatever
//!   `--recompute` says (Burn's reference, `--kernels reference`, would keep
//!   `3 a s^2 b` scores);
//! - the MLP: GELU-tanh's node keeps its input, the down projection its
//!   output, `2 T f`; SwiGLU's node keeps the gate and up, the down
//!   projection their product, `3 T f`.
//!
//! That is `6 T h + 2 T h_kv + 2 T f` (GELU; SwiGLU `3 T f`; plus the
//! statistics), against Korthikanti's `8 T h + 2 T f + a s^2 b` elements
//! for the same layer without dropout. Outside the blocks: BLOOM's
//! embedding norm `T h`, the final norm and the head's input `2 T h`, and
//! the cross-entropy's shifted logits `T V` (f32; `log_softmax` keeps
//! `exp`'s input, the log-probabilities go once `gather` has picked the
//! targets), or with the chunked head its gradients `T h + h V` in their
//! place. Selective recomputation changes nothing on this path; full
//! recomputation keeps each block's input. Under tensor parallelism the
//! terms split as in Korthikanti's count (q, k, v and the MLP by `t`, the
//! norms by `t` with SP); only `t = 1` is measured (`plan_activations`
//! test).

use serde::Serialize;

use super::model::ModelShape;
pub use crate::recompute::Recompute;

/// Which count of activations the planner uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActivationModel {
    /// Korthikanti et al. 2022: one tensor per fused op, what Megatron-LM
    /// (and Ferrotron's fused kernels on GPUs) keep.
    #[default]
    Korthikanti,
    /// What Burn's autodiff keeps over Ferrotron's reference ops (the CPU
    /// path), counted primitive by primitive (see the module doc).
    FerrotronCpu,
}

impl ActivationModel {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Korthikanti => "korthikanti",
            Self::FerrotronCpu => "ferrotron-cpu",
        }
    }
}

impl std::str::FromStr for ActivationModel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        [Self::Korthikanti, Self::FerrotronCpu]
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                format!("'{s}' is not an activation model; use korthikanti or ferrotron-cpu")
            })
    }
}

/// One micro-batch's activations as the layer counts them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerActivations {
    /// Sequence length `s` (whole sequences).
    pub seq: usize,
    /// Context-parallel degree `c`: each rank holds `s / c` tokens of
    /// every sequence.
    pub cp: usize,
    /// Micro-batch `b`, sequences.
    pub micro_batch: usize,
    /// Tensor-parallel degree `t`.
    pub tp: usize,
    /// Sequence parallelism over the TP group.
    pub sp: bool,
    /// Bytes of an activation element (2 for bf16/fp16, 4 for f32).
    pub elem_bytes: usize,
    /// Dropout after attention, MLP and softmax (1-byte masks;
    /// [`ActivationModel::Korthikanti`] only).
    pub dropout: bool,
    /// The count used.
    pub model: ActivationModel,
    /// The head and the loss in blocks of rows (Ferrotron's default where
    /// `t = 1`, see the module doc): its gradients are kept, not the
    /// logits. Ignored under TP.
    pub chunked_head: bool,
}

impl LayerActivations {
    /// Tokens of each sequence this rank holds, `s / c`.
    fn local_seq(&self) -> f64 {
        self.seq as f64 / self.cp as f64
    }

    /// Bytes the ring attention node keeps besides `q`, `k`, `v` (none
    /// without context parallelism): f32 copies of its output and its
    /// log-sum-exp, this rank's tokens and heads.
    fn ring_bytes(&self, m: &ModelShape) -> f64 {
        if self.cp == 1 {
            return 0.0;
        }
        let tokens = self.local_seq() * self.micro_batch as f64;
        4.0 * tokens * (m.hidden + m.heads) as f64 / self.tp as f64
    }

    /// Bytes one transformer layer stores for backward.
    pub fn layer_bytes(&self, m: &ModelShape, recompute: Recompute) -> f64 {
        let (s, b, t) = (self.local_seq(), self.micro_batch as f64, self.tp as f64);
        let e = self.elem_bytes as f64;
        let sbh = s * b * m.hidden as f64;
        let sbk = s * b * m.kv_width() as f64;
        let sbf = s * b * m.ffn as f64;
        let mask = if self.dropout { 1.0 } else { 0.0 };
        let sp = if self.sp { t } else { 1.0 };
        if recompute == Recompute::Full {
            return e * sbh / sp;
        }
        if self.model == ActivationModel::FerrotronCpu {
            return self.ferrotron_cpu_layer_bytes(m) + self.ring_bytes(m);
        }
        // Outside the TP regions: two norm inputs, the QKV and MLP inputs,
        // two dropout masks (10 sbh in the paper).
        let replicated = 4.0 * e * sbh + 2.0 * mask * sbh;
        // Inside: Q, K, V, the output projection's input, and the MLP's
        // (GELU: its input and output; SwiGLU: gate, SiLU, up, product).
        let mlp = if m.gated_mlp { 4.0 } else { 2.0 };
        let split = e * (2.0 * sbh + 2.0 * sbk) + mlp * e * sbf;
        // Attention scores: softmax output, its dropout mask and output
        // (none kept around a ring).
        let a_s2_b = m.heads as f64 * s * s * b;
        let scores = if recompute == Recompute::Selective || self.cp > 1 {
            0.0
        } else {
            e * a_s2_b + mask * a_s2_b + if self.dropout { e * a_s2_b } else { 0.0 }
        };
        replicated / sp + (split + scores) / t + self.ring_bytes(m)
    }

    /// [`LayerActivations::layer_bytes`] under [`ActivationModel::FerrotronCpu`],
    /// recomputing `none` or `selective` (the same on this path).
    fn ferrotron_cpu_layer_bytes(&self, m: &ModelShape) -> f64 {
        let (s, b, t) = (self.local_seq(), self.micro_batch as f64, self.tp as f64);
        let e = self.elem_bytes as f64;
        let tokens = s * b;
        let h = m.hidden as f64;
        let sp = if self.sp { t } else { 1.0 };
        // Two norms (the input and two row statistics each) and the inputs
        // of the column-parallel projections.
        let replicated = 2.0 * (tokens * h + 2.0 * tokens) + 2.0 * tokens * h;
        // q, k, v as the attention node keeps them, and the output
        // projection's input; the attention core keeps nothing.
        let qkvo = 2.0 * tokens * h + 2.0 * tokens * m.kv_width() as f64;
        // GELU: its input and output; SwiGLU: gate, up and their product.
        let mlp = if m.gated_mlp { 3.0 } else { 2.0 } * tokens * m.ffn as f64;
        e * (replicated / sp + (qkvo + mlp) / t)
    }

    /// Bytes the first stage keeps for the embedding per micro-batch: its
    /// dropout mask (Korthikanti), or on Ferrotron's CPU path the embedding
    /// norm's input and statistics (BLOOM).
    pub fn embedding_bytes(&self, m: &ModelShape) -> f64 {
        let sp = if self.sp { self.tp as f64 } else { 1.0 };
        let tokens = self.local_seq() * self.micro_batch as f64;
        if self.model == ActivationModel::FerrotronCpu {
            let norm = tokens * m.hidden as f64 + 2.0 * tokens;
            let e = self.elem_bytes as f64;
            return if m.embed_norm { e * norm / sp } else { 0.0 };
        }
        let mask = if self.dropout { 1.0 } else { 0.0 };
        mask * tokens * m.hidden as f64 / sp
    }

    /// Bytes the last stage keeps for the output layer per micro-batch: the
    /// final norm's and the head's inputs, and fp32 logits split over TP;
    /// with the chunked head (`t = 1`), the head's f32 weight gradient in
    /// the logits' place (its input gradient takes the input's).
    pub fn output_bytes(&self, m: &ModelShape) -> f64 {
        let (s, b, t) = (self.local_seq(), self.micro_batch as f64, self.tp as f64);
        let sp = if self.sp { t } else { 1.0 };
        let e = self.elem_bytes as f64;
        let tokens = s * b;
        let chunked = self.chunked_head && self.tp == 1;
        // The logits (and on the CPU path the cross-entropy's row sums), or
        // the chunked head's weight gradient.
        let head = if chunked {
            4.0 * (m.hidden * m.vocab) as f64
        } else if self.model == ActivationModel::FerrotronCpu {
            4.0 * tokens * m.vocab as f64 / t + 4.0 * tokens
        } else {
            4.0 * tokens * m.vocab as f64 / t
        };
        if self.model == ActivationModel::FerrotronCpu {
            // The final norm (its input, two statistics) and the head's
            // input (or its gradient).
            let norm = 2.0 * tokens * m.hidden as f64 + 2.0 * tokens;
            return e * norm / sp + head;
        }
        2.0 * e * tokens * m.hidden as f64 / sp + head
    }
}

/// Micro-batches whose activations the first stage holds at once: 1
/// without pipelining, `p` under 1F1B, `p (1 + (p-1)/(p v))` interleaved
/// with `v` chunks; never more than the `m` micro-batches of a step.
pub fn in_flight(pp: usize, interleave: usize, micro_batches: usize) -> f64 {
    let p = pp as f64;
    let f = if pp == 1 {
        1.0
    } else if interleave <= 1 {
        p
    } else {
        p * (1.0 + (p - 1.0) / (p * interleave as f64))
    };
    f.min(micro_batches as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt() -> ModelShape {
        ModelShape::gpt(51200, 12288, 96, 96, 2048)
    }

    #[test]
    fn reduces_to_korthikantis_closed_forms_for_gpt_with_dropout() {
        let m = gpt();
        let (s, b, h, a) = (2048.0, 1.0, 12288.0, 96.0);
        let sbh = s * b * h;
        for (t, sp) in [(1, false), (8, false), (8, true)] {
            let act = LayerActivations {
                seq: 2048,
                cp: 1,
                micro_batch: 1,
                tp: t,
                sp,
                elem_bytes: 2,
                dropout: true,
                model: ActivationModel::Korthikanti,
                chunked_head: false,
            };
            let tf = t as f64;
            let want = match (t, sp) {
                (1, _) => sbh * (34.0 + 5.0 * a * s / h),
                (_, false) => sbh * (10.0 + 24.0 / tf + 5.0 * a * s / (h * tf)),
                _ => sbh * (34.0 / tf + 5.0 * a * s / (h * tf)),
            };
            let got = act.layer_bytes(&m, Recompute::None);
            assert!((got / want - 1.0).abs() < 1e-12, "t={t} sp={sp}");
            let sel = match (t, sp) {
                (1, _) => sbh * 34.0,
                (_, false) => sbh * (10.0 + 24.0 / tf),
                _ => sbh * 34.0 / tf,
            };
            let got = act.layer_bytes(&m, Recompute::Selective);
            assert!((got / sel - 1.0).abs() < 1e-12, "selective t={t} sp={sp}");
        }
        let act = LayerActivations {
            seq: 2048,
            cp: 1,
            micro_batch: 1,
            tp: 8,
            sp: false,
            elem_bytes: 2,
            dropout: true,
            model: ActivationModel::Korthikanti,
            chunked_head: false,
        };
        assert_eq!(act.layer_bytes(&m, Recompute::Full), 2.0 * sbh);
        // Output layer: 4sbh/t (1 + v/h) with SP (Sec. 4.3).
        let act = LayerActivations { sp: true, ..act };
        let want = 4.0 * sbh / 8.0 * (1.0 + 51200.0 / h);
        assert!((act.output_bytes(&m) / want - 1.0).abs() < 1e-12);
        // Under TP the chunked head does not run: the same count.
        let chunked = LayerActivations {
            chunked_head: true,
            ..act
        };
        assert_eq!(chunked.output_bytes(&m), act.output_bytes(&m));
    }

    /// Without TP the chunked head keeps its gradients, `d_x` where the
    /// head's input was and an f32 `d_w` (`4 h V`) where the f32 logits
    /// (`4 s b V`) were, on both counts.
    #[test]
    fn the_chunked_head_keeps_its_gradients_in_place_of_the_logits() {
        let m = gpt();
        let (tokens, h, v) = (2.0 * 2048.0, 12288.0, 51200.0);
        for model in [ActivationModel::Korthikanti, ActivationModel::FerrotronCpu] {
            let logits = LayerActivations {
                seq: 2048,
                cp: 1,
                micro_batch: 2,
                tp: 1,
                sp: false,
                elem_bytes: 2,
                dropout: false,
                model,
                chunked_head: false,
            };
            let chunked = LayerActivations {
                chunked_head: true,
                ..logits
            };
            let row_sums = if model == ActivationModel::FerrotronCpu {
                4.0 * tokens
            } else {
                0.0
            };
            let saved = 4.0 * tokens * v + row_sums - 4.0 * h * v;
            let got = logits.output_bytes(&m) - chunked.output_bytes(&m);
            assert!(
                (got / saved - 1.0).abs() < 1e-12,
                "{model:?}: {got} {saved}"
            );
        }
    }

    /// A ring of 4 ranks at 8192 tokens counts what one rank counts at
    /// 2048, without the scores, plus the ring node's f32 output and
    /// log-sum-exp: `4 x 2048 x b x (h + a) / t` bytes.
    #[test]
    fn a_ring_of_c_ranks_counts_s_over_c_tokens_and_no_scores() {
        let m = gpt();
        let at = |seq, cp, model| LayerActivations {
            seq,
            cp,
            micro_batch: 2,
            tp: 4,
            sp: true,
            elem_bytes: 4,
            dropout: false,
            model,
            chunked_head: false,
        };
        let kept = 4.0 * 2048.0 * 2.0 * (12288.0 + 96.0) / 4.0;
        let close = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-12;
        for model in [ActivationModel::Korthikanti, ActivationModel::FerrotronCpu] {
            let (ring, whole) = (at(8192, 4, model), at(2048, 1, model));
            let sel = whole.layer_bytes(&m, Recompute::Selective);
            assert!(close(
                ring.layer_bytes(&m, Recompute::Selective),
                sel + kept
            ));
            // Korthikanti's scores are not kept around a ring; the CPU
            // path keeps none either way.
            assert!(close(ring.layer_bytes(&m, Recompute::None), sel + kept));
            let full = whole.layer_bytes(&m, Recompute::Full);
            assert_eq!(ring.layer_bytes(&m, Recompute::Full), full);
            assert_eq!(ring.output_bytes(&m), whole.output_bytes(&m));
            assert_eq!(ring.embedding_bytes(&m), whole.embedding_bytes(&m));
        }
    }

    #[test]
    fn schedules_hold_p_or_the_interleaved_share_of_micro_batches() {
        assert_eq!(in_flight(1, 1, 64), 1.0);
        assert_eq!(in_flight(8, 1, 64), 8.0);
        assert_eq!(in_flight(8, 1, 4), 4.0);
        assert_eq!(in_flight(4, 2, 64), 4.0 * (1.0 + 3.0 / 8.0));
    }
}
