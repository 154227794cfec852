//! Accelerators the planner and MFU know: memory, dense peaks, board power.

use crate::precision::Precision;

/// One accelerator type, from its vendor's data sheet (dense math, no
/// sparsity). A `cpu` entry has no figures: its user gives them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceSpec {
    /// Name used on the command line (`a100-40gb`, `h100-80gb`, ...).
    pub name: &'static str,
    /// Memory of one device, bytes.
    pub memory_bytes: f64,
    /// Dense bf16/fp16 tensor-core peak, FLOP/s.
    pub bf16_flops: f64,
    /// Dense fp32 peak (vector units, not TF32), FLOP/s.
    pub fp32_flops: f64,
    /// Board power (TDP), watts: the planner's energy estimate.
    pub tdp_w: f64,
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The known devices. Sources: NVIDIA A100 data sheet (SXM: 312 TFLOP/s
/// bf16 dense, 19.5 fp32, 400 W), H100 SXM5 data sheet (989 bf16 dense,
/// 67 fp32, 700 W), H200 SXM data sheet (same compute, 141 GB, 700 W),
/// AMD Instinct MI250X (383 TFLOP/s bf16 and 47.9 fp32 vector for the two
/// GCDs, 128 GB, 500 W: one GCD is half of each) and MI300X (1307.4 bf16
/// dense, 163.4 fp32 vector, 192 GB, 750 W).
pub const DEVICES: &[DeviceSpec] = &[
    DeviceSpec {
        name: "a100-40gb",
        memory_bytes: 40.0 * GIB,
        bf16_flops: 312e12,
        fp32_flops: 19.5e12,
        tdp_w: 400.0,
    },
    DeviceSpec {
        name: "a100-80gb",
        memory_bytes: 80.0 * GIB,
        bf16_flops: 312e12,
        fp32_flops: 19.5e12,
        tdp_w: 400.0,
    },
    DeviceSpec {
        name: "h100-80gb",
        memory_bytes: 80.0 * GIB,
        bf16_flops: 989e12,
        fp32_flops: 67e12,
        tdp_w: 700.0,
    },
    DeviceSpec {
        name: "h200",
        memory_bytes: 141e9,
        bf16_flops: 989e12,
        fp32_flops: 67e12,
        tdp_w: 700.0,
    },
    DeviceSpec {
        name: "mi250x-gcd",
        memory_bytes: 64.0 * GIB,
        bf16_flops: 191.5e12,
        fp32_flops: 23.95e12,
        tdp_w: 250.0,
    },
    DeviceSpec {
        name: "mi300x",
        memory_bytes: 192.0 * GIB,
        bf16_flops: 1307.4e12,
        fp32_flops: 163.4e12,
        tdp_w: 750.0,
    },
    DeviceSpec {
        name: "cpu",
        memory_bytes: 0.0,
        bf16_flops: 0.0,
        fp32_flops: 0.0,
        tdp_w: 0.0,
    },
];

/// The table's entry for `name` (case-insensitive), if listed.
pub fn device_spec(name: &str) -> Option<DeviceSpec> {
    let n = name.to_ascii_lowercase();
    DEVICES.iter().find(|d| d.name == n).copied()
}

impl DeviceSpec {
    /// The data-sheet peak of a run computing in `precision`, FLOP/s: the
    /// vector units' for fp32, the matrix units' for bf16 and fp16 (the
    /// precision the step's matrix products run in).
    pub fn peak_flops(&self, precision: Precision) -> f64 {
        match precision {
            Precision::Fp32 => self.fp32_flops,
            Precision::Bf16 | Precision::Fp16 => self.bf16_flops,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_follows_the_precision_and_one_mi250x_gcd_is_half_a_module() {
        let h100 = device_spec("H100-80GB").unwrap();
        assert_eq!(h100.peak_flops(Precision::Bf16), 989e12);
        assert_eq!(h100.peak_flops(Precision::Fp16), 989e12);
        assert_eq!(h100.peak_flops(Precision::Fp32), 67e12);
        // AMD's MI250X figures are for the module's two GCDs; a rank
        // drives one.
        let gcd = device_spec("mi250x-gcd").unwrap();
        assert_eq!(gcd.peak_flops(Precision::Bf16), 383e12 / 2.0);
        assert_eq!(device_spec("H200").unwrap().name, "h200");
        assert!(device_spec("tpu").is_none());
    }
}
