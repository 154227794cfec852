//! Ferrotron's CPU operations for GELU-tanh, SwiGLU, RMSNorm, LayerNorm and
//! RoPE (`ops/<op>/cpu.rs`, one autodiff node each on flex) against Burn's
//! autodiff of the plain reference: outputs and every gradient on shapes
//! whose last dimension is no multiple of 8 (the vector tails) and on one
//! large enough to split over threads, a strided input, finite differences
//! of LayerNorm, and whole gpt and llama models.

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use ferrotron_engine::lm::CausalLm;
use ferrotron_models::ops::{
    gelu_tanh_reference, layer_norm, rms_norm, rope_reference, swiglu, KernelBackend, OpImpl,
};
use ferrotron_models::presets::preset;
use ferrotron_models::{Decoder, DecoderConfig, Kernels};

use crate::common;
use common::assert_gradients_match;

type Ad = Autodiff<Flex>;

/// `n` deterministic values in `[-scale, scale)`: [`common::values`]
/// scaled.
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    common::values(n, seed)
        .into_iter()
        .map(|v| v * scale)
        .collect()
}

fn read<B: burn::tensor::backend::Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().to_vec::<f32>().unwrap()
}

fn prim<B: burn::tensor::backend::Backend, const D: usize>(
    t: Tensor<B, D>,
) -> burn::tensor::ops::FloatTensor<B> {
    t.into_primitive().tensor()
}

fn float<B: burn::tensor::backend::Backend, const D: usize>(
    p: burn::tensor::ops::FloatTensor<B>,
) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

/// Every element within `1e-5` of the reference tensor's largest entry
/// (floored at `1e-3`).
fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * scale,
            "{what}[{i}]: {g} against {w} (scale {scale})"
        );
    }
}

/// The output and the gradients of `inputs` of `op`, for the loss
/// `sum(op(inputs) * r)` with a fixed random `r`.
fn run(
    inputs: &[(Vec<f32>, Vec<usize>)],
    r: &[f32],
    op: impl Fn(&[Tensor<Ad, 3>], &[Tensor<Ad, 1>]) -> Tensor<Ad, 3>,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let device = Default::default();
    let mut threes = Vec::new();
    let mut ones = Vec::new();
    for (v, shape) in inputs {
        let data = TensorData::new(v.clone(), shape.clone());
        match shape.len() {
            3 => threes.push(Tensor::<Ad, 3>::from_data(data, &device).require_grad()),
            _ => ones.push(Tensor::<Ad, 1>::from_data(data, &device).require_grad()),
        }
    }
    let y = op(&threes, &ones);
    let weights = Tensor::<Ad, 3>::from_data(TensorData::new(r.to_vec(), y.dims()), &device);
    let grads = (y.clone() * weights).sum().backward();
    let mut g: Vec<Vec<f32>> = threes
        .iter()
        .map(|t| read(t.grad(&grads).expect("gradient")))
        .collect();
    g.extend(ones.iter().map(|t| read(t.grad(&grads).expect("gradient"))));
    // The inputs are unchanged by the backward (which writes over buffers
    // it may only reuse when nothing else holds them).
    for (t, (v, _)) in threes.iter().zip(inputs) {
        assert_eq!(&read(t.clone()), v, "an input was overwritten");
    }
    (read(y), g)
}

/// The shapes: vector tails of 5 and 3 elements, and one of several
/// rayon tasks (111 000 elements, 3000 rows).
const SHAPES: [[usize; 3]; 3] = [[2, 3, 13], [1, 7, 83], [2, 1500, 37]];

fn check(
    name: &str,
    make: impl Fn([usize; 3], u64) -> Vec<(Vec<f32>, Vec<usize>)>,
    fused: impl Fn(&[Tensor<Ad, 3>], &[Tensor<Ad, 1>]) -> Tensor<Ad, 3>,
    reference: impl Fn(&[Tensor<Ad, 3>], &[Tensor<Ad, 1>]) -> Tensor<Ad, 3>,
) {
    for (i, shape) in SHAPES.into_iter().enumerate() {
        let inputs = make(shape, i as u64);
        let r = values(shape.iter().product(), 99 + i as u64, 1.0);
        let (y, g) = run(&inputs, &r, &fused);
        let (want_y, want_g) = run(&inputs, &r, &reference);
        assert_close(&y, &want_y, &format!("{name} {shape:?} output"));
        for (k, (g, w)) in g.iter().zip(&want_g).enumerate() {
            assert_close(g, w, &format!("{name} {shape:?} gradient {k}"));
        }
    }
}

#[test]
fn gelu_node_matches_the_reference() {
    check(
        "GELU",
        |s, seed| vec![(values(s.iter().product(), seed, 6.0), s.to_vec())],
        |x, _| float(Ad::cpu_gelu_tanh(prim(x[0].clone()))),
        |x, _| gelu_tanh_reference(x[0].clone()),
    );
}

#[test]
fn swiglu_node_matches_the_reference() {
    check(
        "SwiGLU",
        |s, seed| {
            let n = s.iter().product();
            vec![
                (values(n, seed, 6.0), s.to_vec()),
                (values(n, seed + 7, 2.0), s.to_vec()),
            ]
        },
        |x, _| float(Ad::cpu_swiglu(prim(x[0].clone()), prim(x[1].clone()))),
        |x, _| swiglu(Kernels::Reference, x[0].clone(), x[1].clone()),
    );
}

/// `x` (offset by 3, so LayerNorm's centring matters), a weight and a bias.
fn norm_inputs(s: [usize; 3], seed: u64) -> Vec<(Vec<f32>, Vec<usize>)> {
    let x = values(s.iter().product(), seed, 2.0)
        .into_iter()
        .map(|v| v + 3.0)
        .collect();
    let w = values(s[2], seed + 1, 1.0)
        .into_iter()
        .map(|v| v + 1.0)
        .collect();
    vec![
        (x, s.to_vec()),
        (w, vec![s[2]]),
        (values(s[2], seed + 2, 0.5), vec![s[2]]),
    ]
}

#[test]
fn rms_norm_node_matches_the_reference() {
    check(
        "RMSNorm",
        |s, seed| norm_inputs(s, seed)[..2].to_vec(),
        |x, w| {
            float(Ad::cpu_rms_norm(
                prim(x[0].clone()),
                prim(w[0].clone()),
                1e-5,
            ))
        },
        |x, w| rms_norm(Kernels::Reference, x[0].clone(), w[0].clone(), 1e-5),
    );
}

#[test]
fn layer_norm_node_matches_the_reference() {
    check(
        "LayerNorm",
        norm_inputs,
        |x, w| {
            float(Ad::cpu_layer_norm(
                prim(x[0].clone()),
                prim(w[0].clone()),
                prim(w[1].clone()),
                1e-5,
            ))
        },
        |x, w| {
            layer_norm(
                Kernels::Reference,
                x[0].clone(),
                w[0].clone(),
                w[1].clone(),
                1e-5,
            )
        },
    );
}

/// RoPE's node against autodiff of the reference, `x` as the decoder
/// makes it (the transposed view `[batch, heads, len, d]` of `[batch, len,
/// heads, d]`) and contiguous, on head dimensions whose half is no
/// multiple of 8 and on one shape of several rayon tasks; the forward on
/// flex itself too, and the input left unchanged.
#[test]
fn rope_node_matches_the_reference() {
    // (batch, heads, len, d, x as the transposed view)
    for (case, (batch, heads, len, d, view)) in [
        (2, 3, 7, 10, true),
        (1, 2, 5, 6, false),
        (4, 6, 160, 22, true),
    ]
    .into_iter()
    .enumerate()
    {
        let what = format!("RoPE b{batch} h{heads} len{len} d{d} view {view}");
        let device = Default::default();
        let n = batch * heads * len * d;
        let x_values = values(n, 20 + case as u64, 2.0);
        let x = |view: bool| -> Tensor<Ad, 4> {
            if view {
                let data = TensorData::new(x_values.clone(), [batch, len, heads, d]);
                Tensor::<Ad, 4>::from_data(data, &device).swap_dims(1, 2)
            } else {
                let data = TensorData::new(x_values.clone(), [batch, heads, len, d]);
                Tensor::<Ad, 4>::from_data(data, &device)
            }
        };
        // Tables of the decoder's form: angles duplicated over both halves.
        let angles: Vec<f32> = (0..len * d)
            .map(|j| (j / d) as f32 * 0.8f32.powi((j % d % (d / 2)) as i32))
            .collect();
        let table = |f: fn(f32) -> f32| {
            let v = angles.iter().map(|&a| f(a)).collect::<Vec<f32>>();
            Tensor::<Ad, 4>::from_data(TensorData::new(v, [1, 1, len, d]), &device)
        };
        let (cos, sin) = (table(f32::cos), table(f32::sin));
        let r = Tensor::<Ad, 4>::from_data(
            TensorData::new(values(n, 40 + case as u64, 1.0), [batch, heads, len, d]),
            &device,
        );
        let grad_of = |op: &dyn Fn(Tensor<Ad, 4>) -> Tensor<Ad, 4>| {
            let input = x(view).require_grad();
            let y = op(input.clone());
            let grads = (y.clone() * r.clone()).sum().backward();
            assert_eq!(
                read(input.clone()),
                read(x(view)),
                "{what}: input overwritten"
            );
            (read(y), read(input.grad(&grads).expect("gradient")))
        };
        let (y, g) =
            grad_of(&|x| float(Ad::cpu_rope(prim(x), prim(cos.clone()), prim(sin.clone()))));
        let (want_y, want_g) = grad_of(&|x| rope_reference(x, &cos, &sin));
        assert_close(&y, &want_y, &format!("{what}: output"));
        assert_close(&g, &want_g, &format!("{what}: gradient"));
        let plain = Flex::cpu_rope(
            prim(x(view).inner()),
            prim(cos.clone().inner()),
            prim(sin.clone().inner()),
        );
        assert_close(
            &read(float::<Flex, 4>(plain)),
            &want_y,
            &format!("{what}: flex"),
        );
    }
}

/// A transposed (strided) input is read as its elements, not its buffer;
/// the forward without autodiff (flex itself) gives the same output.
#[test]
fn strided_inputs_and_the_plain_backend_give_the_reference() {
    let v = values(4 * 13 * 3, 5, 3.0);
    let x = Tensor::<Flex, 3>::from_data(TensorData::new(v, [3, 13, 4]), &Default::default())
        .swap_dims(1, 2);
    let want = read(gelu_tanh_reference(x.clone()));
    assert_close(
        &read(float::<Flex, 3>(Flex::cpu_gelu_tanh(prim(x.clone())))),
        &want,
        "GELU",
    );
    let w = Tensor::<Flex, 1>::from_data(
        TensorData::new(values(13, 6, 1.0), [13]),
        &Default::default(),
    );
    let b = Tensor::<Flex, 1>::from_data(
        TensorData::new(values(13, 7, 1.0), [13]),
        &Default::default(),
    );
    let want = read(layer_norm(
        Kernels::Reference,
        x.clone(),
        w.clone(),
        b.clone(),
        1e-5,
    ));
    let got = Flex::cpu_layer_norm(prim(x.clone()), prim(w.clone()), prim(b), 1e-5);
    assert_close(&read(float::<Flex, 3>(got)), &want, "LayerNorm");
    let want = read(rms_norm(Kernels::Reference, x.clone(), w.clone(), 1e-5));
    let got = Flex::cpu_rms_norm(prim(x.clone()), prim(w), 1e-5);
    assert_close(&read(float::<Flex, 3>(got)), &want, "RMSNorm");
    let up = x.clone().mul_scalar(0.5);
    let want = read(swiglu(Kernels::Reference, x.clone(), up.clone()));
    let got = Flex::cpu_swiglu(prim(x), prim(up));
    assert_close(&read(float::<Flex, 3>(got)), &want, "SwiGLU");
}

/// LayerNorm's gradients of `x`, the weight and the bias against central
/// differences (step 1e-2) of the loss `sum(y * r)`, summed in f64 over
/// the fused forward's f32 outputs.
#[test]
fn layer_norm_gradients_match_finite_differences() {
    let s = [1, 3, 11];
    let inputs = norm_inputs(s, 3);
    let r = values(33, 4, 1.0);
    let loss = |x: &[f32], w: &[f32], b: &[f32]| -> f64 {
        let t3 = Tensor::<Flex, 3>::from_data(TensorData::new(x.to_vec(), s), &Default::default());
        let t1 = |v: &[f32]| {
            Tensor::<Flex, 1>::from_data(TensorData::new(v.to_vec(), [11]), &Default::default())
        };
        let y = read(float::<Flex, 3>(Flex::cpu_layer_norm(
            prim(t3),
            prim(t1(w)),
            prim(t1(b)),
            1e-5,
        )));
        y.iter().zip(&r).map(|(&y, &r)| y as f64 * r as f64).sum()
    };
    let (_, grads) = run(&inputs, &r, |x, w| {
        float(Ad::cpu_layer_norm(
            prim(x[0].clone()),
            prim(w[0].clone()),
            prim(w[1].clone()),
            1e-5,
        ))
    });
    let mut point: Vec<Vec<f32>> = inputs.iter().map(|(v, _)| v.clone()).collect();
    let h = 1e-2f32;
    for (k, grad) in grads.iter().enumerate() {
        for j in 0..grad.len() {
            let keep = point[k][j];
            point[k][j] = keep + h;
            let up = loss(&point[0], &point[1], &point[2]);
            point[k][j] = keep - h;
            let down = loss(&point[0], &point[1], &point[2]);
            point[k][j] = keep;
            let fd = (up - down) / (2.0 * h as f64);
            assert!(
                (grad[j] as f64 - fd).abs() <= 2e-3 * fd.abs().max(1.0),
                "input {k}[{j}]: {} against finite difference {fd}",
                grad[j]
            );
        }
    }
}

/// Every parameter's gradient, in module order.
struct Grads<'a, B: AutodiffBackend> {
    grads: &'a B::Gradients,
    out: Vec<Vec<f32>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Grads<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let g = param.val().grad(self.grads).expect("a gradient");
        self.out.push(read(g));
    }
}

/// A small model of `family` (hidden 60, ffn 100: vector tails of 4) with
/// `kernels`: whether it took the CPU operations, its loss and every
/// gradient.
fn model_run(family: &str, kernels: Option<Kernels>) -> (bool, f32, Vec<Vec<f32>>) {
    let config = DecoderConfig {
        vocab_size: 97,
        hidden_size: 60,
        n_layers: 2,
        n_heads: 6,
        n_kv_heads: if family == "llama-mini" { 2 } else { 6 },
        ffn_size: 100,
        max_seq_len: 32,
        kernels,
        ..preset(family).unwrap()
    };
    let device = Default::default();
    let model = Decoder::<Ad>::new(&config, 5, &device).unwrap();
    let tokens = |k: i64| {
        let v: Vec<i64> = (0..32).map(|i| (i * 37 + k * 11 + i / 5) % 97).collect();
        Tensor::<Ad, 2, burn::tensor::Int>::from_data(TensorData::new(v, [2, 16]), &device)
    };
    let loss = model.loss(tokens(0), tokens(1));
    let value = read(loss.clone())[0];
    let grads = loss.backward();
    let mut visitor = Grads::<Ad> {
        grads: &grads,
        out: Vec::new(),
    };
    model.visit(&mut visitor);
    let ops = model.ops();
    let elementwise = [ops.gelu_impl(), ops.swiglu_impl(), ops.rms_norm_impl()];
    let ops_on_cpu = elementwise.iter().all(|&op| op == OpImpl::Cpu);
    (ops_on_cpu, value, visitor.out)
}

/// A gpt-mini (LayerNorm, GELU) and a llama-mini (RMSNorm, SwiGLU) step on
/// the default CPU choice (these operations and the chunked head) gives
/// the loss and every gradient of `kernels = "reference"` (Burn's
/// operations, whole logits).
#[test]
fn gpt_and_llama_steps_give_the_reference_loss_and_gradients() {
    for family in ["gpt-mini", "llama-mini"] {
        let (cpu, loss, got) = model_run(family, None);
        let (cpu_ref, want_loss, want) = model_run(family, Some(Kernels::Reference));
        assert_eq!((cpu, cpu_ref), (true, false), "{family}: the choice");
        assert!(
            (loss - want_loss).abs() <= 1e-6 * want_loss,
            "{family}: loss {loss} against {want_loss}"
        );
        assert_gradients_match(family, &got, &want);
    }
}
