//! The fused kernels inside the whole decoder: tiny GPT, Llama and BLOOM
//! models on Burn's CubeCL backend (wgpu runtime; Mesa's lavapipe, a Vulkan
//! driver running on the CPU, in CI) with `kernels = "fused"` must give the
//! logits, the loss and every parameter gradient of the same models with
//! `kernels = "reference"` on the default CPU backend. The same seed gives
//! the same initial weights on both backends. With `fused` the head and the
//! loss run chunked (`ops::linear_cross_entropy::cube`), so the loss and the
//! gradients check it inside the model too.
//!
//! The device is opened through `ferrotron_kernels::wgpu_setup`, which sets
//! cubecl's autotune level to `minimal` on lavapipe (Burn's matmul
//! autotuning otherwise takes minutes there).

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use burn_wgpu::{CubeBackend, WgpuRuntime};
use ferrotron_engine::lm::{CausalLm, LmUnits};
use ferrotron_engine::precision::Precision;
use ferrotron_kernels::attention::MatrixUnits;
use ferrotron_kernels::wgpu_setup::default_device;
use ferrotron_models::ops::{HeadLoss, OpImpl, TrainBackend};
use ferrotron_models::presets::preset;
use ferrotron_models::{Decoder, DecoderConfig, Kernels, KvCache, Position, RopeScaling};

type Gpu = Autodiff<CubeBackend<WgpuRuntime, f32, i32, u32>>;
type Cpu = Autodiff<Flex>;

/// Largest error allowed, relative to the largest magnitude of the
/// reference tensor it is measured on (f32 kernels vs f32 Burn ops whose
/// sums run in a different order; seen: gradients 6.1e-7).
const TOLERANCE: f32 = 1e-5;

/// Bounds of `fused_decoder_in_fp16_follows_the_fp16_reference`.
const FP16_LOGITS: f32 = 1.5e-3;
const FP16_LOSS: f32 = 1e-5;
const FP16_GRADS: f32 = 6e-3;

/// A small model of family `name`; Llama gets Llama 3.1 RoPE scaling over a
/// 16-token original context, so the scaled inverse frequencies (the fused
/// kernel's input) change the 19 positions the tests run.
fn tiny(name: &str, kernels: Kernels) -> DecoderConfig {
    let mut c = DecoderConfig {
        vocab_size: 96,
        hidden_size: 96,
        n_layers: 2,
        ffn_size: 112,
        max_seq_len: 32,
        kernels: Some(kernels),
        precision: Default::default(),
        attention_matrix_units: MatrixUnits::Off,
        ..preset(name).unwrap()
    };
    if let Position::Rope { scaling, .. } = &mut c.position {
        *scaling = Some(RopeScaling::Llama3 {
            factor: 4.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 16,
        });
    }
    c
}

/// What one forward + backward produced, on the host.
struct Pass {
    logits: Vec<f32>,
    loss: f32,
    /// Each parameter's gradient, in the model's visiting order.
    grads: Vec<Vec<f32>>,
}

/// Collects every parameter gradient, in visiting order.
struct Grads<'a> {
    grads: &'a GradientsParams,
    out: Vec<Vec<f32>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Grads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let grad = self.grads.get::<B::InnerBackend, D>(param.id).unwrap();
        self.out.push(host(grad));
    }
}

fn host<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().unwrap()
}

/// Odd sequence length (19) and batch 2; targets are the inputs shifted.
fn tokens<B: Backend>(vocab: usize, device: &B::Device) -> [Tensor<B, 2, Int>; 2] {
    let (batch, seq) = (2, 19);
    let ids: Vec<i64> = (0..batch * (seq + 1))
        .map(|i| ((i * 37 + i / 5) % vocab) as i64)
        .collect();
    let all = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [batch, seq + 1]), device);
    [all.clone().narrow(1, 0, seq), all.narrow(1, 1, seq)]
}

fn pass<B: TrainBackend>(config: &DecoderConfig, device: &B::Device) -> Pass {
    let model = Decoder::<B>::new(config, 7, device).unwrap();
    assert_eq!(model.kernels(), config.kernels.unwrap());
    let [inputs, targets] = tokens::<B>(config.vocab_size, device);
    let logits = host(model.forward(inputs.clone()).detach());
    let loss = model.loss(inputs, targets);
    let loss_value = host(loss.clone())[0];
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let mut visitor = Grads {
        grads: &grads,
        out: Vec::new(),
    };
    model.visit(&mut visitor);
    Pass {
        logits,
        loss: loss_value,
        grads: visitor.out,
    }
}

/// Largest `|got - want|` over the largest `|want|`.
fn relative_error(got: &[f32], want: &[f32]) -> f32 {
    error_over(got, want, 1e-12)
}

/// Largest `|got - want|` over the largest `|want|`, or over `floor` when
/// that is larger.
fn error_over(got: &[f32], want: &[f32], floor: f32) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(floor);
    let err = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
    err / scale
}

#[test]
fn fused_decoder_equals_reference_decoder_for_every_family() {
    let gpu = default_device();
    for family in ["gpt-mini", "llama-mini", "bloom-mini"] {
        let fused = pass::<Gpu>(&tiny(family, Kernels::Fused), &gpu);
        let reference = pass::<Cpu>(&tiny(family, Kernels::Reference), &Default::default());
        let err = relative_error(&fused.logits, &reference.logits);
        assert!(err < TOLERANCE, "{family}: logits differ by {err}");
        let err = (fused.loss - reference.loss).abs() / reference.loss;
        assert!(
            err < TOLERANCE,
            "{family}: loss {} vs {}",
            fused.loss,
            reference.loss
        );
        assert_eq!(fused.grads.len(), reference.grads.len());
        // Some gradients are zero in exact arithmetic (the key bias: adding
        // a constant to every score of a row leaves the softmax unchanged),
        // so each error is measured against the tensor's largest magnitude
        // or a thousandth of the largest gradient of the model, whichever is
        // larger.
        let largest = reference
            .grads
            .iter()
            .flatten()
            .fold(0f32, |m, v| m.max(v.abs()));
        for (i, (got, want)) in fused.grads.iter().zip(&reference.grads).enumerate() {
            let err = error_over(got, want, largest * 1e-3);
            assert!(
                err < TOLERANCE,
                "{family}: gradient of parameter {i} differs by {err}"
            );
        }
    }
}

/// The fused kernels in 16 bits (`--precision fp16` on wgpu: attention,
/// SwiGLU and RoPE read and write f16, computing in f32 inside) against
/// the reference decoder in fp16 on the CPU (Burn's operations in f16,
/// attention scores and softmax in f32 as `ops::attention_reference`
/// does), for Llama (RoPE, SwiGLU, grouped-query attention; ALiBi's f16
/// attention is in the kernel tests, and each model here costs minutes of
/// lavapipe compilation). The two round differently (the fused ops once
/// per output, the reference after each operation), so they agree to
/// f16's resolution carried through two layers, not to f32's: f16's unit
/// roundoff is 2^-11 = 4.9e-4. Measured on lavapipe: logits 7.2e-4 of
/// their largest, loss 2.2e-6 relative, the worst gradient 1.4e-3 (BLOOM,
/// run once: 1.1e-4, 3.1e-7, 2.7e-3); the bounds are about twice the
/// largest of both. A kernel that read f16 as f32, or rounded to a
/// coarser type, is off by orders of magnitude.
#[test]
fn fused_decoder_in_fp16_follows_the_fp16_reference() {
    let gpu = default_device();
    let config = |kernels| DecoderConfig {
        precision: Precision::Fp16,
        ..tiny("llama-mini", kernels)
    };
    let fused = pass::<Gpu>(&config(Kernels::Fused), &gpu);
    let reference = pass::<Cpu>(&config(Kernels::Reference), &Default::default());
    let err = relative_error(&fused.logits, &reference.logits);
    println!("fp16: logits differ by {err}");
    assert!(err < FP16_LOGITS, "fp16: logits differ by {err}");
    let err = (fused.loss - reference.loss).abs() / reference.loss;
    println!("fp16: loss differs by {err}");
    assert!(
        err < FP16_LOSS,
        "fp16: loss {} vs {}",
        fused.loss,
        reference.loss
    );
    let largest = reference
        .grads
        .iter()
        .flatten()
        .fold(0f32, |m, v| m.max(v.abs()));
    let worst = fused
        .grads
        .iter()
        .zip(&reference.grads)
        .map(|(got, want)| error_over(got, want, largest * 1e-3))
        .fold(0f32, f32::max);
    println!("fp16: gradients differ by {worst} at most");
    assert!(worst < FP16_GRADS, "fp16: a gradient differs by {worst}");
}

/// ZeRO-3 runs blocks through `LmUnits` and recomputes them under
/// autodiff: the staged loss with fused kernels is the whole-model loss.
#[test]
fn fused_staged_forward_composes_to_the_loss() {
    let gpu = default_device();
    let config = tiny("llama-mini", Kernels::Fused);
    let model = Decoder::<Gpu>::new(&config, 7, &gpu).unwrap();
    let [inputs, targets] = tokens::<Gpu>(config.vocab_size, &gpu);
    let whole = host(model.loss(inputs.clone(), targets.clone()))[0];
    let (mut x, context) = model.embed(inputs);
    for i in 0..model.num_blocks() {
        x = model.block(i, x, &context);
    }
    let staged = host(model.head_loss(x, targets))[0];
    assert!(
        (whole - staged).abs() <= 1e-6 * whole.abs(),
        "{whole} vs {staged}"
    );
}

/// Decoding with a KV cache runs the reference attention and RoPE on the
/// GPU backend (queries and keys differ in length) with the fused norms and
/// SwiGLU: prompt then one token at a time gives the logits of one fused
/// forward over the whole sequence.
#[test]
fn fused_cached_decoding_equals_the_fused_full_forward() {
    let gpu = default_device();
    for family in ["gpt-mini", "llama-mini", "bloom-mini"] {
        let config = tiny(family, Kernels::Fused);
        let model = Decoder::<Gpu>::new(&config, 7, &gpu).unwrap();
        let [inputs, _] = tokens::<Gpu>(config.vocab_size, &gpu);
        let inputs = inputs.narrow(0, 0, 1);
        let len = inputs.dims()[1];
        let full = host(model.forward(inputs.clone()));
        let mut cache = KvCache::new(config.n_layers);
        let mut cached = host(model.forward_cached(inputs.clone().narrow(1, 0, 5), &mut cache));
        for t in 5..len {
            let next = inputs.clone().narrow(1, t, 1);
            cached.extend(host(model.forward_cached(next, &mut cache)));
        }
        let err = relative_error(&cached, &full);
        assert!(err < TOLERANCE, "{family}: cached logits differ by {err}");
    }
}

/// Goldfish's dropped tokens reach the fused kernel as negative ids: the
/// fused cross-entropy on the GPU backend gives the loss and the logits'
/// gradient of the reference one (which leaves them out), zero rows
/// included.
#[test]
fn fused_cross_entropy_ignores_negative_targets_like_the_reference() {
    fn run<B: TrainBackend>(kernels: Kernels, device: &B::Device) -> (f32, Vec<f32>) {
        let (rows, vocab) = (7, 33);
        let values: Vec<f32> = (0..rows * vocab)
            .map(|i| ((i * 29 % 41) as f32 - 20.0) / 7.0)
            .collect();
        let targets = vec![3i64, -100, 32, 0, -100, -100, 17];
        let logits = Tensor::<B, 3>::from_data(TensorData::new(values, [1, rows, vocab]), device)
            .require_grad();
        let loss = ferrotron_models::ops::cross_entropy(
            kernels,
            logits.clone(),
            Tensor::from_data(TensorData::new(targets, [1, rows]), device),
        );
        let value = host(loss.clone())[0];
        let grad = logits.grad(&loss.backward()).unwrap();
        (value, host(grad))
    }
    let (fused, fused_grad) = run::<Gpu>(Kernels::Fused, &default_device());
    let (reference, reference_grad) = run::<Cpu>(Kernels::Reference, &Default::default());
    assert!(
        (fused - reference).abs() <= TOLERANCE * reference.abs(),
        "{fused} vs {reference}"
    );
    let err = relative_error(&fused_grad, &reference_grad);
    assert!(err < TOLERANCE, "gradients differ by {err}");
    for row in [1, 4, 5] {
        assert!(fused_grad[row * 33..(row + 1) * 33]
            .iter()
            .all(|&g| g == 0.0));
    }
}

#[test]
fn fused_forward_without_autodiff_equals_the_autodiff_forward() {
    // Validation and sampling run the model on the inner backend, where
    // each fused op is its forward alone (no graph node).
    type Inner = CubeBackend<WgpuRuntime, f32, i32, u32>;
    let gpu = default_device();
    let config = tiny("gpt-mini", Kernels::Fused);
    let [inputs, _] = tokens::<Gpu>(config.vocab_size, &gpu);
    let tracked = Decoder::<Gpu>::new(&config, 7, &gpu).unwrap();
    let want = host(tracked.forward(inputs.clone()).detach());
    let inner = Decoder::<Inner>::new(&config, 7, &gpu).unwrap();
    let got = host(inner.forward(inputs.inner()));
    assert_eq!(got, want);
}

#[test]
fn fused_kernels_are_refused_on_a_cpu_backend() {
    let err =
        Decoder::<Cpu>::new(&tiny("gpt-mini", Kernels::Fused), 0, &Default::default()).unwrap_err();
    assert_eq!(err.field, "kernels");
    assert!(err.problem.contains("no fused kernels"), "{}", err.problem);
}

#[test]
fn the_default_is_fused_on_cubecl_and_reference_on_the_cpu() {
    let config = DecoderConfig {
        kernels: None,
        precision: Default::default(),
        attention_matrix_units: MatrixUnits::Off,
        ..tiny("gpt-mini", Kernels::Fused)
    };
    let gpu = Decoder::<Gpu>::new(&config, 0, &default_device()).unwrap();
    assert_eq!(gpu.kernels(), Kernels::Fused);
    assert_eq!(gpu.ops().head_loss(), HeadLoss::Chunked);
    assert_eq!(gpu.ops().gelu_impl(), OpImpl::Fused);
    assert_eq!(gpu.ops().bias_impl(), OpImpl::Fused);
    assert_eq!(gpu.ops().embedding_impl(), OpImpl::Fused);
    let cpu = Decoder::<Cpu>::new(&config, 0, &Default::default()).unwrap();
    assert_eq!(cpu.kernels(), Kernels::Reference);
    assert_eq!(cpu.ops().bias_impl(), OpImpl::Reference);
    assert_eq!(cpu.ops().embedding_impl(), OpImpl::Reference);
    let reference =
        Decoder::<Gpu>::new(&tiny("gpt-mini", Kernels::Reference), 0, &default_device());
    assert_eq!(reference.unwrap().ops().head_loss(), HeadLoss::Logits);
}
