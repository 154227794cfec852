//! Shared test helpers: a wgpu client over lavapipe (a CUDA client with
//! the `test-cuda` feature), a seeded generator, buffer upload/download
//! (f32, and every [`FloatDtype`]) and error measures.
#![allow(dead_code)] // each test binary uses a different subset

use cubecl::prelude::*;
use cubecl::server::Handle;
use ferrotron_kernels::FloatDtype;
use half::{bf16, f16};

/// The runtime the tests launch on: wgpu.
#[cfg(not(feature = "test-cuda"))]
pub type R = cubecl::wgpu::WgpuRuntime;

/// The runtime the tests launch on: CUDA (the `test-cuda` feature).
#[cfg(feature = "test-cuda")]
pub type R = cubecl::cuda::CudaRuntime;

/// A CUDA client on device 0; panics (failing the test) without a driver
/// or a GPU.
#[cfg(feature = "test-cuda")]
pub fn client() -> ComputeClient<R> {
    let made = std::panic::catch_unwind(|| R::client(&Default::default()));
    made.unwrap_or_else(|_| panic!("no CUDA device 0: the test-cuda build needs an NVIDIA GPU"))
}

/// A wgpu client on the default adapter (lavapipe on CI and dev machines),
/// with the autotune level chosen for it: on lavapipe, on the device of
/// the two that fewer running tests hold (`wgpu_setup::thread_device`),
/// so that two tests compile their kernels at once.
#[cfg(not(feature = "test-cuda"))]
pub fn client() -> ComputeClient<R> {
    use ferrotron_kernels::wgpu_setup;
    let made = std::panic::catch_unwind(|| R::client(&wgpu_setup::thread_device()));
    made.unwrap_or_else(|_| {
        panic!(
            "no Vulkan adapter for the wgpu runtime: install Mesa's lavapipe \
             (scripts/test --install, or scripts/test --check for the apt-get lines)"
        )
    })
}

/// Small seeded generator (SplitMix64) so tests need no extra crate.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }

    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }

    /// Uniform integer in `[0, n)`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

pub fn upload(client: &ComputeClient<R>, data: &[f32]) -> Handle {
    client.create_from_slice(f32::as_bytes(data))
}

pub fn upload_u32(client: &ComputeClient<R>, data: &[u32]) -> Handle {
    client.create_from_slice(u32::as_bytes(data))
}

pub fn zeros(client: &ComputeClient<R>, n: usize) -> Handle {
    upload(client, &vec![0.0; n])
}

pub fn download(client: &ComputeClient<R>, handle: &Handle) -> Vec<f32> {
    let bytes = client.read_one(handle.clone()).expect("read back a buffer");
    f32::from_bytes(&bytes).to_vec()
}

/// Max |a - b| divided by max(max |b|, 1e-6): error relative to the
/// reference's largest magnitude.
pub fn rel_err(actual: &[f32], expected: &[f32]) -> f32 {
    assert_eq!(actual.len(), expected.len(), "length mismatch");
    let scale = expected.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    let diff = actual
        .iter()
        .zip(expected)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    diff / scale
}

/// Asserts `rel_err(actual, expected) <= tol` and prints the error seen.
pub fn assert_close(what: &str, actual: &[f32], expected: &[f32], tol: f32) {
    let err = rel_err(actual, expected);
    println!("{what}: max error relative to max magnitude {err:.2e}");
    assert!(err <= tol, "{what}: relative error {err:.2e} > {tol:.0e}");
}

/// Central finite difference of the scalar `f` at `x` along each input
/// coordinate, in f64.
pub fn finite_diff(x: &[f64], f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let h = 1e-6;
    (0..x.len())
        .map(|i| {
            let mut plus = x.to_vec();
            let mut minus = x.to_vec();
            plus[i] += h;
            minus[i] -= h;
            (f(&plus) - f(&minus)) / (2.0 * h)
        })
        .collect()
}

/// Asserts two f64 vectors agree to `tol` relative to the largest magnitude.
pub fn assert_close_f64(what: &str, actual: &[f64], expected: &[f64], tol: f64) {
    let scale = expected.iter().fold(1e-9f64, |m, v| m.max(v.abs()));
    let diff = actual
        .iter()
        .zip(expected)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
    println!(
        "{what}: max error relative to max magnitude {:.2e}",
        diff / scale
    );
    assert!(
        diff / scale <= tol,
        "{what}: relative error {:.2e} > {tol:.0e}",
        diff / scale
    );
}

/// The 16-bit element types the low-precision tests run on this runtime:
/// f16 (panics, failing the test, when the adapter has no shader f16),
/// bf16 carried in 32-bit words (runs on every runtime), and native bf16
/// where the runtime has it. Says on stderr what runs and what does not.
pub fn low_precision_dtypes(client: &ComputeClient<R>) -> Vec<FloatDtype> {
    assert!(
        FloatDtype::F16.is_supported(client),
        "this wgpu adapter has no shader f16 (wgpu feature SHADER_F16): the f16 kernel \
         tests cannot run here (Mesa's lavapipe 25 has it)"
    );
    let mut dtypes = vec![FloatDtype::F16, FloatDtype::Bf16InF32];
    if FloatDtype::Bf16.is_supported(client) {
        dtypes.push(FloatDtype::Bf16);
    } else {
        eprintln!(
            "native bf16 storage: not supported by this runtime (WGSL has no bf16), not run; \
             bf16 numerics tested as bf16-in-f32 (same in-kernel rounding)"
        );
    }
    dtypes
}

/// Tolerance, relative to the reference's largest magnitude, of an output
/// stored as `dtype`: `f32_tol` (the f32 arithmetic, bounded as in the f32
/// tests of the same shapes and reduction lengths; it already covers the
/// f32 store) plus, for a 16-bit type, its unit roundoff `u` (each output
/// is rounded once to its storage type, and `|fl(y) - y| <= u |y| <= u max
/// |y|`). Inputs add nothing: the reference is given the same rounded
/// values as the kernel.
pub fn tolerance(dtype: FloatDtype, f32_tol: f32) -> f32 {
    match dtype {
        FloatDtype::F32 => f32_tol,
        _ => f32_tol + dtype.unit_roundoff() as f32,
    }
}

/// `values` rounded to the nearest value of `dtype` (ties to even).
pub fn round_to(dtype: FloatDtype, values: &[f32]) -> Vec<f32> {
    match dtype {
        FloatDtype::F32 => values.to_vec(),
        FloatDtype::F16 => values.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
        FloatDtype::Bf16 | FloatDtype::Bf16InF32 => {
            values.iter().map(|&v| bf16::from_f32(v).to_f32()).collect()
        }
    }
}

/// Uploads `data` rounded to `dtype`, in `dtype`'s layout.
pub fn upload_as(client: &ComputeClient<R>, dtype: FloatDtype, data: &[f32]) -> Handle {
    let bytes: Vec<u8> = match dtype {
        FloatDtype::F32 | FloatDtype::Bf16InF32 => f32::as_bytes(&round_to(dtype, data)).to_vec(),
        FloatDtype::F16 => data
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        FloatDtype::Bf16 => data
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
    };
    client.create_from_slice(&bytes)
}

/// `n` zeros of `dtype`.
pub fn zeros_as(client: &ComputeClient<R>, dtype: FloatDtype, n: usize) -> Handle {
    upload_as(client, dtype, &vec![0.0; n])
}

/// Reads a buffer of `dtype` back as f32. For bf16 in 32-bit words it
/// checks that every value is a bf16 (low 16 bits zero, or a NaN), that is,
/// that the kernel rounded what it stored.
pub fn download_as(client: &ComputeClient<R>, dtype: FloatDtype, handle: &Handle) -> Vec<f32> {
    let bytes = client.read_one(handle.clone()).expect("read back a buffer");
    let halves = || {
        bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    match dtype {
        FloatDtype::F32 => f32::from_bytes(&bytes).to_vec(),
        FloatDtype::Bf16InF32 => {
            let values = f32::from_bytes(&bytes).to_vec();
            for (i, v) in values.iter().enumerate() {
                assert!(
                    v.is_nan() || v.to_bits() & 0xFFFF == 0,
                    "bf16-in-f32 output {i} = {v:e} is not a bf16 value: the kernel did not round it"
                );
            }
            values
        }
        FloatDtype::F16 => halves().map(|b| f16::from_bits(b).to_f32()).collect(),
        FloatDtype::Bf16 => halves().map(|b| bf16::from_bits(b).to_f32()).collect(),
    }
}
