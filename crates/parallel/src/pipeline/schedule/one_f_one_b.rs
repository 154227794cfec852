//! 1F1B (PipeDream-Flush, Narayanan et al. 2021), in the order of
//! Megatron-LM's `forward_backward_pipelining_without_interleaving`.
//!
//! Stage `s` runs `w = min(p - s - 1, m)` warm-up forwards, then `m - w`
//! pairs of one forward and one backward (steady state), then the `w`
//! backwards left (cool-down). At most `w + 1 = p - s` micro-batches are in
//! flight on stage `s` (their activations held), against `m` for GPipe.

use super::{Action, PipeShape};

/// The compute order of stage `stage`.
pub(super) fn order(shape: PipeShape, stage: usize) -> Vec<Action> {
    let (p, m) = (shape.stages, shape.micro_batches);
    let warm_up = (p - stage - 1).min(m);
    let f = |micro_batch| Action::Forward {
        micro_batch,
        chunk: 0,
    };
    let b = |micro_batch| Action::Backward {
        micro_batch,
        chunk: 0,
    };
    let mut order: Vec<Action> = (0..warm_up).map(f).collect();
    for i in 0..m - warm_up {
        order.extend([f(warm_up + i), b(i)]);
    }
    order.extend((m - warm_up..m).map(b));
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_f_one_b_warms_up_with_the_stages_after_it() {
        let shape = PipeShape {
            stages: 3,
            micro_batches: 4,
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
        // Stage 0: two warm-up forwards, two 1F1B pairs, two cool-down backwards.
        assert_eq!(
            order(shape, 0),
            vec![f(0), f(1), f(2), b(0), f(3), b(1), b(2), b(3)]
        );
        // The last stage alternates from the start.
        assert_eq!(
            order(shape, 2),
            vec![f(0), b(0), f(1), b(1), f(2), b(2), f(3), b(3)]
        );
        // Fewer micro-batches than stages: all forwards, then all backwards.
        let short = PipeShape {
            micro_batches: 1,
            ..shape
        };
        assert_eq!(order(short, 0), vec![f(0), b(0)]);
    }
}
