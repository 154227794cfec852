//! Device memory of a GPU backend as its allocator counts it (CubeCL's
//! memory pools on cuda, rocm and wgpu), for `metrics.jsonl` and `bench
//! train`. The engine names no GPU runtime: the job layer, which does,
//! builds the probe ([`DeviceMemoryProbe::new`]).

use std::fmt;
use std::sync::Arc;

/// One reading of a device's memory pools, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Bytes in live allocations: the tensors alive at the reading.
    pub in_use: u64,
    /// Bytes the pools hold from the device, at least `in_use`. Pools grow
    /// to the largest demand so far and keep it, so a reading after a step
    /// bounds the peak of every step so far from above (CubeCL 0.10 counts
    /// no peak of its own).
    pub reserved: u64,
}

/// Reads one device's memory; cheap enough to call after every step.
#[derive(Clone)]
pub struct DeviceMemoryProbe {
    /// What is read, e.g. `cubecl wgpu`.
    name: &'static str,
    read: Arc<dyn Fn() -> Option<DeviceMemory> + Send + Sync>,
}

impl DeviceMemoryProbe {
    /// A probe named `name` that calls `read` (`None`: the runtime could
    /// not say).
    pub fn new(
        name: &'static str,
        read: impl Fn() -> Option<DeviceMemory> + Send + Sync + 'static,
    ) -> Self {
        Self {
            name,
            read: Arc::new(read),
        }
    }

    /// The device's memory now.
    pub fn read(&self) -> Option<DeviceMemory> {
        (self.read)()
    }

    /// What the probe reads.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

impl fmt::Debug for DeviceMemoryProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceMemoryProbe({})", self.name)
    }
}
