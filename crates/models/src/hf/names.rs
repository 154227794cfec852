//! Our parameter names to Hugging Face tensor names, per family.
//!
//! One [`Rule`] per parameter of ours: the Hugging Face tensor it lives in
//! and how its elements are laid out there ([`Layout`]). Import gathers each
//! parameter from its tensor; export scatters it back, so the two directions
//! are inverse by construction. Several of our parameters can share one
//! Hugging Face tensor (GPT-2's fused `c_attn`, BLOOM's `query_key_value`).

use super::config::Family;
use crate::config::DecoderConfig;

/// Where the elements of one of our tensors sit in a Hugging Face tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Same shape, same order (norms, embeddings, GPT-2's Conv1D `[in, out]`).
    Same,
    /// Ours `[in, out]` is `nn.Linear`'s `[out, in]` transposed.
    Transpose,
    /// Ours `[in, c]` (or bias `[c]`) is column block `part` of `parts` of a
    /// `[in, parts * c]` tensor (GPT-2's `c_attn`, q | k | v).
    Columns {
        /// Which block.
        part: usize,
        /// How many blocks.
        parts: usize,
    },
    /// Ours `[in, n_heads * hd]` (or bias `[n_heads * hd]`) is slot `part`
    /// (0 = q, 1 = k, 2 = v) of BLOOM's `query_key_value` `[n_heads * 3 * hd, in]`,
    /// read as `[n_heads, 3, hd, in]` and transposed.
    HeadInterleaved {
        /// 0 = query, 1 = key, 2 = value.
        part: usize,
        /// Number of heads.
        n_heads: usize,
    },
}

/// One parameter of ours and the Hugging Face tensor that holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// Our name (`layers.0.attn.q.weight`).
    pub ours: String,
    /// The full Hugging Face name as `save_pretrained` writes it
    /// (`transformer.h.0.attn.c_attn.weight`).
    pub hf: String,
    /// Our shape.
    pub shape: Vec<usize>,
    /// How our elements sit in the Hugging Face tensor.
    pub layout: Layout,
}

impl Rule {
    /// Shape of the Hugging Face tensor.
    pub fn hf_shape(&self) -> Vec<usize> {
        let s = &self.shape;
        match (self.layout, s.len()) {
            (Layout::Same, _) => s.clone(),
            (Layout::Transpose, _) => s.iter().rev().copied().collect(),
            (Layout::Columns { parts, .. }, 1) => vec![parts * s[0]],
            (Layout::Columns { parts, .. }, _) => vec![s[0], parts * s[1]],
            (Layout::HeadInterleaved { .. }, 1) => vec![3 * s[0]],
            (Layout::HeadInterleaved { .. }, _) => vec![3 * s[1], s[0]],
        }
    }

    /// Flat index in the Hugging Face tensor of our flat element `i`.
    pub fn hf_index(&self, i: usize) -> usize {
        let s = &self.shape;
        let (row, col, cols) = if s.len() == 2 {
            (i / s[1], i % s[1], s[1])
        } else {
            (0, i, s[0])
        };
        match self.layout {
            Layout::Same => i,
            Layout::Transpose => col * s[0] + row,
            Layout::Columns { part, parts } => row * parts * cols + part * cols + col,
            Layout::HeadInterleaved { part, n_heads } => {
                let hd = cols / n_heads;
                let hf_row = ((col / hd) * 3 + part) * hd + col % hd;
                if s.len() == 2 {
                    hf_row * s[0] + row
                } else {
                    hf_row
                }
            }
        }
    }
}

/// Every parameter of a model of family `fam` and shape `c`, with its rule.
pub fn rules(fam: Family, c: &DecoderConfig) -> Vec<Rule> {
    let (h, v, f) = (c.hidden_size, c.vocab_size, c.ffn_size);
    let kv = c.n_kv_heads * c.head_dim();
    let mut out = Vec::new();
    let p = fam.prefix();
    let mut add = |ours: String, hf: String, shape: Vec<usize>, layout: Layout| {
        let hf = if hf == "lm_head.weight" {
            hf
        } else {
            format!("{p}{hf}")
        };
        out.push(Rule {
            ours,
            hf,
            shape,
            layout,
        });
    };
    let norm = |add: &mut dyn FnMut(String, String, Vec<usize>, Layout), ours: &str, hf: &str| {
        add(
            format!("{ours}.weight"),
            format!("{hf}.weight"),
            vec![h],
            Layout::Same,
        );
        if c.bias {
            add(
                format!("{ours}.bias"),
                format!("{hf}.bias"),
                vec![h],
                Layout::Same,
            );
        }
    };
    // (ours, hf, d_in, d_out, layout of the weight)
    let linear = |add: &mut dyn FnMut(String, String, Vec<usize>, Layout),
                  ours: String,
                  hf: String,
                  d_in: usize,
                  d_out: usize,
                  layout: Layout| {
        add(
            format!("{ours}.weight"),
            format!("{hf}.weight"),
            vec![d_in, d_out],
            layout,
        );
        if c.bias {
            let bias_layout = match layout {
                Layout::Transpose => Layout::Same,
                other => other,
            };
            add(
                format!("{ours}.bias"),
                format!("{hf}.bias"),
                vec![d_out],
                bias_layout,
            );
        }
    };
    match fam {
        Family::Gpt2 => {
            add(
                "embed".into(),
                "wte.weight".into(),
                vec![v, h],
                Layout::Same,
            );
            add(
                "pos_embed".into(),
                "wpe.weight".into(),
                vec![c.max_seq_len, h],
                Layout::Same,
            );
        }
        Family::Llama => add(
            "embed".into(),
            "embed_tokens.weight".into(),
            vec![v, h],
            Layout::Same,
        ),
        Family::Bloom => {
            add(
                "embed".into(),
                "word_embeddings.weight".into(),
                vec![v, h],
                Layout::Same,
            );
            norm(&mut add, "embed_norm", "word_embeddings_layernorm");
        }
    }
    for i in 0..c.n_layers {
        let o = format!("layers.{i}");
        match fam {
            Family::Gpt2 => {
                let g = format!("h.{i}");
                norm(&mut add, &format!("{o}.attn_norm"), &format!("{g}.ln_1"));
                for (part, name) in ["q", "k", "v"].iter().enumerate() {
                    let layout = Layout::Columns { part, parts: 3 };
                    linear(
                        &mut add,
                        format!("{o}.attn.{name}"),
                        format!("{g}.attn.c_attn"),
                        h,
                        h,
                        layout,
                    );
                }
                linear(
                    &mut add,
                    format!("{o}.attn.o"),
                    format!("{g}.attn.c_proj"),
                    h,
                    h,
                    Layout::Same,
                );
                norm(&mut add, &format!("{o}.mlp_norm"), &format!("{g}.ln_2"));
                linear(
                    &mut add,
                    format!("{o}.mlp.up"),
                    format!("{g}.mlp.c_fc"),
                    h,
                    f,
                    Layout::Same,
                );
                linear(
                    &mut add,
                    format!("{o}.mlp.down"),
                    format!("{g}.mlp.c_proj"),
                    f,
                    h,
                    Layout::Same,
                );
            }
            Family::Llama => {
                let g = format!("layers.{i}");
                let t = Layout::Transpose;
                norm(
                    &mut add,
                    &format!("{o}.attn_norm"),
                    &format!("{g}.input_layernorm"),
                );
                for (name, d_out) in [("q", h), ("k", kv), ("v", kv)] {
                    linear(
                        &mut add,
                        format!("{o}.attn.{name}"),
                        format!("{g}.self_attn.{name}_proj"),
                        h,
                        d_out,
                        t,
                    );
                }
                linear(
                    &mut add,
                    format!("{o}.attn.o"),
                    format!("{g}.self_attn.o_proj"),
                    h,
                    h,
                    t,
                );
                norm(
                    &mut add,
                    &format!("{o}.mlp_norm"),
                    &format!("{g}.post_attention_layernorm"),
                );
                linear(
                    &mut add,
                    format!("{o}.mlp.gate"),
                    format!("{g}.mlp.gate_proj"),
                    h,
                    f,
                    t,
                );
                linear(
                    &mut add,
                    format!("{o}.mlp.up"),
                    format!("{g}.mlp.up_proj"),
                    h,
                    f,
                    t,
                );
                linear(
                    &mut add,
                    format!("{o}.mlp.down"),
                    format!("{g}.mlp.down_proj"),
                    f,
                    h,
                    t,
                );
            }
            Family::Bloom => {
                let g = format!("h.{i}");
                let t = Layout::Transpose;
                norm(
                    &mut add,
                    &format!("{o}.attn_norm"),
                    &format!("{g}.input_layernorm"),
                );
                for (part, name) in ["q", "k", "v"].iter().enumerate() {
                    let layout = Layout::HeadInterleaved {
                        part,
                        n_heads: c.n_heads,
                    };
                    linear(
                        &mut add,
                        format!("{o}.attn.{name}"),
                        format!("{g}.self_attention.query_key_value"),
                        h,
                        h,
                        layout,
                    );
                }
                linear(
                    &mut add,
                    format!("{o}.attn.o"),
                    format!("{g}.self_attention.dense"),
                    h,
                    h,
                    t,
                );
                norm(
                    &mut add,
                    &format!("{o}.mlp_norm"),
                    &format!("{g}.post_attention_layernorm"),
                );
                linear(
                    &mut add,
                    format!("{o}.mlp.up"),
                    format!("{g}.mlp.dense_h_to_4h"),
                    h,
                    f,
                    t,
                );
                linear(
                    &mut add,
                    format!("{o}.mlp.down"),
                    format!("{g}.mlp.dense_4h_to_h"),
                    f,
                    h,
                    t,
                );
            }
        }
    }
    let final_norm = match fam {
        Family::Llama => "norm",
        Family::Gpt2 | Family::Bloom => "ln_f",
    };
    norm(&mut add, "final_norm", final_norm);
    if !c.tied_head {
        add(
            "head".into(),
            "lm_head.weight".into(),
            vec![h, v],
            Layout::Transpose,
        );
    }
    out
}

/// Hugging Face tensors that hold buffers, not parameters, in some
/// checkpoints (GPT-2's causal mask, old Llama's RoPE frequencies); import
/// skips them.
pub fn is_ignored_buffer(fam: Family, hf_name: &str) -> bool {
    match fam {
        Family::Gpt2 => hf_name.ends_with(".attn.bias") || hf_name.ends_with(".attn.masked_bias"),
        Family::Llama => hf_name.ends_with(".rotary_emb.inv_freq"),
        Family::Bloom => false,
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use super::*;
    use crate::{presets, Decoder};
    use burn::backend::Flex;
    use ferrotron_engine::params::named_tensors;

    #[test]
    fn rules_cover_every_parameter_with_its_shape() {
        for (name, fam) in [
            ("gpt-mini", Family::Gpt2),
            ("llama-mini", Family::Llama),
            ("bloom-mini", Family::Bloom),
        ] {
            for tied in [true, false] {
                let mut c = presets::preset(name).unwrap();
                c.n_layers = 2;
                c.tied_head = tied;
                let model = Decoder::<Flex>::new(&c, 0, &Default::default()).unwrap();
                let mut want: Vec<(String, Vec<usize>)> = named_tensors(&model)
                    .into_iter()
                    .map(|(n, d)| (n, d.shape.to_vec()))
                    .collect();
                let mut got: Vec<(String, Vec<usize>)> = rules(fam, &c)
                    .into_iter()
                    .map(|r| (r.ours, r.shape))
                    .collect();
                want.sort();
                got.sort();
                assert_eq!(got, want, "{name} tied={tied}");
            }
        }
    }

    #[test]
    fn bloom_qkv_is_read_per_head() {
        // 2 heads of dim 1, input width 2: rows of query_key_value are
        // [q0, k0, v0, q1, k1, v1].
        let r = Rule {
            ours: "q".into(),
            hf: "qkv".into(),
            shape: vec![2, 2],
            layout: Layout::HeadInterleaved {
                part: 1,
                n_heads: 2,
            },
        };
        assert_eq!(r.hf_shape(), vec![6, 2]);
        // ours[in=0, out=head1] = hf[row k1 = 4, col 0] = 8
        assert_eq!(r.hf_index(1), 8);
        assert_eq!(r.hf_index(2), 3);
    }
}
