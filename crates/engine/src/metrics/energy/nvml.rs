//! NVML, loaded at run time: `nvmlDeviceGetTotalEnergyConsumption`
//! (millijoules since the driver was loaded; Volta and later).

use std::ffi::c_void;
use std::os::raw::{c_int, c_uint, c_ulonglong};
use std::sync::Arc;

use libloading::Library;

type Init = unsafe extern "C" fn() -> c_int;
type HandleByIndex = unsafe extern "C" fn(c_uint, *mut *mut c_void) -> c_int;
type TotalEnergy = unsafe extern "C" fn(*mut c_void, *mut c_ulonglong) -> c_int;

/// One GPU's NVML energy counter.
#[derive(Clone)]
pub struct Nvml {
    lib: Arc<Library>,
    /// `nvmlDevice_t`, an opaque handle valid while the library is loaded.
    device: usize,
    index: u32,
}

impl std::fmt::Debug for Nvml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Nvml {{ index: {} }}", self.index)
    }
}

impl Nvml {
    /// Loads `libnvidia-ml.so.1`, initialises NVML and reads GPU `index`'s
    /// counter once.
    pub fn open(index: u32) -> Result<Self, String> {
        // SAFETY: loading the NVIDIA management library runs its
        // initialisers, which have no preconditions.
        let lib = ["libnvidia-ml.so.1", "libnvidia-ml.so"]
            .iter()
            .find_map(|n| unsafe { Library::new(n) }.ok())
            .ok_or("no NVML (libnvidia-ml.so.1 not found)")?;
        // SAFETY: the symbols have the signatures of NVML's C API (nvml.h).
        let device = unsafe {
            let init: libloading::Symbol<Init> = lib
                .get(b"nvmlInit_v2\0")
                .map_err(|e| format!("NVML: {e}"))?;
            let rc = init();
            if rc != 0 {
                return Err(format!("NVML: nvmlInit_v2 failed ({rc})"));
            }
            let by_index: libloading::Symbol<HandleByIndex> = lib
                .get(b"nvmlDeviceGetHandleByIndex_v2\0")
                .map_err(|e| format!("NVML: {e}"))?;
            let mut device = std::ptr::null_mut();
            let rc = by_index(index, &mut device);
            if rc != 0 {
                return Err(format!("NVML: no GPU {index} ({rc})"));
            }
            device as usize
        };
        let nvml = Self {
            lib: Arc::new(lib),
            device,
            index,
        };
        nvml.read()?;
        Ok(nvml)
    }

    /// The counter, millijoules.
    pub fn read(&self) -> Result<u64, String> {
        let mut mj: c_ulonglong = 0;
        // SAFETY: the device handle came from this loaded library.
        let rc = unsafe {
            let energy: libloading::Symbol<TotalEnergy> = self
                .lib
                .get(b"nvmlDeviceGetTotalEnergyConsumption\0")
                .map_err(|e| format!("NVML: {e}"))?;
            energy(self.device as *mut c_void, &mut mj)
        };
        if rc != 0 {
            return Err(format!(
                "NVML: GPU {} reports no energy counter ({rc})",
                self.index
            ));
        }
        Ok(mj)
    }

    /// The GPU's index.
    pub fn index(&self) -> u32 {
        self.index
    }
}
