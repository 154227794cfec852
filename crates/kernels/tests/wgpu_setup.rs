//! `wgpu_setup::default_device` chooses cubecl's autotune level before the
//! runtime starts: `minimal` on an adapter that executes on the CPU
//! (lavapipe in CI), cubecl's default on a GPU, the user's
//! `CUBECL_AUTOTUNE_LEVEL` when it is set, and the kernel caches with it. Its own test binary, because
//! cubecl reads its configuration once per process.

use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
use cubecl::prelude::*;
use cubecl::wgpu::WgpuRuntime;
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
