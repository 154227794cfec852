//! `--precision`: the compute dtype a run resolves to, and the
//! combinations that are refused.

use ferrotron_engine::backend::BackendKind;
use ferrotron_engine::precision::Precision;
use ferrotron_parallel::mesh::Mesh;

use crate::error::usage;
use crate::settings::TrainSettings;

/// The run's compute precision: `--precision`, or fp32 on the CPU
/// backends and wgpu and bf16 on cuda and rocm. Errors (naming the flag) for a low
/// precision with tensor or pipeline parallelism, whose communication of
/// activations is f32-only.
pub fn resolve_precision(
    s: &TrainSettings,
    kind: BackendKind,
    mesh: &Mesh,
) -> anyhow::Result<Precision> {
    let precision = s.precision.unwrap_or(if kind.defaults_to_bf16() {
        Precision::Bf16
    } else {
        Precision::Fp32
    });
    if precision != Precision::Fp32 {
        for (flag, degree) in [("--tp", mesh.tp), ("--pp", mesh.pp)] {
            if degree > 1 {
                return Err(usage(format!(
                    "--precision {precision} with {flag} {degree}: mixed precision is not implemented with tensor or pipeline parallelism yet; use --precision fp32"
                )));
            }
        }
    }
    Ok(precision)
}
