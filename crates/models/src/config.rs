//! The decoder's configuration: the switches that tell the families apart.

use ferrotron_engine::precision::Precision;
use ferrotron_kernels::attention::MatrixUnits;
use ferrotron_parallel::recompute::Recompute;
use serde::{Deserialize, Serialize};

use crate::rope_scaling::RopeScaling;

/// How token positions enter the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Position {
    /// Learned absolute position embeddings `[max_seq_len, hidden]` (GPT-2).
    Learned,
    /// Rotary embeddings on queries and keys, rotate-half layout (Llama).
    Rope {
        /// Base of the inverse frequencies (10000 in Llama 2, 500000 in Llama 3).
        theta: f64,
        /// Long-context frequency scaling (Llama 3.1 and later); absent: none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scaling: Option<RopeScaling>,
    },
    /// Per-head linear attention biases (BLOOM).
    Alibi,
}

/// The normalisation layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NormKind {
    /// LayerNorm with gain and bias.
    LayerNorm,
    /// RMSNorm with gain only.
    RmsNorm,
}

/// The feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MlpKind {
    /// `down(gelu_tanh(up(x)))` (GPT-2, BLOOM; `ops::gelu_tanh_reference`).
    GeluTanh,
    /// `down(silu(gate(x)) * up(x))` (Llama).
    Swiglu,
}

/// Which implementation of the hot operations (attention, SwiGLU, norms,
/// RoPE, cross-entropy) the decoder runs; see `ops`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kernels {
    /// Ferrotron's fused CubeCL kernels (backends cuda and rocm).
    Fused,
    /// Plain Burn tensor operations (every backend).
    Reference,
}

impl std::str::FromStr for Kernels {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fused" => Ok(Kernels::Fused),
            "reference" => Ok(Kernels::Reference),
            _ => Err(format!(
                "'{s}' is not a kernel choice; use fused or reference"
            )),
        }
    }
}

/// Shape and switches of a decoder-only transformer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecoderConfig {
    /// Number of token ids.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Number of transformer blocks.
    pub n_layers: usize,
    /// Number of query heads.
    pub n_heads: usize,
    /// Number of key/value heads (`n_heads` for MHA, fewer for GQA).
    pub n_kv_heads: usize,
    /// Inner width of the MLP.
    pub ffn_size: usize,
    /// Longest sequence the model accepts, in tokens.
    pub max_seq_len: usize,
    /// Position encoding.
    pub position: Position,
    /// Normalisation layer.
    pub norm: NormKind,
    /// Epsilon of every normalisation layer.
    pub norm_eps: f64,
    /// Feed-forward block.
    pub mlp: MlpKind,
    /// Whether linear layers and norms carry biases.
    pub bias: bool,
    /// Whether the output head reuses the token embedding matrix.
    pub tied_head: bool,
    /// Whether a LayerNorm follows the token embedding (BLOOM).
    pub embed_norm: bool,
    /// Standard deviation of the normal initialisation of weight matrices.
    pub init_std: f64,
    /// Implementation of the hot operations. Not part of the architecture,
    /// so never written out: absent (the default) means fused where the
    /// backend has the kernels, reference elsewhere.
    #[serde(default, skip_serializing)]
    pub kernels: Option<Kernels>,
    /// The dtype the model computes in (`--precision`): the f32 weights
    /// are cast to it at every forward, matmuls and elementwise
    /// activations run in it, norms, softmax and the loss in f32. Not part
    /// of the architecture, so never written out (default f32).
    #[serde(default, skip_serializing)]
    pub precision: Precision,
    /// Which kernels run the fused attention's products on the matrix
    /// units (tensor cores) where the device has them for the compute
    /// dtype and head dimension (`backend.attention_kernel =
    /// matrix-units`: the fragment forward and backward; `registers`: the
    /// register forward and backward on the `mma` instruction); elsewhere,
    /// and by default ([`MatrixUnits::Off`]), the tiled kernels on plain
    /// units. Not part of the architecture, so never written out.
    #[serde(default, skip)]
    pub attention_matrix_units: MatrixUnits,
}

/// A configuration that cannot build a model.
#[derive(Debug, thiserror::Error)]
#[error("invalid model config: {field} {problem}")]
pub struct ConfigError {
    /// The offending field.
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

impl DecoderConfig {
    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.n_heads
    }

    /// Checks that the shape is consistent; the error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("ffn_size", self.ffn_size),
            ("max_seq_len", self.max_seq_len),
        ];
        for (field, v) in positive {
            if v == 0 {
                return Err(ConfigError {
                    field,
                    problem: "must be positive".into(),
                });
            }
        }
        if !self.hidden_size.is_multiple_of(self.n_heads) {
            return Err(ConfigError {
                field: "hidden_size",
                problem: format!(
                    "({}) must be divisible by n_heads ({})",
                    self.hidden_size, self.n_heads
                ),
            });
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(ConfigError {
                field: "n_kv_heads",
                problem: format!(
                    "({}) must divide n_heads ({})",
                    self.n_kv_heads, self.n_heads
                ),
            });
        }
        if let Position::Rope { theta, scaling } = &self.position {
            let theta = *theta;
            if !self.head_dim().is_multiple_of(2) {
                return Err(ConfigError {
                    field: "hidden_size",
                    problem: format!(
                        "gives an odd head dim ({}); RoPE needs an even one",
                        self.head_dim()
                    ),
                });
            }
            if theta.is_nan() || theta <= 0.0 {
                return Err(ConfigError {
                    field: "position.theta",
                    problem: format!("must be positive, got {theta}"),
                });
            }
            if let Some(s) = scaling {
                s.validate()?;
            }
        }
        if self.norm_eps.is_nan() || self.norm_eps <= 0.0 {
            return Err(ConfigError {
                field: "norm_eps",
                problem: format!("must be positive, got {}", self.norm_eps),
            });
        }
        Ok(())
    }

    /// Parameters of one transformer block.
    fn block_params(&self) -> usize {
        let h = self.hidden_size;
        let kv = self.n_kv_heads * self.head_dim();
        let b = usize::from(self.bias);
        let attn = (h * h + b * h) * 2 + (h * kv + b * kv) * 2;
        let mlp = match self.mlp {
            MlpKind::GeluTanh => {
                (h * self.ffn_size + b * self.ffn_size) + (self.ffn_size * h + b * h)
            }
            MlpKind::Swiglu => {
                2 * (h * self.ffn_size + b * self.ffn_size) + (self.ffn_size * h + b * h)
            }
        };
        attn + mlp + 2 * self.norm_params()
    }

    /// Parameters of one normalisation layer.
    fn norm_params(&self) -> usize {
        match self.norm {
            NormKind::LayerNorm => 2 * self.hidden_size,
            NormKind::RmsNorm => self.hidden_size,
        }
    }

    /// Total number of parameters (a tied head is counted once).
    pub fn num_params(&self) -> usize {
        let h = self.hidden_size;
        let mut n = self.vocab_size * h + self.n_layers * self.block_params() + self.norm_params();
        if self.position == Position::Learned {
            n += self.max_seq_len * h;
        }
        if self.embed_norm {
            n += self.norm_params();
        }
        if !self.tied_head {
            n += h * self.vocab_size;
        }
        n
    }

    /// FLOPs per token of one training step (forward + backward, and the
    /// forward work that `recompute` repeats in backward) at sequence length
    /// `seq_len`.
    ///
    /// `6 x` the weights used in matmuls (blocks and head) plus
    /// `12 x n_layers x seq_len x hidden` for the attention scores and
    /// values, plus per block [`Recompute::extra_flops_per_token`] (selective:
    /// the attention core's forward again; full: the block's forward again,
    /// not the head's). For GPT shapes this is Megatron's `72 B s l h^2 (1 +
    /// s/6h + V/12lh)` without recomputation and `96 B s l h^2 (1 + s/6h +
    /// V/16lh)` with full recomputation, divided by the `B s` tokens of the
    /// batch. The recomputation counts as work done, as in Megatron's
    /// formula, so the TFLOP/s and MFU of a recomputing run include it.
    pub fn train_flops_per_token(&self, seq_len: usize, recompute: Recompute) -> f64 {
        let h = self.hidden_size as f64;
        let kv = (self.n_kv_heads * self.head_dim()) as f64;
        let f = self.ffn_size as f64;
        let mlp_mats = match self.mlp {
            MlpKind::GeluTanh => 2.0,
            MlpKind::Swiglu => 3.0,
        };
        let per_layer = 2.0 * h * h + 2.0 * h * kv + mlp_mats * h * f;
        let layers = self.n_layers as f64;
        let s = seq_len as f64;
        let matmul_weights = layers * per_layer + h * self.vocab_size as f64;
        6.0 * matmul_weights
            + 12.0 * layers * s * h
            + layers * recompute.extra_flops_per_token(per_layer, s, h)
    }
}

#[cfg(test)]
mod tests {
    use ferrotron_parallel::recompute::Recompute;

    use crate::presets;

    #[test]
    fn train_flops_equal_megatron_formula_for_gpt_shapes() {
        let c = presets::preset("gpt2").unwrap();
        let (s, l, h, v) = (1024.0, 12.0, 768.0, 50257.0);
        let megatron = 72.0 * s * l * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * l * h));
        let ours = c.train_flops_per_token(1024, Recompute::None) * s;
        assert!(
            (ours - megatron).abs() / megatron < 1e-12,
            "{ours} vs {megatron}"
        );
    }

    #[test]
    fn full_recompute_flops_equal_megatron_96_formula() {
        // Narayanan et al. 2021, Sec. 5.1: 96 B s l h^2 (1 + s/6h + V/16lh)
        // FLOPs per iteration with full activation recomputation.
        let c = presets::preset("gpt2").unwrap();
        let (s, l, h, v) = (1024.0, 12.0, 768.0, 50257.0);
        let megatron = 96.0 * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h));
        let ours = c.train_flops_per_token(1024, Recompute::Full) * s;
        assert!(
            (ours - megatron).abs() / megatron < 1e-12,
            "{ours} vs {megatron}"
        );
        // Selective: the attention core's forward (2 matmuls of 2 s h
        // FLOPs per token) once more in every layer.
        let selective = c.train_flops_per_token(1024, Recompute::Selective);
        let none = c.train_flops_per_token(1024, Recompute::None);
        assert!((selective - none - l * 4.0 * s * h).abs() < 1e-6 * none);
    }

    #[test]
    fn validation_names_the_field() {
        let mut c = presets::preset("llama-mini").unwrap();
        c.n_kv_heads = 4;
        assert!(c.validate().unwrap_err().to_string().contains("n_kv_heads"));
        let mut c = presets::preset("gpt-mini").unwrap();
        c.hidden_size = 0;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("hidden_size must be positive"));
    }

    #[test]
    fn config_round_trips_through_toml_and_rejects_unknown_keys() {
        let c = presets::preset("llama-mini").unwrap();
        let text = toml::to_string(&c).unwrap();
        let back: crate::DecoderConfig = toml::from_str(&text).unwrap();
        assert_eq!(back, c);
        let bad = format!("{text}\nwidth = 3\n");
        let e = toml::from_str::<crate::DecoderConfig>(&bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("width"), "{e}");
    }
}
