//! Each layer against a plain scalar implementation written from its definition.

use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use ferrotron_models::init::Init;
use ferrotron_models::layers::position::{Heads, PositionContext};
use ferrotron_models::layers::Norm;
use ferrotron_models::ops::{cross_entropy, rope_reference, AttentionBias, OpsChoice, Rope};
use ferrotron_models::Kernels;
use ferrotron_models::{NormKind, Position};

type B = Flex;

fn pseudo_random(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = (i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(seed.wrapping_mul(97));
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
        let norm = Norm::<B>::new(
            &Init::new(0, &Default::default()),
            "norm",
            (kind, h, 1e-5),
            Kernels::Reference,
        )
        .unwrap();
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
                    row.iter()
                        .map(|v| (v - mean) / (var + 1e-5).sqrt())
                        .collect()
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
    let ctx = PositionContext::<B>::new(
        &Position::Rope {
            theta,
            scaling: None,
        },
        &Heads::all(1),
        d,
        start,
        len,
        &OpsChoice::reference(),
        &Default::default(),
    );
    let Some(Rope::Tables(cos, sin)) = ctx.rope else {
        panic!("the reference context holds RoPE tables")
    };
    let x = pseudo_random(len * d, 2);
    let t: Tensor<B, 4> = Tensor::from_data(
        TensorData::new(x.clone(), [1, 1, len, d]),
        &Default::default(),
    );
    let y: Vec<f32> = rope_reference(t, &cos, &sin).into_data().to_vec().unwrap();
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
fn attention_bias_hides_exactly_the_future_keys_and_adds_alibi() {
    // 3 queries at positions 2, 3, 4 over 5 keys.
    let hidden = |q: usize, k: usize| k > 2 + q;
    let matrix = |position| match PositionContext::<B>::new(
        position,
        &Heads::all(2),
        4,
        2,
        3,
        &OpsChoice::reference(),
        &Default::default(),
    )
    .attn_bias
    {
        AttentionBias::Matrix(m) => m,
        AttentionBias::Causal { .. } | AttentionBias::Ring(_) => {
            panic!("the reference context holds a bias matrix")
        }
    };
    let m = matrix(&Position::Learned);
    assert_eq!(m.dims(), [1, 1, 3, 5]);
    let bias: Vec<f32> = m.into_data().to_vec().unwrap();
    for q in 0..3 {
        for k in 0..5 {
            let want = if hidden(q, k) { f32::NEG_INFINITY } else { 0.0 };
            assert_eq!(bias[q * 5 + k], want, "query {q} key {k}");
        }
    }
    let m = matrix(&Position::Alibi);
    assert_eq!(m.dims(), [1, 2, 3, 5]);
    let bias: Vec<f32> = m.into_data().to_vec().unwrap();
    // Two heads: slopes 1/16 and 1/256 (Press et al.: 2^(-8/n * h)).
    for (h, slope) in [(0, 1.0 / 16.0), (1, 1.0 / 256.0)] {
        for q in 0..3 {
            for k in 0..5 {
                let want = if hidden(q, k) {
                    f32::NEG_INFINITY
                } else {
                    slope * k as f32
                };
                assert_eq!(bias[h * 15 + q * 5 + k], want, "head {h} query {q} key {k}");
            }
        }
    }
}

#[test]
fn cross_entropy_is_the_mean_negative_log_likelihood() {
    let (t, v) = (4, 6);
    let logits = pseudo_random(t * v, 3);
    let targets = [0i64, 5, 2, 2];
    let got: f32 = cross_entropy(
        Kernels::Reference,
        tensor3(logits.clone(), [1, t, v]),
        Tensor::<B, 2, Int>::from_data(
            TensorData::new(targets.to_vec(), [1, t]),
            &Default::default(),
        ),
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

/// Goldfish's dropped tokens: negative targets are left out of the mean,
/// and the gradient of the loss with respect to their logits is zero; kept
/// rows get `(softmax - onehot) / kept`, computed here in f64.
#[test]
fn cross_entropy_ignores_negative_targets_in_the_mean_and_the_gradient() {
    type A = burn::backend::Autodiff<Flex>;
    let (t, v) = (6, 5);
    let logits = pseudo_random(t * v, 9);
    let targets = [4i64, -100, 0, -1, 2, 2];
    let device = Default::default();
    let x = Tensor::<A, 3>::from_data(TensorData::new(logits.clone(), [2, 3, v]), &device)
        .require_grad();
    let loss = cross_entropy(
        Kernels::Reference,
        x.clone(),
        Tensor::<A, 2, Int>::from_data(TensorData::new(targets.to_vec(), [2, 3]), &device),
    );
    let got = f64::from(loss.clone().into_scalar());
    let grad: Vec<f32> = x
        .grad(&loss.backward())
        .unwrap()
        .into_data()
        .to_vec()
        .unwrap();
    let kept = targets.iter().filter(|&&t| t >= 0).count() as f64;
    let mut want = 0.0;
    for (p, &target) in targets.iter().enumerate() {
        let row: Vec<f64> = logits[p * v..(p + 1) * v]
            .iter()
            .map(|&x| x as f64)
            .collect();
        let sum: f64 = row.iter().map(|x| x.exp()).sum();
        for (j, &r) in row.iter().enumerate() {
            let expected = if target < 0 {
                0.0
            } else {
                (r.exp() / sum - if j as i64 == target { 1.0 } else { 0.0 }) / kept
            };
            let g = f64::from(grad[p * v + j]);
            assert!(
                (g - expected).abs() < 1e-6,
                "row {p} column {j}: {g} vs {expected}"
            );
        }
        if target >= 0 {
            want += sum.ln() - row[target as usize];
        }
    }
    want /= kept;
    assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    // Every target ignored: the loss is 0 (not NaN).
    let none: f32 = cross_entropy(
        Kernels::Reference,
        tensor3(logits, [2, 3, v]),
        Tensor::<B, 2, Int>::from_data(TensorData::new(vec![-100i64; 6], [2, 3]), &device),
    )
    .into_scalar();
    assert_eq!(none, 0.0);
}

#[test]
fn gelu_tanh_matches_the_tanh_formula() {
    let x = pseudo_random(64, 4)
        .into_iter()
        .map(|v| v * 6.0)
        .collect::<Vec<_>>();
    let y: Vec<f32> = ferrotron_models::ops::gelu_tanh_reference(tensor3(x.clone(), [1, 8, 8]))
        .into_data()
        .to_vec()
        .unwrap();
    for (a, &v) in y.iter().zip(&x) {
        let v = v as f64;
        let want = 0.5
            * v
            * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh());
        assert!((*a as f64 - want).abs() < 1e-5, "{a} vs {want}");
    }
}
