//! The compute backends compiled into this build and how to name them.
//!
//! Each backend is a cargo feature (`flex` by default; `ndarray`, `wgpu`,
//! `cuda`, `rocm` opt-in). Training code is generic over `burn::tensor::backend::Backend`;
//! the CLI picks one of the compiled backends at run time and calls the
//! generic function once.

use std::fmt;
use std::str::FromStr;

use crate::precision::Precision;

/// The notice of a rocm run with `--precision` unset (see
/// [`BackendKind::default_precision`]).
const BF16_NOTICE: &str = "note: precision.compute unset: fp32, because bf16 has not yet \
     run on an AMD GPU (--precision bf16 to try it)";

/// A backend the user can ask for with `--backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// burn-flex: pure-Rust CPU backend (gemm + SIMD + rayon).
    Flex,
    /// burn-ndarray: the older pure-Rust CPU backend.
    Ndarray,
    /// Any GPU (or a CPU Vulkan driver such as Mesa's lavapipe) through
    /// CubeCL's wgpu runtime: Vulkan, Metal or DirectX 12.
    Wgpu,
    /// NVIDIA GPUs through CubeCL's CUDA runtime (driver loaded at run time).
    Cuda,
    /// AMD GPUs through CubeCL's HIP runtime (driver loaded at run time).
    Rocm,
}

/// Every backend name, compiled or not, in the order they are listed to users.
pub const ALL_BACKENDS: [BackendKind; 5] = [
    BackendKind::Flex,
    BackendKind::Ndarray,
    BackendKind::Wgpu,
    BackendKind::Cuda,
    BackendKind::Rocm,
];

impl BackendKind {
    /// The name used on the command line and in config files.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Flex => "flex",
            BackendKind::Ndarray => "ndarray",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Rocm => "rocm",
        }
    }

    /// Whether this build contains the backend (its cargo feature was on).
    pub fn is_compiled(self) -> bool {
        match self {
            BackendKind::Flex => cfg!(feature = "flex"),
            BackendKind::Ndarray => cfg!(feature = "ndarray"),
            BackendKind::Wgpu => cfg!(feature = "wgpu"),
            BackendKind::Cuda => cfg!(feature = "cuda"),
            BackendKind::Rocm => cfg!(feature = "rocm"),
        }
    }

    /// Whether the backend computes on the CPU.
    pub fn is_cpu(self) -> bool {
        matches!(self, BackendKind::Flex | BackendKind::Ndarray)
    }

    /// The compute precision of a run on this backend with `--precision`
    /// unset, and the one-line notice that goes with it. bf16 on cuda: an
    /// H100 ran 100 bf16 steps of gpt-mini with losses within 1.1% of fp32
    /// (docs/benchmarks.md). fp32 on rocm, with a notice: nothing has run
    /// on an AMD GPU yet. The CPU backends and wgpu (WGSL has no bf16 type)
    /// default to fp32 silently.
    pub fn default_precision(self) -> (Precision, Option<&'static str>) {
        match self {
            BackendKind::Cuda => (Precision::Bf16, None),
            BackendKind::Rocm => (Precision::Fp32, Some(BF16_NOTICE)),
            _ => (Precision::Fp32, None),
        }
    }

    /// The backends compiled into this build.
    pub fn compiled() -> Vec<BackendKind> {
        ALL_BACKENDS
            .into_iter()
            .filter(|b| b.is_compiled())
            .collect()
    }

    /// The default backend of this build: the first compiled one
    /// (flex in a default build, measured fastest on CPUs; see README).
    pub fn default_compiled() -> Option<BackendKind> {
        Self::compiled().into_iter().next()
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A backend that cannot be used: unknown, not compiled in, or without its driver.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The name is not a backend of this build.
    #[error("unknown or unavailable backend '{given}': this build offers {offered} (others need their cargo feature: {all})")]
    Unknown {
        /// What the user asked for.
        given: String,
        /// Comma-separated compiled backends.
        offered: String,
        /// Comma-separated names of every backend.
        all: String,
    },
    /// The backend is compiled in but its driver library does not load.
    #[error("backend '{backend}' is compiled in but unusable here: {detail}")]
    DriverMissing {
        /// The backend's name.
        backend: &'static str,
        /// Which libraries were tried and what to do.
        detail: String,
    },
}

impl BackendKind {
    /// Checks that the backend can start on this machine: for GPU backends,
    /// that the driver libraries load, probed with the same loaders the
    /// CubeCL runtimes use (their own failure is a panic, on ROCm an abort).
    pub fn check_runtime(self) -> Result<(), BackendError> {
        match self {
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => {
                let names = cudarc::get_lib_name_candidates("cuda");
                // SAFETY: loading the CUDA driver runs only its initialisers.
                let loads = |n: &String| unsafe { libloading::Library::new(n) }.is_ok();
                if names.iter().any(loads) {
                    Ok(())
                } else {
                    Err(BackendError::DriverMissing {
                        backend: "cuda",
                        detail: format!(
                            "the NVIDIA driver library does not load (tried {}); install the driver or set LD_LIBRARY_PATH",
                            names.first().map(String::as_str).unwrap_or("libcuda.so")
                        ),
                    })
                }
            }
            #[cfg(feature = "rocm")]
            BackendKind::Rocm => {
                if cubecl_hip_sys::is_available() {
                    Ok(())
                } else {
                    Err(BackendError::DriverMissing {
                        backend: "rocm",
                        detail: "libamdhip64.so / libhiprtc.so do not load; install ROCm or set ROCM_PATH".into(),
                    })
                }
            }
            _ => Ok(()),
        }
    }
}

impl FromStr for BackendKind {
    type Err = BackendError;

    /// Parses a backend name, accepting only backends compiled into this build.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let names = |v: &[BackendKind]| v.iter().map(|b| b.name()).collect::<Vec<_>>().join(", ");
        ALL_BACKENDS
            .into_iter()
            .find(|b| b.name() == s && b.is_compiled())
            .ok_or_else(|| BackendError::Unknown {
                given: s.to_string(),
                offered: names(&BackendKind::compiled()),
                all: names(&ALL_BACKENDS),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_build_offers_flex_and_rejects_unknown_names() {
        assert_eq!(BackendKind::default_compiled(), Some(BackendKind::Flex));
        assert_eq!("flex".parse::<BackendKind>().unwrap(), BackendKind::Flex);
        let err = "tpu".parse::<BackendKind>().unwrap_err().to_string();
        assert!(err.contains("'tpu'") && err.contains("flex"), "{err}");
    }

    #[test]
    fn cuda_defaults_to_bf16_and_rocm_to_fp32_with_a_notice() {
        for kind in ALL_BACKENDS {
            let (precision, notice) = kind.default_precision();
            let bf16 = kind == BackendKind::Cuda;
            let expected = if bf16 {
                Precision::Bf16
            } else {
                Precision::Fp32
            };
            assert_eq!(precision, expected, "{kind}");
            assert_eq!(notice.is_some(), kind == BackendKind::Rocm, "{kind}");
            if let Some(n) = notice {
                assert!(n.contains("bf16") && n.contains("--precision bf16"), "{n}");
                assert_eq!(n.lines().count(), 1, "{n}");
            }
        }
    }
}
