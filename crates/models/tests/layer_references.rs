//! Each layer against a plain scalar implementation written from its definition.

use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use ferrotron_models::decoder::cross_entropy;
use ferrotron_models::layers::position::{apply_rope, PositionContext};
use ferrotron_models::layers::Norm;
use ferrotron_models::{NormKind, Position};

type B = Flex;

fn pseudo_random(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = (i as u32).wrapping_mul(2654435761).wrapping_add(seed.wrapping_mul(97));
            ((x >> 8) % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn tensor3(v: Vec<f32>, shape: [usize; 3]) -> Tensor<B, 3> {
    Tensor::from_data(TensorData::new(v, shape), &Default::default())
}

#[test]
fn norms_match_their_definitions() {
    let (rows, h) = (3, 8);
    let x = pseudo_random(rows * h, 1);
    for kind in [NormKind::LayerNorm, NormKind::RmsNorm] {
        let norm = Norm::<B>::new(kind, h, 1e-5, &Default::default());
        let y: Vec<f32> = norm
            .forward(tensor3(x.clone(), [1, rows, h]))
            .into_data()
            .to_vec()
            .unwrap();
        for r in 0..rows {
            let row: Vec<f64> = x[r * h..(r + 1) * h].iter().map(|&v| v as f64).collect();
            let mean = row.iter().sum::<f64>() / h as f64;
            let want: Vec<f64> = match kind {
                NormKind::LayerNorm => {
                    let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / h as f64;
                    row.iter().map(|v| (v - mean) / (var + 1e-5).sqrt()).collect()
                }
                NormKind::RmsNorm => {
                    let ms = row.iter().map(|v| v * v).sum::<f64>() / h as f64;
                    row.iter().map(|v| v / (ms + 1e-5).sqrt()).collect()
                }
            };
            for (a, b) in y[r * h..(r + 1) * h].iter().zip(want) {
                assert!((*a as f64 - b).abs() < 1e-5, "{kind:?}: {a} vs {b}");
            }
        }
    }
}

#[test]
fn rope_rotates_each_pair_by_position_times_frequency() {
    let (len, d, start, theta) = (5, 8, 3, 10000.0);
    let ctx = PositionContext::<B>::new(&Position::Rope { theta }, 1, d, start, len, &Default::default());
    let (cos, sin) = ctx.rope.unwrap();
    let x = pseudo_random(len * d, 2);
    let t: Tensor<B, 4> = Tensor::from_data(TensorData::new(x.clone(), [1, 1, len, d]), &Default::default());
    let y: Vec<f32> = apply_rope(t, &cos, &sin).into_data().to_vec().unwrap();
    for p in 0..len {
        for i in 0..d / 2 {
            let angle = (start + p) as f64 * theta.powf(-2.0 * i as f64 / d as f64);
            let (a, b) = (x[p * d + i] as f64, x[p * d + i + d / 2] as f64);
            let want_a = a * angle.cos() - b * angle.sin();
            let want_b = b * angle.cos() + a * angle.sin();
            assert!((y[p * d + i] as f64 - want_a).abs() < 1e-5);
            assert!((y[p * d + i + d / 2] as f64 - want_b).abs() < 1e-5);
        }
    }
}

#[test]
fn causal_mask_hides_exactly_the_future_keys() {
    let ctx = PositionContext::<B>::new(&Position::Learned, 1, 4, 2, 3, &Default::default());
    let mask: Vec<bool> = ctx.causal_mask.into_data().to_vec().unwrap();
    // 3 queries at positions 2, 3, 4 over 5 keys.
    let want = [
        false, false, false, true, true, //
        false, false, false, false, true, //
        false, false, false, false, false,
    ];
    assert_eq!(mask, want);
}

#[test]
fn cross_entropy_is_the_mean_negative_log_likelihood() {
    let (t, v) = (4, 6);
    let logits = pseudo_random(t * v, 3);
    let targets = [0i64, 5, 2, 2];
    let got: f32 = cross_entropy(
        tensor3(logits.clone(), [1, t, v]),
        Tensor::<B, 2, Int>::from_data(TensorData::new(targets.to_vec(), [1, t]), &Default::default()),
    )
    .into_scalar();
    let mut want = 0.0;
    for (p, &target) in targets.iter().enumerate() {
        let row = &logits[p * v..(p + 1) * v];
        let lse = row.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
        want += lse - row[target as usize] as f64;
    }
    want /= t as f64;
    assert!((got as f64 - want).abs() < 1e-6, "{got} vs {want}");
}
