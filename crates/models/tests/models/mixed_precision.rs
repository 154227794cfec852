//! Mixed precision (`--precision bf16|fp16`) on the CPU backend, which
//! computes bf16 for real (bf16 storage; each op converts to f32,
//! computes, and rounds the result to bf16 to nearest even): every layer
//! against a plain f64 host reference that rounds where the layer should,
//! and the whole decoder's loss and f32 master gradients against the f32
//! model's.

use std::collections::BTreeMap;

use crate::common::values;
use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, FloatDType, Int, Tensor, TensorData};
use ferrotron_engine::lm::{CausalLm, LmUnits};
use ferrotron_engine::precision::Precision;
use ferrotron_models::init::Init;
use ferrotron_models::layers::{Linear, Norm};
use ferrotron_models::ops::{attention_reference, cross_entropy};
use ferrotron_models::presets::preset;
use ferrotron_models::{Decoder, DecoderConfig, Kernels, NormKind};

type B = Flex;

/// `v` rounded to bf16 (nearest even; the rounding is checked against a
/// bit-level reference in `ferrotron_engine::precision`).
fn bf16(mut v: Vec<f32>) -> Vec<f32> {
    Precision::Bf16.round_in_place(&mut v);
    v
}

fn tensor<const D: usize>(v: Vec<f32>, shape: [usize; D]) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(v, shape), &Default::default())
}

/// The values of `t` as f32, after checking its dtype.
fn read<const D: usize>(t: Tensor<B, D>, dtype: DType) -> Vec<f32> {
    assert_eq!(t.dtype(), dtype);
    t.cast(FloatDType::F32).into_data().to_vec::<f32>().unwrap()
}

/// Checks that every `got` is within `ulps` bf16 units in the last place
/// (2^-7 of the magnitude, at most) of `want`.
fn within_bf16_ulps(what: &str, got: &[f32], want: &[f32], ulps: f32) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ulp = 2f32.powi(-7) * w.abs().max(1e-6);
        assert!(
            (g - w).abs() <= ulps * ulp,
            "{what}[{i}]: {g} vs reference {w}"
        );
    }
}

#[test]
fn bf16_linear_is_the_rounded_product_of_rounded_operands() {
    let (m, k, n) = (6, 48, 5);
    let (x, w, b) = (values(m * k, 1), values(k * n, 2), values(n, 3));
    let layer = Linear::<B>::from_params(
        Param::from_tensor(tensor(w.clone(), [k, n])),
        Some(Param::from_tensor(tensor(b.clone(), [n]))),
        Kernels::Reference,
    );
    let x_low = tensor(x.clone(), [2, 3, k]).cast(FloatDType::BF16);
    let got = read(layer.forward(x_low), DType::BF16);
    // Reference: bf16 operands, an exact (f64) sum, rounded to bf16, plus
    // the bf16 bias, rounded again.
    let (x, w, b) = (bf16(x), bf16(w), bf16(b));
    let product: Vec<f32> = (0..m * n)
        .map(|i| {
            let (r, c) = (i / n, i % n);
            (0..k)
                .map(|j| f64::from(x[r * k + j]) * f64::from(w[j * n + c]))
                .sum::<f64>() as f32
        })
        .collect();
    let want = bf16(
        bf16(product)
            .iter()
            .enumerate()
            .map(|(i, p)| p + b[i % n])
            .collect(),
    );
    // One unit for the f32 accumulation order (a value near a rounding
    // boundary may round the other way), one for the bias addition.
    within_bf16_ulps("linear", &got, &want, 2.0);
}

#[test]
fn norms_compute_in_f32_and_return_the_input_dtype() {
    let (rows, h) = (4, 32);
    let x = values(rows * h, 4);
    let (gain, shift) = (values(h, 5), values(h, 6));
    for kind in [NormKind::LayerNorm, NormKind::RmsNorm] {
        let mut norm = Norm::<B>::new(
            &Init::new(0, &Default::default()),
            "norm",
            (kind, h, 1e-5),
            Kernels::Reference,
        )
        .unwrap();
        norm.weight = Param::from_tensor(tensor(gain.clone(), [h]));
        if let Some(bias) = norm.bias.as_mut() {
            *bias = Param::from_tensor(tensor(shift.clone(), [h]));
        }
        let x_low = tensor(x.clone(), [1, rows, h]).cast(FloatDType::BF16);
        let got = read(norm.forward(x_low), DType::BF16);
        // Reference in f64 on the bf16 input with the f32 gain, rounded once.
        let xr = bf16(x.clone());
        let mut want = Vec::new();
        for row in xr.chunks(h) {
            let row: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
            let mean = row.iter().sum::<f64>() / h as f64;
            let (centre, add) = match kind {
                NormKind::LayerNorm => (mean, true),
                NormKind::RmsNorm => (0.0, false),
            };
            let var = row.iter().map(|v| (v - centre).powi(2)).sum::<f64>() / h as f64;
            for (j, v) in row.iter().enumerate() {
                let y = (v - centre) / (var + 1e-5).sqrt() * f64::from(gain[j])
                    + if add { f64::from(shift[j]) } else { 0.0 };
                want.push(y as f32);
            }
        }
        within_bf16_ulps(&format!("{kind:?}"), &got, &bf16(want), 1.0);
    }
}

#[test]
fn bf16_attention_keeps_scores_and_softmax_in_f32() {
    let (heads, len, hd) = (2, 5, 8);
    let n = heads * len * hd;
    let (q, k, v) = (values(n, 7), values(n, 8), values(n, 9));
    let mask: Vec<f32> = (0..len * len)
        .map(|i| {
            if i % len > i / len {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    let low = |x: &Vec<f32>| tensor(x.clone(), [1, heads, len, hd]).cast(FloatDType::BF16);
    let got = read(
        attention_reference(low(&q), low(&k), low(&v), &tensor(mask, [1, 1, len, len])),
        DType::BF16,
    );
    // Reference: exact scores and softmax of the bf16 inputs, the
    // probabilities rounded to bf16, an exact product with v, rounded.
    let (q, k, v) = (bf16(q), bf16(k), bf16(v));
    let mut want = vec![0f32; n];
    for h in 0..heads {
        let at = |x: &[f32], t: usize, d: usize| f64::from(x[(h * len + t) * hd + d]);
        for i in 0..len {
            let scores: Vec<f64> = (0..=i)
                .map(|j| {
                    (0..hd).map(|d| at(&q, i, d) * at(&k, j, d)).sum::<f64>() / (hd as f64).sqrt()
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::MIN, f64::max);
            let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
            let p = bf16(
                scores
                    .iter()
                    .map(|s| ((s - max).exp() / total) as f32)
                    .collect(),
            );
            for d in 0..hd {
                let o: f64 = (0..=i).map(|j| f64::from(p[j]) * at(&v, j, d)).sum();
                want[(h * len + i) * hd + d] = o as f32;
            }
        }
    }
    // The softmax's f32 rounding may move a probability across a bf16
    // boundary: one unit there, one for the output's rounding.
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    for (i, (g, w)) in got.iter().zip(bf16(want)).enumerate() {
        assert!(
            (g - w).abs() <= 2.0 * 2f32.powi(-7) * scale,
            "attention[{i}]: {g} vs reference {w}"
        );
    }
}

#[test]
fn cross_entropy_of_bf16_logits_is_f32() {
    let (rows, vocab) = (6, 11);
    let logits = bf16(values(rows * vocab, 10).iter().map(|x| 4.0 * x).collect());
    let targets: Vec<i64> = (0..rows as i64).map(|i| (i * 5) % vocab as i64).collect();
    let t = Tensor::<B, 2, Int>::from_data(
        TensorData::new(targets.clone(), [1, rows]),
        &Default::default(),
    );
    let low = tensor(logits.clone(), [1, rows, vocab]).cast(FloatDType::BF16);
    let got = read(cross_entropy(Kernels::Reference, low, t), DType::F32)[0];
    let want: f64 = logits
        .chunks(vocab)
        .zip(&targets)
        .map(|(row, &t)| {
            let max = row.iter().cloned().fold(f32::MIN, f32::max) as f64;
            let lse = max
                + row
                    .iter()
                    .map(|&x| (f64::from(x) - max).exp())
                    .sum::<f64>()
                    .ln();
            lse - f64::from(row[t as usize])
        })
        .sum::<f64>()
        / rows as f64;
    assert!((f64::from(got) - want).abs() < 1e-5, "{got} vs {want}");
}

type AB = Autodiff<Flex>;

/// Gradients of every float parameter by name, checking they are f32
/// (the master weights' dtype).
struct Grads<'a> {
    path: Vec<String>,
    grads: &'a <AB as AutodiffBackend>::Gradients,
    out: BTreeMap<String, Vec<f32>>,
}

impl ModuleVisitor<AB> for Grads<'_> {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
        let name = self.path.join(".");
        let g = param
            .val()
            .grad(self.grads)
            .expect("every parameter has a gradient");
        assert_eq!(g.dtype(), DType::F32, "{name}: the master gradient is f32");
        self.out
            .insert(name, g.into_data().to_vec::<f32>().unwrap());
    }
}

/// Loss and gradients of a small model of `family` computed in
/// `precision`, its attention core recomputed in backward if `selective`.
fn loss_and_grads(
    family: &str,
    precision: Precision,
    selective: bool,
) -> (f32, BTreeMap<String, Vec<f32>>) {
    let config = DecoderConfig {
        vocab_size: 96,
        // Divisible by the presets' 4 (GPT, Llama) and 6 (BLOOM) heads.
        hidden_size: 96,
        n_layers: 2,
        ffn_size: 192,
        max_seq_len: 32,
        kernels: Some(Kernels::Reference),
        precision,
        ..preset(family).unwrap()
    };
    let device = Default::default();
    let model = Decoder::<AB>::new(&config, 11, &device)
        .unwrap()
        .with_attention_recompute(selective);
    let ids: Vec<i64> = (0..2 * 17).map(|i| (i * 37 + i / 5) % 96).collect();
    let at = |from: usize| {
        let rows: Vec<i64> = ids
            .chunks(17)
            .flat_map(|r| r[from..from + 16].to_vec())
            .collect();
        Tensor::<AB, 2, Int>::from_data(TensorData::new(rows, [2, 16]), &device)
    };
    let loss = model.loss(at(0), at(1));
    assert_eq!(loss.dtype(), DType::F32, "{family}: the loss is f32");
    let value = loss.clone().into_data().to_vec::<f32>().unwrap()[0];
    let grads = loss.backward();
    let mut visitor = Grads {
        path: Vec::new(),
        grads: &grads,
        out: BTreeMap::new(),
    };
    model.visit(&mut visitor);
    (value, visitor.out)
}

/// The decoder in bf16 and fp16: the loss within 1e-3 of the f32 model's
/// and every f32 master gradient within 5% (relative L2) of the f32
/// model's, for the three families. bf16 keeps 8 significant bits
/// (relative rounding up to 2^-9 per op): the loss, a mean over 32 tokens
/// of f32 cross-entropies of rounded logits, moves by far less (measured
/// 7e-5 at most), a gradient by a few roundings (measured 1.2e-2 relative
/// L2 at most in bf16; fp16, unscaled here, loses its smallest gradients
/// to underflow: 2.2e-2). A layer computed wrongly, or a gradient lost at
/// a cast, is off by order one. bf16 with `--recompute selective` (the
/// attention core's gradient recomputed in f32 from the bf16 q, k, v) is
/// held to the same bounds.
#[test]
fn low_precision_decoder_follows_the_f32_loss_and_gradients() {
    for family in ["gpt-mini", "llama-mini", "bloom-mini"] {
        let (want_loss, want) = loss_and_grads(family, Precision::Fp32, false);
        for (precision, selective) in [
            (Precision::Bf16, false),
            (Precision::Fp16, false),
            (Precision::Bf16, true),
        ] {
            let (loss, got) = loss_and_grads(family, precision, selective);
            let rel = (loss - want_loss).abs() / want_loss;
            eprintln!("{family} {precision}: loss {loss} vs f32 {want_loss} (rel {rel:e})");
            assert!(
                rel < 1e-3,
                "{family} {precision}: loss {loss} vs {want_loss}"
            );
            assert_ne!(loss, want_loss, "{family} {precision}: computed in f32?");
            let mut worst = (0f32, String::new());
            for (name, w) in &want {
                // Zero in exact arithmetic (softmax ignores a shift of a row).
                if name.ends_with("attn.k.bias") {
                    continue;
                }
                let g = &got[name];
                let err: f32 = g
                    .iter()
                    .zip(w)
                    .map(|(a, b)| (a - b).powi(2))
                    .sum::<f32>()
                    .sqrt();
                let norm: f32 = w.iter().map(|b| b * b).sum::<f32>().sqrt();
                if err / norm > worst.0 {
                    worst = (err / norm, name.clone());
                }
            }
            eprintln!(
                "{family} {precision}: worst gradient {} within {:e}",
                worst.1, worst.0
            );
            assert!(
                worst.0 < 0.05,
                "{family} {precision}: gradient {} off by {:e}",
                worst.1,
                worst.0
            );
        }
    }
}
