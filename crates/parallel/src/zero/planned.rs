//! The training state a rank will hold, from the parameter count alone:
//! the pre-check `ferrotron train` makes before it allocates a model.

use ferrotron_engine::metrics::MemoryBytes;

use super::ZeroStage;

/// Bytes of fp32 training state per rank for `params` parameters over `dp`
/// data-parallel ranks at ZeRO `stage`: parameters 4, gradients 4 and
/// AdamW's two moments 8 bytes per parameter, the sharded classes divided
/// by `dp` (stage 1: optimizer state; 2: + gradients; 3: + parameters),
/// rounded up. Activations are not counted. The trainer's
/// `planned_memory` gives the same classes from the built layout (which
/// pads shards to whole units).
pub fn planned_state_bytes(params: usize, dp: usize, stage: ZeroStage) -> MemoryBytes {
    let dp = dp.max(1);
    let bytes = |per_param: usize, sharded: bool| {
        let total = per_param.saturating_mul(params);
        if sharded {
            total.div_ceil(dp)
        } else {
            total
        }
    };
    MemoryBytes {
        param_bytes: bytes(4, stage >= ZeroStage::Three),
        grad_bytes: bytes(4, stage >= ZeroStage::Two),
        optimizer_bytes: bytes(8, stage >= ZeroStage::One),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stage_shards_its_classes() {
        let total = |m: MemoryBytes| m.param_bytes + m.grad_bytes + m.optimizer_bytes;
        assert_eq!(total(planned_state_bytes(1000, 4, ZeroStage::Off)), 16_000);
        assert_eq!(
            planned_state_bytes(1000, 4, ZeroStage::One),
            MemoryBytes {
                param_bytes: 4000,
                grad_bytes: 4000,
                optimizer_bytes: 2000
            }
        );
        assert_eq!(
            total(planned_state_bytes(1000, 4, ZeroStage::Two)),
            4000 + 1000 + 2000
        );
        assert_eq!(total(planned_state_bytes(1000, 4, ZeroStage::Three)), 4000);
        assert_eq!(
            total(planned_state_bytes(1000, 1, ZeroStage::Three)),
            16_000
        );
    }
}
