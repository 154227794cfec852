//! `wgpu_setup::default_device` chooses cubecl's autotune level before the
//! runtime starts: `minimal` on an adapter that executes on the CPU
//! (lavapipe in CI), cubecl's default on a GPU, the user's
//! `CUBECL_AUTOTUNE_LEVEL` when it is set, and the kernel caches with it.
//! Its own test binary, because cubecl reads its configuration once per
//! process (and because `wgpu_setup::thread_device` counts the threads of
//! the whole process). `thread_device` gives threads alive at once two
//! devices on a CPU adapter and releases a thread's device when it ends.

use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
use cubecl::prelude::*;
use cubecl::wgpu::{WgpuDevice, WgpuRuntime};
use ferrotron_kernels::kernel_cache::{self, KernelCache};
use ferrotron_kernels::wgpu_setup::{self, AutotuneChoice};

#[test]
fn the_default_device_runs_with_the_autotune_level_chosen_for_its_adapter() {
    let device = wgpu_setup::default_device();
    let choice = wgpu_setup::autotune_for_default_adapter();
    println!("{choice}");
    // A client opens on the device, and cubecl then runs with the level.
    let _client = WgpuRuntime::client(&device);
    let level = format!("{:?}", CubeClRuntimeConfig::get().autotune.level);
    let want = match choice {
        AutotuneChoice::Minimal { .. } => "Minimal",
        AutotuneChoice::Default { .. } => "Balanced",
        AutotuneChoice::UserSet(v) => match v.as_str() {
            "minimal" | "0" => "Minimal",
            "extensive" | "2" => "Extensive",
            "full" | "3" => "Full",
            _ => "Balanced",
        },
        AutotuneChoice::NoAdapter => panic!(
            "no Vulkan adapter for the wgpu runtime: install Mesa's lavapipe (scripts/test --install)"
        ),
        AutotuneChoice::TooLate { .. } => panic!("nothing read cubecl's configuration before"),
    };
    assert_eq!(level, want, "{choice}");
    // The kernel caches went in with the level: both in the folder chosen.
    let installed = kernel_cache::install(false);
    println!("{}", installed.cache);
    let config = CubeClRuntimeConfig::get();
    match &installed.cache {
        KernelCache::Folder(dir) => {
            let compiled = config.compilation.cache.as_ref().map(|c| c.root());
            assert_eq!(compiled.as_ref(), Some(dir));
            assert_eq!(&config.autotune.cache.root(), dir);
        }
        KernelCache::UserFile(_) | KernelCache::Off | KernelCache::NoFolder => {}
        KernelCache::TooLate => panic!("nothing read cubecl's configuration before"),
    }
}

#[test]
fn threads_alive_at_once_get_two_devices_on_a_cpu_adapter() {
    use std::sync::{Arc, Barrier};
    use std::thread;

    let (adapter, cpu) = wgpu_setup::default_adapter().expect(
        "no Vulkan adapter for the wgpu runtime: install Mesa's lavapipe (scripts/test --install)",
    );
    // `first` chooses and lives while `second` chooses and ends, and while
    // `third` chooses after it.
    let first_chose = Arc::new(Barrier::new(2));
    let release_first = Arc::new(Barrier::new(2));
    let first = {
        let (chose, release) = (first_chose.clone(), release_first.clone());
        thread::spawn(move || {
            let device = wgpu_setup::thread_device();
            assert_eq!(
                wgpu_setup::thread_device(),
                device,
                "a thread keeps its device"
            );
            chose.wait();
            release.wait();
            device
        })
    };
    first_chose.wait();
    let second = thread::spawn(wgpu_setup::thread_device)
        .join()
        .expect("second thread");
    let third = thread::spawn(wgpu_setup::thread_device)
        .join()
        .expect("third thread");
    release_first.wait();
    let first = first.join().expect("first thread");
    if cpu {
        assert_ne!(
            first, second,
            "two live threads share one device on {adapter}"
        );
        assert_eq!(third, second, "the ended thread's device was not released");
    } else {
        assert!([first, second, third]
            .iter()
            .all(|d| *d == WgpuDevice::DefaultDevice));
    }
}
