//! Named model shapes: the published GPT-2, Llama and BLOOM sizes, and small
//! presets that train on a CPU in minutes.

use crate::config::{DecoderConfig, MlpKind, NormKind, Position};
use crate::rope_scaling::RopeScaling;
use ferrotron_kernels::attention::MatrixUnits;

/// Every preset name, in the order they are listed to users.
pub const PRESET_NAMES: &[&str] = &[
    "gpt-mini",
    "llama-mini",
    "bloom-mini",
    "gpt2",
    "gpt2-medium",
    "gpt2-large",
    "gpt2-xl",
    "gpt3-13b",
    "llama2-7b",
    "llama3-8b",
    "llama3-70b",
    "llama3.1-8b",
    "llama3.1-70b",
    "llama3.2-1b",
    "llama3.2-3b",
    "bloom-560m",
    "bloom-7b1",
    "bloom-176b",
];

/// The GPT-2 family at a given width, depth and head count (published defaults elsewhere).
pub(crate) fn gpt2(hidden: usize, layers: usize, heads: usize) -> DecoderConfig {
    DecoderConfig {
        vocab_size: 50257,
        hidden_size: hidden,
        n_layers: layers,
        n_heads: heads,
        n_kv_heads: heads,
        ffn_size: 4 * hidden,
        max_seq_len: 1024,
        position: Position::Learned,
        norm: NormKind::LayerNorm,
        norm_eps: 1e-5,
        mlp: MlpKind::GeluTanh,
        bias: true,
        tied_head: true,
        embed_norm: false,
        init_std: 0.02,
        kernels: None,
        precision: Default::default(),
        attention_matrix_units: MatrixUnits::Off,
    }
}

/// The Llama family with the given shape (published defaults elsewhere).
#[allow(clippy::too_many_arguments)]
pub(crate) fn llama(
    vocab: usize,
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    ffn: usize,
    max_seq: usize,
    theta: f64,
) -> DecoderConfig {
    DecoderConfig {
        vocab_size: vocab,
        hidden_size: hidden,
        n_layers: layers,
        n_heads: heads,
        n_kv_heads: kv_heads,
        ffn_size: ffn,
        max_seq_len: max_seq,
        position: Position::Rope {
            theta,
            scaling: None,
        },
        norm: NormKind::RmsNorm,
        norm_eps: 1e-5,
        mlp: MlpKind::Swiglu,
        bias: false,
        tied_head: false,
        embed_norm: false,
        init_std: 0.02,
        kernels: None,
        precision: Default::default(),
        attention_matrix_units: MatrixUnits::Off,
    }
}

/// Llama 3.1 / 3.2 (published `config.json`): a Llama 3 shape with a 131072
/// token context, reached by `llama3` RoPE scaling of an 8192 token one.
fn llama31(
    hidden: usize,
    layers: usize,
    heads: usize,
    ffn: usize,
    factor: f64,
    tied_head: bool,
) -> DecoderConfig {
    let mut c = llama(128256, hidden, layers, heads, 8, ffn, 131072, 500000.0);
    c.position = Position::Rope {
        theta: 500000.0,
        scaling: Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }),
    };
    c.tied_head = tied_head;
    c
}

/// The BLOOM family at a given width, depth and head count (published defaults elsewhere).
pub(crate) fn bloom(hidden: usize, layers: usize, heads: usize) -> DecoderConfig {
    DecoderConfig {
        vocab_size: 250880,
        hidden_size: hidden,
        n_layers: layers,
        n_heads: heads,
        n_kv_heads: heads,
        ffn_size: 4 * hidden,
        max_seq_len: 2048,
        position: Position::Alibi,
        norm: NormKind::LayerNorm,
        norm_eps: 1e-5,
        mlp: MlpKind::GeluTanh,
        bias: true,
        tied_head: true,
        embed_norm: true,
        init_std: 0.02,
        kernels: None,
        precision: Default::default(),
        attention_matrix_units: MatrixUnits::Off,
    }
}

/// Vocabulary of the mini presets: the size the embedded corpus's byte-level
/// BPE tokenizer is trained to.
pub const MINI_VOCAB: usize = 4096;

/// The configuration of a preset, or `None` for an unknown name.
pub fn preset(name: &str) -> Option<DecoderConfig> {
    let c = match name {
        "gpt-mini" => DecoderConfig {
            vocab_size: MINI_VOCAB,
            max_seq_len: 256,
            ..gpt2(192, 4, 6)
        },
        "llama-mini" => llama(MINI_VOCAB, 192, 4, 6, 2, 512, 256, 500000.0),
        "bloom-mini" => DecoderConfig {
            vocab_size: MINI_VOCAB,
            // 6 heads: not a power of two, which exercises ALiBi's extra slopes.
            ..bloom(192, 4, 6)
        },
        "gpt2" => gpt2(768, 12, 12),
        "gpt2-medium" => gpt2(1024, 24, 16),
        "gpt2-large" => gpt2(1280, 36, 20),
        "gpt2-xl" => gpt2(1600, 48, 25),
        // GPT-3 13B (Brown et al. 2020, Table 2.1): GPT-2's architecture and
        // vocabulary, 40 layers of 40 heads of 128, a 2048-token context.
        // The table's d_model of 5140 is not 40 x 128; the width is 5120,
        // as in Megatron-LM's GPT-3 runs.
        "gpt3-13b" => DecoderConfig {
            max_seq_len: 2048,
            ..gpt2(5120, 40, 40)
        },
        "llama2-7b" => llama(32000, 4096, 32, 32, 32, 11008, 4096, 10000.0),
        "llama3-8b" => llama(128256, 4096, 32, 32, 8, 14336, 8192, 500000.0),
        "llama3-70b" => llama(128256, 8192, 80, 64, 8, 28672, 8192, 500000.0),
        "llama3.1-8b" => llama31(4096, 32, 32, 14336, 8.0, false),
        "llama3.1-70b" => llama31(8192, 80, 64, 28672, 8.0, false),
        "llama3.2-1b" => llama31(2048, 16, 32, 8192, 32.0, true),
        "llama3.2-3b" => llama31(3072, 28, 24, 8192, 32.0, true),
        "bloom-560m" => bloom(1024, 24, 16),
        "bloom-7b1" => bloom(4096, 30, 32),
        "bloom-176b" => bloom(14336, 70, 112),
        _ => return None,
    };
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_presets_have_published_parameter_counts() {
        // Counts of the Hugging Face checkpoints (tied heads counted once).
        let expected = [
            ("gpt2", 124_439_808),
            ("gpt2-medium", 354_823_168),
            ("gpt2-large", 774_030_080),
            ("gpt2-xl", 1_557_611_200),
            ("llama2-7b", 6_738_415_616),
            ("llama3-8b", 8_030_261_248),
            ("llama3-70b", 70_553_706_496),
            ("llama3.1-8b", 8_030_261_248),
            ("llama3.1-70b", 70_553_706_496),
            ("llama3.2-1b", 1_235_814_400),
            ("llama3.2-3b", 3_212_749_824),
            ("bloom-560m", 559_214_592),
            ("bloom-7b1", 7_069_016_064),
            ("bloom-176b", 176_247_271_424),
        ];
        for (name, count) in expected {
            assert_eq!(preset(name).unwrap().num_params(), count, "{name}");
        }
    }

    #[test]
    fn gpt3_13b_has_the_count_of_its_shape() {
        // Counted by hand (no checkpoint is published): per layer two
        // LayerNorms (4h), the QKV and output projections (4h^2 + 4h) and the
        // MLP (8h^2 + 5h); then token and position tables and the final norm.
        let (v, s, h, l) = (50257u64, 2048u64, 5120u64, 40u64);
        let count = l * (12 * h * h + 13 * h) + (v + s) * h + 2 * h;
        assert_eq!(count, 12_853_386_240);
        assert_eq!(preset("gpt3-13b").unwrap().num_params() as u64, count);
    }

    #[test]
    fn every_listed_preset_exists_and_validates() {
        for name in PRESET_NAMES {
            preset(name).unwrap().validate().unwrap();
        }
        assert!(preset("gpt5").is_none());
    }
}
