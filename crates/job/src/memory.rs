//! The memory pre-check: the model's fp32 training state against the
//! machine's memory, before the model is allocated.

use ferrotron_engine::backend::BackendKind;
use ferrotron_engine::metrics::machine_memory_bytes;
use ferrotron_models::DecoderConfig;
use ferrotron_parallel::zero::{planned_state_bytes, ZeroStage};

/// GiB, for messages.
fn gib(bytes: f64) -> f64 {
    bytes / (1u64 << 30) as f64
}

/// Refuses a model whose parameters + gradients + AdamW state (4 + 4 + 8
/// bytes per parameter, the classes ZeRO `zero` shards divided over `dp`
/// ranks) exceed the machine's total memory (`MemTotal`) on a CPU backend.
/// Activations are not counted, and ranks sharing a machine are not
/// summed: it catches the model that cannot fit, not every one that will
/// not. GPU backends are not checked (the device memory is not queried):
/// `Ok(Some(note))` says so, as it says when no `MemTotal` is readable.
pub fn check_memory(
    model: &DecoderConfig,
    dp: usize,
    zero: ZeroStage,
    kind: BackendKind,
) -> Result<Option<String>, String> {
    let params = model.num_params();
    let need = planned_state_bytes(params, dp, zero);
    if !kind.is_cpu() {
        return Ok(Some(format!(
            "memory pre-check: not done on {kind} (device memory is not queried); training state {:.2} GiB per rank",
            gib(need.total() as f64)
        )));
    }
    let Some(have) = machine_memory_bytes() else {
        return Ok(Some(
            "memory pre-check: not done (no MemTotal in /proc/meminfo)".into(),
        ));
    };
    if need.total() as u64 > have {
        return Err(format!(
            "the model ({:.2} B parameters) needs {:.1} GiB of training state per rank (fp32 parameters {:.1} + gradients {:.1} + AdamW state {:.1} GiB at ZeRO stage {zero} over dp {dp}), more than this machine's {:.1} GiB of memory (MemTotal); choose a smaller model or shard it with --zero over more ranks",
            params as f64 / 1e9,
            gib(need.total() as f64),
            gib(need.param_bytes as f64),
            gib(need.grad_bytes as f64),
            gib(need.optimizer_bytes as f64),
            gib(have as f64)
        ));
    }
    Ok(None)
}
