//! The model a `bench train` run measures: a preset, a Hugging Face
//! `config.json`, or a family's switches, each with the shape flags on top.

use ferrotron_models::hf::{from_hf_config, Family};
use ferrotron_models::presets::{preset, PRESET_NAMES};
use ferrotron_models::{DecoderConfig, MlpKind, Position};

use super::args::{FamilyArg, TrainBenchArgs};
use super::record::Shape;
use crate::error::usage;

/// The configuration `args` describe, checked (the error names the flag).
///
/// Exactly one of `--preset`, `--hf-dir`, `--family` gives the base; the
/// shape flags replace its fields. A family base starts from the mini
/// preset of the family (Llama with RoPE theta 10000) and takes
/// `max_seq_len = --seq`. `--heads` without `--kv-heads` keeps a multi-head
/// base multi-head; `--hidden` without `--ffn` keeps a GELU base at
/// `ffn = 4 x hidden`.
pub fn resolve(args: &TrainBenchArgs) -> anyhow::Result<DecoderConfig> {
    let (mut c, flag) = match (&args.preset, &args.hf_dir, args.family) {
        (Some(name), None, None) => (
            preset(name).ok_or_else(|| {
                usage(format!(
                    "--preset: unknown preset '{name}'; available: {}",
                    PRESET_NAMES.join(", ")
                ))
            })?,
            "--preset",
        ),
        (None, Some(dir), None) => {
            let path = dir.join("config.json");
            let (_, c) = from_hf_config(&path)
                .map_err(|e| usage(format!("--hf-dir {}: {e}", dir.display())))?;
            (c, "--hf-dir")
        }
        (None, None, Some(family)) => (family_base(family, args.seq), "--family"),
        (None, None, None) => {
            return Err(usage(
                "bench train: give the model with --preset NAME, --hf-dir DIR or --family gpt|llama|bloom (plus shape flags)",
            ))
        }
        _ => {
            return Err(usage(
                "--preset, --hf-dir and --family: give only one of them",
            ))
        }
    };
    let multi_head = c.n_kv_heads == c.n_heads;
    let gelu_4h = c.mlp == MlpKind::GeluTanh && c.ffn_size == 4 * c.hidden_size;
    let set = |field: &mut usize, value: Option<usize>| {
        if let Some(v) = value {
            *field = v;
        }
    };
    set(&mut c.n_layers, args.layers);
    set(&mut c.hidden_size, args.hidden);
    set(&mut c.n_heads, args.heads);
    set(&mut c.vocab_size, args.vocab);
    set(&mut c.ffn_size, args.ffn);
    set(&mut c.n_kv_heads, args.kv_heads);
    if args.kv_heads.is_none() && multi_head {
        c.n_kv_heads = c.n_heads;
    }
    if args.ffn.is_none() && gelu_4h {
        c.ffn_size = 4 * c.hidden_size;
    }
    c.kernels = args.kernels;
    c.validate()
        .map_err(|e| usage(format!("{flag} with the shape flags: {e}")))?;
    if args.seq > c.max_seq_len {
        return Err(usage(format!(
            "--seq {} exceeds the model's max_seq_len {} ({flag})",
            args.seq, c.max_seq_len
        )));
    }
    Ok(c)
}

/// The switches of `family` (its mini preset's) at sequence length `seq`.
fn family_base(family: FamilyArg, seq: usize) -> DecoderConfig {
    let name = match family {
        FamilyArg::Gpt => "gpt-mini",
        FamilyArg::Llama => "llama-mini",
        FamilyArg::Bloom => "bloom-mini",
    };
    let mut c = preset(name).unwrap_or_else(|| unreachable!("{name} is a preset"));
    c.max_seq_len = seq.max(1);
    if let Position::Rope { theta, .. } = &mut c.position {
        *theta = 10000.0;
    }
    c
}

/// The shape of `c` as results record it.
pub fn shape(c: &DecoderConfig) -> Shape {
    let family = match Family::of(c) {
        Ok(Family::Gpt2) => "gpt",
        Ok(Family::Llama) => "llama",
        Ok(Family::Bloom) => "bloom",
        Err(_) => "custom",
    };
    Shape {
        family: family.into(),
        layers: c.n_layers,
        hidden: c.hidden_size,
        heads: c.n_heads,
        kv_heads: c.n_kv_heads,
        ffn: c.ffn_size,
        vocab: c.vocab_size,
        tied_head: c.tied_head,
        params: c.num_params() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(family: FamilyArg) -> TrainBenchArgs {
        TrainBenchArgs {
            family: Some(family),
            seq: 256,
            ..TrainBenchArgs::default()
        }
    }

    #[test]
    fn shape_flags_fill_a_family() {
        let a = TrainBenchArgs {
            layers: Some(6),
            hidden: Some(384),
            heads: Some(6),
            vocab: Some(50304),
            ..args(FamilyArg::Gpt)
        };
        let c = resolve(&a).unwrap();
        let s = shape(&c);
        assert_eq!(s.family, "gpt");
        assert_eq!((s.layers, s.hidden, s.heads, s.kv_heads), (6, 384, 6, 6));
        assert_eq!((s.ffn, s.vocab, s.tied_head), (1536, 50304, true));
        assert_eq!(c.max_seq_len, 256);
        let a = TrainBenchArgs {
            heads: Some(6),
            kv_heads: Some(2),
            ffn: Some(1024),
            ..args(FamilyArg::Llama)
        };
        let s = shape(&resolve(&a).unwrap());
        assert_eq!((s.family.as_str(), s.kv_heads, s.ffn), ("llama", 2, 1024));
        assert!(!s.tied_head);
    }

    #[test]
    fn bad_shapes_name_the_flag() {
        let a = TrainBenchArgs {
            heads: Some(5),
            ..args(FamilyArg::Gpt)
        };
        let e = resolve(&a).unwrap_err().to_string();
        assert!(e.contains("--family") && e.contains("n_heads"), "{e}");
        let a = TrainBenchArgs {
            preset: Some("gpt-mini".into()),
            ..args(FamilyArg::Gpt)
        };
        assert!(resolve(&a).unwrap_err().to_string().contains("only one"));
    }
}
