//! Criterion benchmark of the decoder's hot operations as the model calls
//! them (`ferrotron_models::ops`), forward + backward, on every compiled
//! backend: `fused` and `reference` on Burn's CubeCL backend over the wgpu
//! runtime (a GPU's Vulkan/Metal/DX12 driver, or Mesa's lavapipe on a CPU),
//! and over CUDA / HIP with the `cuda` / `rocm` features (GPU 0); `reference`
//! on `Autodiff<Flex>`, the default CPU backend. The same sweep as
//! `ferrotron bench kernels`, which also reports memory; this one is for
//! local runs with criterion's statistics. Benchmark ids are
//! `KERNEL/BACKEND-KERNELS/SHAPE`:
//!
//! ```sh
//! cargo bench -p ferrotron-models --bench kernels
//! cargo bench -p ferrotron-models --bench kernels -- attention/wgpu-fused  # a filter
//! cargo bench -p ferrotron-models --features cuda --bench kernels -- cuda
//! ```
//!
//! The wgpu device is opened through `ferrotron_kernels::wgpu_setup`
//! (autotune level `minimal` on a CPU adapter such as lavapipe, unless
//! `CUBECL_AUTOTUNE_LEVEL` is set). Each iteration runs the op, sums the output, back-propagates and waits
//! for the device (`Backend::sync`); inputs are built once per shape.

use std::time::Duration;

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Int, Tensor, TensorData};
use burn_wgpu::{CubeBackend, WgpuRuntime};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use ferrotron_models::layers::position::{Heads, PositionContext};
use ferrotron_models::ops::{
    attention, cross_entropy, layer_norm, rms_norm, rope, swiglu, KernelBackend,
};
use ferrotron_models::{Kernels, Position};

type Wgpu = Autodiff<CubeBackend<WgpuRuntime, f32, i32, u32>>;

/// Attention sequence lengths (batch 4, 8 heads, head dim 64).
const ATTENTION_SEQS: [usize; 3] = [256, 512, 1024];

fn random<B: Backend, const D: usize>(shape: [usize; D], device: &B::Device) -> Tensor<B, D> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
}

/// Times `op` forward + backward on `B` under `group/name/param`.
fn time<B: AutodiffBackend>(
    c: &mut Criterion,
    group: &str,
    name: &str,
    param: String,
    device: &B::Device,
    op: impl Fn() -> Tensor<B, 1>,
) {
    let mut g = c.benchmark_group(group);
    g.sample_size(10).warm_up_time(Duration::from_millis(500));
    g.bench_function(BenchmarkId::new(name, param), |bench| {
        bench.iter(|| {
            let _grads = op().backward();
            B::sync(device).expect("device sync");
        })
    });
    g.finish();
}

/// The decoder's position context for `seq` positions (RoPE base 10000,
/// causal mask, 8 heads of 64) in the form `kernels` wants.
fn positions<B: KernelBackend>(
    kernels: Kernels,
    seq: usize,
    dev: &B::Device,
) -> PositionContext<B> {
    let rope = Position::Rope {
        theta: 10_000.0,
        scaling: None,
    };
    PositionContext::new(
        &rope,
        &Heads::all(8),
        64,
        0,
        seq,
        kernels == Kernels::Fused,
        dev,
    )
}

/// Every op at its benchmark shapes on backend `B` with `kernels`.
fn sweep<B: AutodiffBackend + KernelBackend>(
    c: &mut Criterion,
    kernels: Kernels,
    name: &str,
    dev: &B::Device,
) {
    for seq in ATTENTION_SEQS {
        let [q, k, v] = [0; 3].map(|_| random::<B, 4>([4, 8, seq, 64], dev).require_grad());
        let bias = positions::<B>(kernels, seq, dev).attn_bias;
        time(
            c,
            "attention",
            name,
            format!("[4, 8, {seq}, 64]"),
            dev,
            || attention(q.clone(), k.clone(), v.clone(), &bias).sum(),
        );
    }
    let [gate, up] = [0; 2].map(|_| random::<B, 2>([4096, 2816], dev).require_grad());
    time(c, "swiglu", name, "[4096, 2816]".into(), dev, || {
        swiglu(kernels, gate.clone(), up.clone()).sum()
    });
    let x = random::<B, 3>([4, 1024, 1024], dev).require_grad();
    let [w, b] = [0; 2].map(|_| random::<B, 1>([1024], dev).require_grad());
    time(c, "rms_norm", name, "[4, 1024, 1024]".into(), dev, || {
        rms_norm(kernels, x.clone(), w.clone(), 1e-5).sum()
    });
    time(c, "layer_norm", name, "[4, 1024, 1024]".into(), dev, || {
        layer_norm(kernels, x.clone(), w.clone(), b.clone(), 1e-5).sum()
    });
    let x = random::<B, 4>([4, 8, 1024, 64], dev).require_grad();
    let table = positions::<B>(kernels, 1024, dev)
        .rope
        .expect("RoPE positions");
    time(c, "rope", name, "[4, 8, 1024, 64]".into(), dev, || {
        rope(x.clone(), &table).sum()
    });
    let (rows, vocab) = (512, 50257);
    let logits = random::<B, 3>([1, rows, vocab], dev).require_grad();
    let ids: Vec<i64> = (0..rows).map(|i| ((i * 7919) % vocab) as i64).collect();
    let targets = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, rows]), dev);
    time(
        c,
        "cross_entropy",
        name,
        format!("[{rows}, {vocab}]"),
        dev,
        || cross_entropy(kernels, logits.clone(), targets.clone()),
    );
}

fn kernels(c: &mut Criterion) {
    sweep::<Autodiff<Flex>>(c, Kernels::Reference, "flex-reference", &Default::default());
    let wgpu = ferrotron_kernels::wgpu_setup::default_device();
    sweep::<Wgpu>(c, Kernels::Fused, "wgpu-fused", &wgpu);
    sweep::<Wgpu>(c, Kernels::Reference, "wgpu-reference", &wgpu);
    #[cfg(feature = "cuda")]
    {
        type Cuda = Autodiff<ferrotron_models::ops::Cuda>;
        sweep::<Cuda>(c, Kernels::Fused, "cuda-fused", &Default::default());
        sweep::<Cuda>(c, Kernels::Reference, "cuda-reference", &Default::default());
    }
    #[cfg(feature = "rocm")]
    {
        type Rocm = Autodiff<ferrotron_models::ops::Rocm>;
        sweep::<Rocm>(c, Kernels::Fused, "rocm-fused", &Default::default());
        sweep::<Rocm>(c, Kernels::Reference, "rocm-reference", &Default::default());
    }
}

criterion_group!(benches, kernels);
criterion_main!(benches);
