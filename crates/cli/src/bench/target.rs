//! What `bench kernels` measures on: the default CPU backend (reference
//! only: it has no fused kernels) and every CubeCL runtime compiled in
//! (fused kernels and the reference on Burn's CubeCL backend).

use anyhow::{bail, Result};
use burn::backend::{Autodiff, Flex};

use super::alloc::HeapMeter;
use super::cases::Case;
use super::cube::CubeTarget;
use super::kernels::Sample;
use super::reference;

/// One backend of the benchmark.
pub trait Target {
    /// Name in the table and the JSON: `flex`, `wgpu`, `cuda` or `rocm`.
    fn name(&self) -> &'static str;
    /// Whether the backend has fused kernels (the CPU backends do not).
    fn has_fused(&self) -> bool;
    /// Why the fused path of `case` cannot run here (a kernel the device
    /// lacks), if it cannot; `None` where `has_fused` is false.
    fn fused_skip(&self, case: &Case) -> Option<String>;
    /// Fused forward + backward of `case`; an error where `has_fused` is false.
    fn fused(&self, case: &Case) -> Result<Sample>;
    /// Reference forward + backward of `case`.
    fn reference(&self, case: &Case) -> Result<Sample>;
    /// Why the reference of `case` cannot run here, if it cannot.
    fn reference_skip(&self, case: &Case) -> Option<String>;
}

/// The backends this binary can measure, in the order of the table.
pub const COMPILED: &[&str] = &[
    "flex",
    "wgpu",
    #[cfg(feature = "cuda")]
    "cuda",
    #[cfg(feature = "rocm")]
    "rocm",
];

/// The targets named in `--backends` (every compiled one when `None`), in
/// the order of [`COMPILED`]. A named backend that is not compiled in, or
/// whose device cannot be opened, is an error; an unnamed one without a
/// device is left out with a line on stderr.
pub fn open(names: Option<&[String]>) -> Result<Vec<Box<dyn Target>>> {
    if let Some(names) = names {
        if let Some(name) = names.iter().find(|n| !COMPILED.contains(&n.as_str())) {
            bail!(
                "--backends {name}: not a backend of this build (compiled: {}; cuda and rocm \
                 need the cargo features of the same name)",
                COMPILED.join(", ")
            );
        }
    }
    let mut targets = Vec::new();
    // In the order of COMPILED, so flex (whose times the others are also
    // compared with) comes first.
    for &name in COMPILED {
        let explicit = match names {
            Some(names) if !names.iter().any(|n| n == name) => continue,
            Some(_) => true,
            None => false,
        };
        match open_one(name) {
            Ok(target) => targets.push(target),
            Err(e) if !explicit => eprintln!("bench: {name} left out: {e:#}"),
            Err(e) => return Err(e.context(format!("--backends {name}"))),
        }
    }
    Ok(targets)
}

fn open_one(name: &str) -> Result<Box<dyn Target>> {
    Ok(match name {
        "flex" => Box::new(FlexTarget),
        "wgpu" => {
            let device = ferrotron_kernels::wgpu_setup::default_device();
            eprintln!(
                "bench: {}",
                ferrotron_kernels::wgpu_setup::autotune_for_default_adapter()
            );
            Box::new(CubeTarget::<cubecl::wgpu::WgpuRuntime, u32>::open(
                "wgpu", device,
            )?)
        }
        #[cfg(feature = "cuda")]
        "cuda" => {
            eprintln!(
                "bench: cuda: {}",
                ferrotron_kernels::kernel_cache::install(false).cache
            );
            Box::new(CubeTarget::<cubecl::cuda::CudaRuntime, u8>::open(
                "cuda",
                Default::default(),
            )?)
        }
        #[cfg(feature = "rocm")]
        "rocm" => {
            eprintln!(
                "bench: rocm: {}",
                ferrotron_kernels::kernel_cache::install(false).cache
            );
            Box::new(CubeTarget::<cubecl::hip::HipRuntime, u8>::open(
                "rocm",
                Default::default(),
            )?)
        }
        other => unreachable!("{other} is in COMPILED"),
    })
}

/// Burn `Autodiff<Flex>`, the default CPU backend: reference only, memory
/// = peak Rust heap.
struct FlexTarget;

impl Target for FlexTarget {
    fn name(&self) -> &'static str {
        "flex"
    }

    fn has_fused(&self) -> bool {
        false
    }

    fn fused_skip(&self, _: &Case) -> Option<String> {
        None
    }

    fn fused(&self, _: &Case) -> Result<Sample> {
        bail!("flex has no fused kernels")
    }

    fn reference(&self, case: &Case) -> Result<Sample> {
        reference::run::<Autodiff<Flex>>(case, &Default::default(), &mut HeapMeter::default())
    }

    /// Skipped when the estimated `[batch, heads, seq, seq]` tensors exceed
    /// three quarters of `MemAvailable`.
    fn reference_skip(&self, case: &Case) -> Option<String> {
        let need = case.reference_bytes_estimate();
        let available = available_bytes()?;
        (need > available / 4 * 3).then(|| {
            format!(
                "reference skipped: needs ~{:.1} GiB of score tensors, {:.1} GiB available",
                need as f64 / GIB,
                available as f64 / GIB
            )
        })
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// `MemAvailable` of /proc/meminfo in bytes; `None` where it cannot be read.
fn available_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
