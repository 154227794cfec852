//! Runs one generic task on the backend chosen at run time: the one place
//! a backend name becomes a Burn type. A library user implements
//! [`BackendTask`] and calls [`dispatch`].

use ferrotron_engine::backend::BackendKind;
#[cfg(any(feature = "cuda", feature = "rocm", feature = "wgpu"))]
use ferrotron_engine::metrics::DeviceMemory;
use ferrotron_engine::metrics::DeviceMemoryProbe;
use ferrotron_models::ops::TrainBackend;

use crate::error::usage;

/// Work that is generic over the (autodiff) backend.
pub trait BackendTask {
    /// What the task returns.
    type Output;
    /// Runs the task on backend `B` and `device`.
    fn run<B: TrainBackend>(
        self,
        kind: BackendKind,
        device: B::Device,
    ) -> anyhow::Result<Self::Output>;
}

/// The backend named by `--backend`, if compiled in and able to start here.
pub fn parse_backend(name: &str) -> anyhow::Result<BackendKind> {
    let kind: BackendKind = name.parse().map_err(|e| usage(format!("--backend: {e}")))?;
    check_ready(kind).map_err(|e| usage(format!("--backend: {e}")))?;
    Ok(kind)
}

/// Whether backend `kind` can start on this machine: the driver probes of
/// [`BackendKind::check_runtime`], and for wgpu that wgpu finds an adapter.
/// The error is one line naming what is missing.
pub fn check_ready(kind: BackendKind) -> Result<(), String> {
    kind.check_runtime().map_err(|e| e.to_string())?;
    #[cfg(feature = "wgpu")]
    if kind == BackendKind::Wgpu && ferrotron_kernels::wgpu_setup::default_adapter().is_none() {
        return Err(
            "backend 'wgpu' is compiled in but unusable here: wgpu finds no adapter; \
                    install a Vulkan driver (Mesa's lavapipe runs on the CPU)"
                .into(),
        );
    }
    Ok(())
}

/// Calls `task.run::<B>` for the backend named by `kind`, once, on GPU
/// `gpu` of this node (the launcher's local rank in a multi-rank job: one
/// rank per device). CPU backends have one device and ignore `gpu`.
pub fn dispatch<T: BackendTask>(
    kind: BackendKind,
    gpu: usize,
    task: T,
) -> anyhow::Result<T::Output> {
    use burn::backend::Autodiff;
    // A build without GPU backends has one device (wgpu: the default
    // adapter).
    #[cfg(not(any(feature = "cuda", feature = "rocm")))]
    let _ = gpu;
    match kind {
        #[cfg(feature = "flex")]
        BackendKind::Flex => task.run::<Autodiff<burn::backend::Flex>>(kind, Default::default()),
        #[cfg(feature = "ndarray")]
        BackendKind::Ndarray => {
            task.run::<Autodiff<burn::backend::NdArray>>(kind, Default::default())
        }
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => gpu_guard(kind, || {
            // Sets cubecl's autotune level for the adapter before the
            // runtime starts (minimal on a CPU adapter such as lavapipe).
            let device = ferrotron_kernels::wgpu_setup::default_device();
            eprintln!(
                "wgpu: {}; {}",
                ferrotron_kernels::wgpu_setup::autotune_for_default_adapter(),
                ferrotron_kernels::kernel_cache::install(false).cache
            );
            task.run::<Autodiff<ferrotron_models::ops::Wgpu>>(kind, device)
        }),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => gpu_guard(kind, || {
            eprintln!(
                "cuda: {}",
                ferrotron_kernels::kernel_cache::install(false).cache
            );
            let device = burn::backend::cuda::CudaDevice { index: gpu };
            task.run::<Autodiff<ferrotron_models::ops::Cuda>>(kind, device)
        }),
        #[cfg(feature = "rocm")]
        BackendKind::Rocm => gpu_guard(kind, || {
            eprintln!(
                "rocm: {}",
                ferrotron_kernels::kernel_cache::install(false).cache
            );
            let device = burn::backend::rocm::RocmDevice { index: gpu };
            task.run::<Autodiff<ferrotron_models::ops::Rocm>>(kind, device)
        }),
        #[allow(unreachable_patterns)]
        other => Err(usage(format!(
            "--backend {other}: not compiled into this build (rebuild with --features {other})"
        ))),
    }
}

/// A reader of the memory of GPU `gpu` (the launcher's local rank) on
/// backend `kind`: its CubeCL runtime's memory pools
/// (`ComputeClient::memory_usage`, bytes in use and reserved). `None` on the
/// CPU backends, whose memory is the host heap.
pub fn device_memory(kind: BackendKind, gpu: usize) -> Option<DeviceMemoryProbe> {
    #[cfg(not(any(feature = "cuda", feature = "rocm")))]
    let _ = gpu;
    #[cfg(not(any(feature = "cuda", feature = "rocm", feature = "wgpu")))]
    let _ = kind;
    #[cfg(feature = "wgpu")]
    if kind == BackendKind::Wgpu {
        return Some(cube_memory::<burn_wgpu::WgpuRuntime>(
            "cubecl wgpu memory pools",
            ferrotron_kernels::wgpu_setup::default_device(),
        ));
    }
    #[cfg(feature = "cuda")]
    if kind == BackendKind::Cuda {
        return Some(cube_memory::<burn_cubecl::cubecl::cuda::CudaRuntime>(
            "cubecl cuda memory pools",
            burn::backend::cuda::CudaDevice { index: gpu },
        ));
    }
    #[cfg(feature = "rocm")]
    if kind == BackendKind::Rocm {
        return Some(cube_memory::<burn_cubecl::cubecl::hip::HipRuntime>(
            "cubecl hip memory pools",
            burn::backend::rocm::RocmDevice { index: gpu },
        ));
    }
    None
}

/// The memory of CubeCL runtime `R`'s client on `device` (the client the
/// backend trains on: one per device and thread's stream).
#[cfg(any(feature = "cuda", feature = "rocm", feature = "wgpu"))]
fn cube_memory<R: burn_cubecl::cubecl::Runtime>(
    name: &'static str,
    device: R::Device,
) -> DeviceMemoryProbe
where
    R::Device: Send + Sync + 'static,
{
    DeviceMemoryProbe::new(name, move || {
        let usage = R::client(&device).memory_usage().ok()?;
        Some(DeviceMemory {
            in_use: usage.bytes_in_use,
            reserved: usage.bytes_reserved,
        })
    })
}

/// Turns a panic of the GPU runtime (on any of its threads) into an error
/// carrying the first panic message, which names the root cause. Every
/// panic is still printed by the hook that was installed before (its
/// message, and the backtrace under `RUST_BACKTRACE=1`): a GPU failure
/// must say where it happened.
#[cfg(any(feature = "cuda", feature = "rocm", feature = "wgpu"))]
fn gpu_guard<R>(kind: BackendKind, f: impl FnOnce() -> anyhow::Result<R>) -> anyhow::Result<R> {
    use std::sync::{Arc, Mutex};
    static FIRST_PANIC: Mutex<Option<String>> = Mutex::new(None);
    let previous: Arc<dyn Fn(&std::panic::PanicHookInfo<'_>) + Send + Sync> =
        Arc::from(std::panic::take_hook());
    let print = previous.clone();
    std::panic::set_hook(Box::new(move |info| {
        let message = panic_message(info.payload());
        if let Ok(mut first) = FIRST_PANIC.lock() {
            first.get_or_insert(message);
        }
        print(info);
    }));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    let _ = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| previous(info)));
    result.unwrap_or_else(|_| {
        let message = FIRST_PANIC
            .lock()
            .ok()
            .and_then(|mut m| m.take())
            .unwrap_or_default();
        Err(anyhow::anyhow!(
            "--backend {kind}: the GPU runtime failed: {message}"
        ))
    })
}

/// The text of a panic's payload (`panic!` with a message or a literal).
#[cfg(any(feature = "cuda", feature = "rocm", feature = "wgpu"))]
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}
