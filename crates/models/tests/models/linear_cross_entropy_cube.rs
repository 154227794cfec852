//! The chunked head on the CubeCL backend (wgpu runtime; Mesa's lavapipe
//! in CI), `ops::linear_cross_entropy::cube`: blocks of rows through Burn's
//! matmul and the fused cross-entropy kernel's row passes, against the
//! plain reference (`linear_cross_entropy_reference`: the whole logits,
//! Burn's log-softmax, autodiff) on the same backend, in f32 and f16 (the
//! 16-bit type lavapipe has; bf16 has no WGSL type), with a ragged last
//! block and ignored targets; the autodiff node with an upstream gradient;
//! and the device memory the blocks save.

use crate::common::values;
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Int, Tensor, TensorData, TensorPrimitive};
use burn_cubecl::cubecl::Runtime;
use burn_wgpu::{CubeBackend, WgpuRuntime};
use ferrotron_kernels::wgpu_setup::default_device;
use ferrotron_models::ops::{
    block_rows_of, linear_cross_entropy_cube_blocks, linear_cross_entropy_reference, FusedKernels,
    KernelBackend, BLOCK_BYTES,
};

type Gpu = CubeBackend<WgpuRuntime, f32, i32, u32>;
type GpuAd = Autodiff<Gpu>;

/// `v` `[shape]` on the GPU, in `dtype`.
fn gpu(v: &[f32], shape: [usize; 2], dtype: FloatDType) -> Tensor<Gpu, 2> {
    Tensor::<Gpu, 2>::from_data(TensorData::new(v.to_vec(), shape), &default_device()).cast(dtype)
}

fn ids<B: Backend>(v: &[i64]) -> Tensor<B, 1, Int> {
    Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), &Default::default())
}

fn read<const D: usize, B: Backend>(t: Tensor<B, D>) -> Vec<f32> {
    t.cast(FloatDType::F32).into_data().to_vec::<f32>().unwrap()
}

/// `max |a - b|` over `max |b|`.
fn relative_gap(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let gap = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    gap / b.iter().map(|y| y.abs()).fold(f32::MIN_POSITIVE, f32::max)
}

/// The inputs of one case: `x` `[rows, hidden]`, the weight `[hidden,
/// vocab]` (values up to 3, so the logits spread over several nats) and
/// targets with every 7th ignored.
struct Case {
    dims: [usize; 3],
    x: Vec<f32>,
    w: Vec<f32>,
    targets: Vec<i64>,
}

impl Case {
    fn new(dims @ [rows, hidden, vocab]: [usize; 3]) -> Self {
        let targets = (0..rows as i64)
            .map(|i| {
                if i % 7 == 3 {
                    -100
                } else {
                    (i * 5) % vocab as i64
                }
            })
            .collect();
        Self {
            dims,
            x: values(rows * hidden, 1),
            w: values(hidden * vocab, 2).iter().map(|v| 3.0 * v).collect(),
            targets,
        }
    }

    /// Loss and `[d_x, d_w]` of the plain reference on the autodiff GPU
    /// backend, the inputs in `dtype`, for an upstream gradient `upstream`.
    fn reference(&self, dtype: FloatDType, upstream: f32) -> (f32, [Vec<f32>; 2]) {
        let [rows, hidden, vocab] = self.dims;
        let x = Tensor::<GpuAd, 2>::from_inner(gpu(&self.x, [rows, hidden], dtype)).require_grad();
        let w = Tensor::<GpuAd, 2>::from_inner(gpu(&self.w, [hidden, vocab], dtype)).require_grad();
        let loss = linear_cross_entropy_reference(x.clone(), w.clone(), ids(&self.targets));
        let g = loss.clone().mul_scalar(upstream).backward();
        let grads = [read(x.grad(&g).unwrap()), read(w.grad(&g).unwrap())];
        (read(loss)[0], grads)
    }

    /// Loss and `[d_x, d_w]` (divided by the scale they carry) of the
    /// chunked blocks of `block` rows, without autodiff.
    fn blocks(&self, dtype: FloatDType, block: usize) -> (f32, [Vec<f32>; 2]) {
        let [rows, hidden, vocab] = self.dims;
        let (loss, grads) = linear_cross_entropy_cube_blocks(
            gpu(&self.x, [rows, hidden], dtype),
            gpu(&self.w, [hidden, vocab], dtype),
            ids(&self.targets),
            block,
            true,
        );
        let g = grads.expect("asked for the gradients");
        assert_eq!(g.x.dtype(), dtype.into(), "d_x in the compute dtype");
        let unscale = |v: Vec<f32>| v.into_iter().map(|e| e / g.scale).collect();
        let (d_x, d_w) = (unscale(read(g.x)), unscale(read(g.weight)));
        (read(loss)[0], [d_x, d_w])
    }

    /// Loss and `[d_x, d_w]` of the autodiff node (the model's path, its
    /// default block) for an upstream gradient `upstream`, in f32.
    fn node(&self, upstream: f32) -> (f32, [Vec<f32>; 2]) {
        let [rows, hidden, vocab] = self.dims;
        let x = Tensor::<GpuAd, 2>::from_inner(gpu(&self.x, [rows, hidden], FloatDType::F32))
            .require_grad();
        let w = Tensor::<GpuAd, 2>::from_inner(gpu(&self.w, [hidden, vocab], FloatDType::F32))
            .require_grad();
        let loss = Tensor::<GpuAd, 1>::from_primitive(TensorPrimitive::Float(
            <GpuAd as KernelBackend>::chunked_linear_cross_entropy(
                x.clone().into_primitive().tensor(),
                w.clone().into_primitive().tensor(),
                ids::<GpuAd>(&self.targets).into_primitive(),
            ),
        ));
        let g = loss.clone().mul_scalar(upstream).backward();
        let grads = [read(x.grad(&g).unwrap()), read(w.grad(&g).unwrap())];
        (read(loss)[0], grads)
    }
}

/// Asserts `got` against `want` (loss and both gradients) within `loss_tol`
/// relative for the loss and `grad_tol` of each gradient's largest
/// magnitude, and prints the gaps.
fn assert_close(what: &str, got: (f32, [Vec<f32>; 2]), want: &(f32, [Vec<f32>; 2]), tol: [f32; 2]) {
    let loss_gap = (got.0 - want.0).abs() / want.0.abs();
    let gaps = [0, 1].map(|i| relative_gap(&got.1[i], &want.1[i]));
    eprintln!(
        "{what}: loss {} vs {} (rel {loss_gap:.1e}); d_x {:.1e}, d_w {:.1e}",
        got.0, want.0, gaps[0], gaps[1]
    );
    assert!(
        loss_gap <= tol[0],
        "{what}: loss {} against {}",
        got.0,
        want.0
    );
    for (name, gap) in ["d_x", "d_w"].into_iter().zip(gaps) {
        assert!(gap <= tol[1], "{what} {name}: relative gap {gap}");
    }
}

/// f32, 37 rows in blocks of 5 and 16 (ragged last blocks) and one block:
/// the loss and both gradients are the reference's within f32 rounding
/// (sums of up to 23 terms in another order: 1e-6 for the loss, 1e-5 of
/// each gradient's largest value, as the CPU blocks' test). The autodiff
/// node with an upstream gradient of 3 (its backward divides by the
/// blocks' scale and multiplies by 3) gives 3 times the gradients.
#[test]
fn cube_blocks_equal_the_reference_in_f32() {
    let case = Case::new([37, 8, 23]);
    let want = case.reference(FloatDType::F32, 1.0);
    for block in [5, 16, 64] {
        let got = case.blocks(FloatDType::F32, block);
        assert_close(&format!("f32 block {block}"), got, &want, [1e-6, 1e-5]);
    }
    let want3 = case.reference(FloatDType::F32, 3.0);
    assert_close("f32 node, upstream 3", case.node(3.0), &want3, [1e-6, 1e-5]);
}

/// f16 (unit roundoff u = 2^-11), 37 rows in blocks of 5: the loss and
/// both gradients are the reference's (in f16 too) within a few roundings.
/// Both paths round the logits to f16 and the logits' gradient once to
/// f16 (the blocks at 64 times the reference's value, a power of two,
/// which changes no rounding); `d_x` and each block's part of `d_w` come
/// out of an f16 matmul (one rounding each), and the blocks' parts of
/// `d_w` are summed in f32 where the reference's one matmul rounds once:
/// 4u (2e-3) of each gradient's largest value, and u relative for the loss
/// (f32 statistics over logits that may differ by an f16 rounding where
/// the two matmuls sum in another order).
#[test]
fn cube_blocks_equal_the_reference_in_f16() {
    let u = 2f32.powi(-11);
    let case = Case::new([37, 8, 23]);
    let want = case.reference(FloatDType::F16, 1.0);
    let got = case.blocks(FloatDType::F16, 5);
    assert_close("f16 block 5", got, &want, [u, 4.0 * u]);
}

/// Bytes the current thread's CubeCL stream has reserved on the GPU: a
/// fresh thread gets a fresh stream with its own memory pools, whose
/// reservation only grows over these few allocations (cubecl 0.10 frees a
/// page after seeing it unused over thousands of allocations), so it is
/// the high-water mark of what ran on the thread.
fn reserved_after<T>(run: impl FnOnce() -> T + Send) -> u64 {
    std::thread::scope(|s| {
        s.spawn(|| {
            let out = run();
            let client = WgpuRuntime::client(&default_device());
            let bytes = client.memory_usage().unwrap().bytes_reserved;
            drop(out);
            bytes
        })
        .join()
        .unwrap()
    })
}

/// Device memory, at a shape where the logits dominate (2048 rows, vocab
/// 4096: 32 MiB of f32 logits, against 128 KiB of `x` and 256 KiB of the
/// weight): the plain path (whole logits, the fused cross-entropy over all
/// rows writing their gradient, then `d_x` and `d_w`) reserves at least
/// the logits; the chunked head in blocks of 64 rows (1 MiB of logits)
/// reserves less than the logits alone, so they never existed. A peak is
/// not readable from cubecl 0.10 (`MemoryUsage` has none), so the stream's
/// reservation stands for it (see [`reserved_after`]; wgpu's pools reserve
/// pages of 8 MiB and more, too coarse to compare at a smaller shape);
/// both run once first on another thread, so shader compilation and
/// autotuning (cached per device) are not measured. The model's blocks
/// are [`BLOCK_BYTES`] of logits in the compute dtype: checked here for
/// the vocabularies of GPT-2 and Llama 3 in bf16 and Llama 2 in f32.
#[test]
fn chunked_head_reserves_less_device_memory_than_the_whole_logits() {
    let [rows, hidden, vocab] = [2048, 16, 4096];
    let case = Case::new([rows, hidden, vocab]);
    let plain = || {
        let x = gpu(&case.x, [rows, hidden], FloatDType::F32);
        let w = gpu(&case.w, [hidden, vocab], FloatDType::F32);
        let logits = x.clone().matmul(w.clone());
        let (loss, d_logits) = <Gpu as FusedKernels>::cross_entropy(
            logits.into_primitive().tensor(),
            ids::<Gpu>(&case.targets).into_primitive(),
        );
        let d_logits = Tensor::<Gpu, 2>::from_primitive(TensorPrimitive::Float(d_logits));
        let d_x = d_logits.clone().matmul(w.transpose());
        let d_w = x.transpose().matmul(d_logits);
        let loss = Tensor::<Gpu, 1>::from_primitive(TensorPrimitive::Float(loss));
        (read(loss), read(d_x), read(d_w))
    };
    let chunked = || {
        let (loss, grads) = linear_cross_entropy_cube_blocks(
            gpu(&case.x, [rows, hidden], FloatDType::F32),
            gpu(&case.w, [hidden, vocab], FloatDType::F32),
            ids(&case.targets),
            64,
            true,
        );
        let g = grads.unwrap();
        (read(loss), read(g.x), read(g.weight))
    };
    let (plain_loss, chunked_loss) =
        std::thread::scope(|s| s.spawn(|| (plain().0, chunked().0)).join().unwrap());
    assert!((plain_loss[0] - chunked_loss[0]).abs() <= 1e-5 * plain_loss[0]);
    let (plain_bytes, chunked_bytes) = (reserved_after(plain), reserved_after(chunked));
    let logits_bytes = (rows * vocab * 4) as u64;
    eprintln!(
        "device memory reserved: whole logits {plain_bytes} B, blocks of 64 rows {chunked_bytes} B \
         (logits {logits_bytes} B)"
    );
    assert!(
        plain_bytes >= logits_bytes,
        "the plain path holds the logits"
    );
    assert!(
        chunked_bytes < logits_bytes,
        "blocks reserved {chunked_bytes} B, the logits are {logits_bytes} B"
    );
    for (vocab, bytes, rows) in [(50304, 2, 1328), (128256, 2, 512), (32000, 4, 1040)] {
        assert_eq!(block_rows_of(vocab, bytes), rows, "vocab {vocab}");
        assert!(rows * vocab * bytes <= BLOCK_BYTES);
    }
}
