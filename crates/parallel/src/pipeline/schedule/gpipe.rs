//! GPipe (Huang et al. 2019): every forward, then every backward.
//!
//! The backwards run in micro-batch order `0..m`, as PyTorch's
//! `torch.distributed.pipelining.ScheduleGPipe` (torchtitan's GPipe) runs
//! them; the order changes neither the bubble nor the memory, which holds
//! the activations of all `m` micro-batches at the turn.

use super::{Action, PipeShape};

/// The compute order of every stage (the same on each): forwards `0..m`,
/// then backwards `0..m`, all on chunk 0.
pub(super) fn order(shape: PipeShape) -> Vec<Action> {
    let m = shape.micro_batches;
    let forwards = (0..m).map(|micro_batch| Action::Forward {
        micro_batch,
        chunk: 0,
    });
    let backwards = (0..m).map(|micro_batch| Action::Backward {
        micro_batch,
        chunk: 0,
    });
    forwards.chain(backwards).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpipe_runs_every_forward_before_any_backward() {
        let shape = PipeShape {
            stages: 2,
            micro_batches: 3,
            chunks: 1,
        };
        let f = |micro_batch| Action::Forward {
            micro_batch,
            chunk: 0,
        };
        let b = |micro_batch| Action::Backward {
            micro_batch,
            chunk: 0,
        };
        assert_eq!(order(shape), vec![f(0), f(1), f(2), b(0), b(1), b(2)]);
    }
}
