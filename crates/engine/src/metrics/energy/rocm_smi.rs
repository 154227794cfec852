//! ROCm SMI, loaded at run time: `rsmi_dev_energy_count_get` (an
//! accumulator and its resolution in microjoules per count).

use std::os::raw::{c_float, c_int, c_uint};
use std::sync::Arc;

use libloading::Library;

type Init = unsafe extern "C" fn(u64) -> c_int;
type EnergyCount = unsafe extern "C" fn(c_uint, *mut u64, *mut c_float, *mut u64) -> c_int;

/// One GPU's ROCm SMI energy counter.
#[derive(Clone)]
pub struct RocmSmi {
    lib: Arc<Library>,
    index: u32,
    /// Microjoules per count, as the library reports it.
    resolution_uj: f64,
}

impl std::fmt::Debug for RocmSmi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RocmSmi {{ index: {} }}", self.index)
    }
}

impl RocmSmi {
    /// Loads `librocm_smi64.so`, initialises it and reads GPU `index`'s
    /// counter once.
    pub fn open(index: u32) -> Result<Self, String> {
        // SAFETY: loading the ROCm SMI library runs its initialisers, which
        // have no preconditions.
        let lib = [
            "librocm_smi64.so.1",
            "librocm_smi64.so",
            "/opt/rocm/lib/librocm_smi64.so",
        ]
        .iter()
        .find_map(|n| unsafe { Library::new(n) }.ok())
        .ok_or("no ROCm SMI (librocm_smi64.so not found)")?;
        // SAFETY: rsmi_init has the signature of rocm_smi.h.
        unsafe {
            let init: libloading::Symbol<Init> = lib
                .get(b"rsmi_init\0")
                .map_err(|e| format!("ROCm SMI: {e}"))?;
            let rc = init(0);
            if rc != 0 {
                return Err(format!("ROCm SMI: rsmi_init failed ({rc})"));
            }
        }
        let mut smi = Self {
            lib: Arc::new(lib),
            index,
            resolution_uj: 0.0,
        };
        smi.resolution_uj = smi.count()?.1;
        Ok(smi)
    }

    fn count(&self) -> Result<(u64, f64), String> {
        let (mut count, mut resolution, mut timestamp) = (0u64, 0.0 as c_float, 0u64);
        // SAFETY: rsmi_dev_energy_count_get has the signature of rocm_smi.h.
        let rc = unsafe {
            let get: libloading::Symbol<EnergyCount> = self
                .lib
                .get(b"rsmi_dev_energy_count_get\0")
                .map_err(|e| format!("ROCm SMI: {e}"))?;
            get(self.index, &mut count, &mut resolution, &mut timestamp)
        };
        if rc != 0 {
            return Err(format!(
                "ROCm SMI: GPU {} reports no energy counter ({rc})",
                self.index
            ));
        }
        Ok((count, f64::from(resolution)))
    }

    /// The accumulator, counts of [`RocmSmi::joules_per_count`].
    pub fn read(&self) -> Result<u64, String> {
        self.count().map(|(c, _)| c)
    }

    /// Joules per count of the accumulator.
    pub fn joules_per_count(&self) -> f64 {
        self.resolution_uj * 1e-6
    }

    /// The GPU's index.
    pub fn index(&self) -> u32 {
        self.index
    }
}
