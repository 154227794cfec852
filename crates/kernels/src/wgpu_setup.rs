//! Opening the wgpu runtime: the autotune level for its adapter, and
//! ([`thread_device`]) two devices on a CPU adapter for a process whose
//! threads work at once.
//!
//! CubeCL's autotuner benchmarks candidate kernels (Burn's matmuls, its
//! reductions) the first time it sees a shape. At cubecl's default level
//! (`balanced`) that takes minutes on an adapter that executes on the CPU,
//! such as Mesa's lavapipe (llvmpipe): every candidate shader is compiled by
//! LLVM and timed on the same cores. [`default_device`] therefore asks wgpu,
//! before the runtime starts, which adapter the default device resolves to,
//! and when it is a CPU adapter sets cubecl's level to `minimal`.
//!
//! The user still decides: when `CUBECL_AUTOTUNE_LEVEL` is set, nothing is
//! changed (cubecl reads the variable itself). A GPU adapter keeps cubecl's
//! default. cubecl reads its configuration once per process, at the first
//! client it opens, so every wgpu entry point of Ferrotron (the kernel and
//! model tests, the benchmarks, `ferrotron bench kernels`) opens its device
//! through [`default_device`]; a process that opened a cubecl client before
//! keeps the level it had (reported as [`AutotuneChoice::TooLate`]).
//! The level goes in with the kernel caches, through
//! [`kernel_cache::install`].

use std::fmt;
use std::sync::OnceLock;

use cubecl::wgpu::{AutoGraphicsApi, GraphicsApi, WgpuDevice};

use crate::kernel_cache;

/// The environment variable cubecl reads the autotune level from.
pub const AUTOTUNE_VAR: &str = "CUBECL_AUTOTUNE_LEVEL";

/// What [`autotune_for_default_adapter`] decided, for a log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AutotuneChoice {
    /// `CUBECL_AUTOTUNE_LEVEL` was set (to this value): cubecl uses it.
    UserSet(String),
    /// The adapter (named) executes on the CPU: level set to `minimal`.
    Minimal { adapter: String },
    /// The adapter (named) is a GPU: cubecl's default level.
    Default { adapter: String },
    /// wgpu found no adapter; opening the device will fail and say so.
    NoAdapter,
    /// The adapter (named) executes on the CPU, but cubecl had already
    /// read its configuration in this process: the level is unchanged.
    TooLate { adapter: String },
}

impl fmt::Display for AutotuneChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UserSet(v) => write!(f, "cubecl autotune level {v} ({AUTOTUNE_VAR})"),
            Self::Minimal { adapter } => write!(
                f,
                "cubecl autotune level minimal: adapter `{adapter}` runs on the CPU \
                 (set {AUTOTUNE_VAR} to choose another)"
            ),
            Self::Default { adapter } => {
                write!(
                    f,
                    "cubecl autotune level: cubecl's default (adapter `{adapter}`)"
                )
            }
            Self::NoAdapter => write!(f, "cubecl autotune level unchanged: no wgpu adapter"),
            Self::TooLate { adapter } => write!(
                f,
                "cubecl autotune level unchanged: adapter `{adapter}` runs on the CPU but \
                 cubecl's configuration was already read in this process"
            ),
        }
    }
}

/// The wgpu device Ferrotron opens (`WgpuDevice::DefaultDevice`), after
/// [`autotune_for_default_adapter`] has chosen the autotune level.
pub fn default_device() -> WgpuDevice {
    autotune_for_default_adapter();
    WgpuDevice::DefaultDevice
}

/// The wgpu device for the calling thread of a process that runs several
/// threads of work at once (a test binary's tests): on an adapter that
/// executes on the CPU (lavapipe), the one of `DefaultDevice` and `Cpu`
/// that fewer live threads hold; elsewhere `DefaultDevice`.
///
/// Each distinct device is its own cubecl client, with its own server
/// thread, on which cubecl compiles and launches every kernel (lavapipe's
/// LLVM compiles a pipeline in the calling thread, tens of seconds for a
/// register-blocked attention shader). On one device two tests take turns
/// on that thread; on two, both cores work. `DefaultDevice` and `Cpu`
/// resolve to the same CPU adapter and open two devices on it. A thread
/// keeps its device for its whole life (buffers belong to the device that
/// made them); when it ends, its device counts one thread fewer. Opens
/// nothing: it chooses, as [`default_device`] does.
pub fn thread_device() -> WgpuDevice {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Live threads holding each of `DefaultDevice` (0) and `Cpu` (1).
    static HOLDERS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
    /// This thread's choice; releases it when the thread ends.
    struct Held(Cell<Option<usize>>);
    impl Drop for Held {
        fn drop(&mut self) {
            if let Some(index) = self.0.get() {
                HOLDERS[index].fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
    thread_local!(static HELD: Held = const { Held(Cell::new(None)) });

    autotune_for_default_adapter();
    if !process_adapter().as_ref().is_some_and(|(_, cpu)| *cpu) {
        return WgpuDevice::DefaultDevice;
    }
    let index = HELD.with(|held| {
        held.0.get().unwrap_or_else(|| {
            let fewer =
                usize::from(HOLDERS[1].load(Ordering::SeqCst) < HOLDERS[0].load(Ordering::SeqCst));
            HOLDERS[fewer].fetch_add(1, Ordering::SeqCst);
            held.0.set(Some(fewer));
            fewer
        })
    });
    [WgpuDevice::DefaultDevice, WgpuDevice::Cpu][index].clone()
}

/// Chooses cubecl's autotune level for the adapter the default wgpu device
/// resolves to (see the module doc). Runs once per process; later calls
/// return the first decision.
pub fn autotune_for_default_adapter() -> &'static AutotuneChoice {
    static CHOICE: OnceLock<AutotuneChoice> = OnceLock::new();
    CHOICE.get_or_init(|| {
        let user = std::env::var(AUTOTUNE_VAR).ok();
        // Only ask wgpu when the answer can matter.
        let adapter = if user.is_none() {
            process_adapter().clone()
        } else {
            None
        };
        let choice = decide(user, adapter);
        // The kernel caches go in with the level: cubecl reads one configuration.
        let installed = kernel_cache::install(matches!(choice, AutotuneChoice::Minimal { .. }));
        match choice {
            AutotuneChoice::Minimal { adapter } if !installed.minimal_autotune => {
                AutotuneChoice::TooLate { adapter }
            }
            other => other,
        }
    })
}

/// The decision, apart from wgpu and cubecl: `user` is the value of
/// `CUBECL_AUTOTUNE_LEVEL`, `adapter` the default adapter's name and
/// whether it executes on the CPU.
fn decide(user: Option<String>, adapter: Option<(String, bool)>) -> AutotuneChoice {
    match (user, adapter) {
        (Some(level), _) => AutotuneChoice::UserSet(level),
        (None, None) => AutotuneChoice::NoAdapter,
        (None, Some((adapter, true))) => AutotuneChoice::Minimal { adapter },
        (None, Some((adapter, false))) => AutotuneChoice::Default { adapter },
    }
}

/// [`default_adapter`], asked once per process: the autotune choice and
/// [`thread_device`] share the answer.
fn process_adapter() -> &'static Option<(String, bool)> {
    static ADAPTER: OnceLock<Option<(String, bool)>> = OnceLock::new();
    ADAPTER.get_or_init(default_adapter)
}

/// Name of the adapter cubecl's `DefaultDevice` resolves to, and whether it
/// executes on the CPU; `None` when wgpu finds none (no Vulkan, Metal or
/// DirectX 12 driver). Mirrors cubecl-wgpu 0.10's selection:
/// `CUBECL_WGPU_DEFAULT_DEVICE` when set, else the high-performance adapter
/// of the platform's graphics API (Vulkan on Linux). Asks wgpu each call.
pub fn default_adapter() -> Option<(String, bool)> {
    if let Ok(forced) = std::env::var("CUBECL_WGPU_DEFAULT_DEVICE") {
        return Some((forced.clone(), forced == "Cpu"));
    }
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: AutoGraphicsApi::backend().into(),
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let options = wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        force_fallback_adapter: false,
        compatible_surface: None,
    };
    let adapter = cubecl::future::block_on(instance.request_adapter(&options)).ok()?;
    let info = adapter.get_info();
    Some((info.name, info.device_type == wgpu::DeviceType::Cpu))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_set_level_wins_over_any_adapter() {
        let got = decide(Some("balanced".into()), Some(("llvmpipe".into(), true)));
        assert_eq!(got, AutotuneChoice::UserSet("balanced".into()));
    }

    #[test]
    fn a_cpu_adapter_gets_minimal_and_a_gpu_keeps_the_default() {
        let cpu = decide(None, Some(("llvmpipe (LLVM 15)".into(), true)));
        assert_eq!(
            cpu,
            AutotuneChoice::Minimal {
                adapter: "llvmpipe (LLVM 15)".into()
            }
        );
        let gpu = decide(None, Some(("NVIDIA H100".into(), false)));
        assert_eq!(
            gpu,
            AutotuneChoice::Default {
                adapter: "NVIDIA H100".into()
            }
        );
        assert_eq!(decide(None, None), AutotuneChoice::NoAdapter);
    }
}
