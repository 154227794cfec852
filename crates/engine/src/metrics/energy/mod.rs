//! Energy counters: how many joules the hardware says a step used.
//!
//! Three sources, each a cumulative counter read before and after a step:
//! - Linux RAPL ([`rapl`]): `energy_uj` of every package domain under the
//!   powercap tree (`/sys/class/powercap/intel-rapl:N`; the root can be
//!   another directory, for tests). It covers the CPU packages of the whole
//!   node, whatever runs on them.
//! - NVML ([`nvml`]): `nvmlDeviceGetTotalEnergyConsumption` of one GPU.
//! - ROCm SMI ([`rocm_smi`]): `rsmi_dev_energy_count_get` of one GPU.
//!
//! The GPU libraries are loaded at run time, so the binary builds and runs
//! without them. Nothing is ever estimated: with no readable source,
//! [`EnergyProbe::open`] says what is missing.

pub mod nvml;
pub mod rapl;
pub mod rocm_smi;

use std::fmt;
use std::path::PathBuf;

/// Where to look for an energy counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnergyProbe {
    /// Root of the powercap tree (`/sys/class/powercap` on Linux).
    pub rapl_root: PathBuf,
    /// The GPU index whose counter to read (NVML, then ROCm SMI); `None`
    /// for a CPU run, which reads RAPL.
    pub gpu: Option<u32>,
}

impl EnergyProbe {
    /// The system's powercap tree and, for a GPU run, GPU `gpu`.
    pub fn system(gpu: Option<u32>) -> Self {
        Self {
            rapl_root: PathBuf::from(rapl::DEFAULT_ROOT),
            gpu,
        }
    }

    /// The first source that can be read: for a GPU run NVML, then ROCm
    /// SMI; for a CPU run RAPL. The error is one line naming what is
    /// missing for each source tried.
    pub fn open(&self) -> Result<EnergyMeter, String> {
        let source = match self.gpu {
            Some(index) => match nvml::Nvml::open(index) {
                Ok(n) => Source::Nvml(n),
                Err(nvml_why) => match rocm_smi::RocmSmi::open(index) {
                    Ok(r) => Source::Rocm(r),
                    Err(rocm_why) => return Err(format!("{nvml_why}; {rocm_why}")),
                },
            },
            None => Source::Rapl(rapl::Rapl::open(&self.rapl_root)?),
        };
        Ok(EnergyMeter { source })
    }
}

/// An open energy counter.
#[derive(Clone, Debug)]
pub struct EnergyMeter {
    source: Source,
}

#[derive(Clone, Debug)]
enum Source {
    Rapl(rapl::Rapl),
    Nvml(nvml::Nvml),
    Rocm(rocm_smi::RocmSmi),
}

/// One reading of a counter (raw, per domain), for [`EnergyMeter::joules_since`].
#[derive(Clone, Debug, PartialEq)]
pub struct EnergyReading(Vec<u64>);

/// Whether a counter covers one device or the whole node's CPU packages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// The CPU packages of the node (RAPL).
    Node,
    /// One GPU (NVML, ROCm SMI).
    Device,
}

impl EnergyMeter {
    /// The counter's current raw values.
    pub fn read(&self) -> Result<EnergyReading, String> {
        match &self.source {
            Source::Rapl(r) => r.read(),
            Source::Nvml(n) => n.read().map(|mj| vec![mj]),
            Source::Rocm(r) => r.read().map(|uj| vec![uj]),
        }
        .map(EnergyReading)
    }

    /// Joules used since `before` (a RAPL counter that wrapped once is
    /// unwrapped with its `max_energy_range_uj`).
    pub fn joules_since(&self, before: &EnergyReading) -> Result<f64, String> {
        let now = self.read()?;
        Ok(match &self.source {
            Source::Rapl(r) => r.joules_between(&before.0, &now.0),
            Source::Nvml(_) => now.0[0].wrapping_sub(before.0[0]) as f64 * 1e-3,
            Source::Rocm(r) => now.0[0].wrapping_sub(before.0[0]) as f64 * r.joules_per_count(),
        })
    }

    /// What the counter covers.
    pub fn coverage(&self) -> Coverage {
        match self.source {
            Source::Rapl(_) => Coverage::Node,
            _ => Coverage::Device,
        }
    }
}

impl fmt::Display for EnergyMeter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Source::Rapl(r) => write!(f, "RAPL ({})", r.describe()),
            Source::Nvml(n) => write!(f, "NVML (GPU {})", n.index()),
            Source::Rocm(r) => write!(f, "ROCm SMI (GPU {})", r.index()),
        }
    }
}
