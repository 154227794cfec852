//! Interleaved 1F1B (Narayanan et al. 2021, §2.2), in the order of
//! Megatron-LM's `forward_backward_pipelining_with_interleaving`.
//!
//! Each stage holds `v` chunks and runs `m * v` forwards and as many
//! backwards. Its `k`-th forward is on chunk `(k % (p v)) / p`, its `k`-th
//! backward on chunk `v - 1 - (k % (p v)) / p`, both of micro-batch
//! `(k / (p v)) * p + k % p`: groups of `p` micro-batches go through one
//! chunk, then the next. Stage `s` warms up with
//! `min(2 (p - s - 1) + (v - 1) p, m v)` forwards (all of them when
//! `m = p`), then runs forward-backward pairs, then the backwards left.
//!
//! Megatron-LM runs the step as iterations, each followed by one exchange
//! with the neighbours (one forward in the warm-up, a forward and a
//! backward in the steady state, one backward in the cool-down); the
//! transfers are placed on these iterations by
//! [`super::transfers::lockstep`].

use super::{Action, PipeShape};

/// The computes of stage `stage`, grouped by iteration.
pub(super) fn iterations(shape: PipeShape, stage: usize) -> Vec<Vec<Action>> {
    let (p, m, v) = (shape.stages, shape.micro_batches, shape.chunks);
    let total = m * v;
    let warm_up = if m == p {
        total
    } else {
        (2 * (p - stage - 1) + (v - 1) * p).min(total)
    };
    let micro_batch = |k: usize| (k / (p * v)) * p + k % p;
    let chunk = |k: usize| (k % (p * v)) / p;
    let f = |k| Action::Forward {
        micro_batch: micro_batch(k),
        chunk: chunk(k),
    };
    let b = |k| Action::Backward {
        micro_batch: micro_batch(k),
        chunk: v - 1 - chunk(k),
    };
    let mut iterations: Vec<Vec<Action>> = (0..warm_up).map(|k| vec![f(k)]).collect();
    iterations.extend((0..total - warm_up).map(|k| vec![f(warm_up + k), b(k)]));
    iterations.extend((total - warm_up..total).map(|k| vec![b(k)]));
    iterations
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_cycles_groups_of_p_micro_batches_through_the_chunks() {
        let shape = PipeShape {
            stages: 2,
            micro_batches: 4,
            chunks: 2,
        };
        let f = |micro_batch, chunk| Action::Forward { micro_batch, chunk };
        let b = |micro_batch, chunk| Action::Backward { micro_batch, chunk };
        // Stage 0 warms up with 2 (p - 1) + (v - 1) p = 4 forwards.
        let want = [
            vec![f(0, 0)],
            vec![f(1, 0)],
            vec![f(0, 1)],
            vec![f(1, 1)],
            vec![f(2, 0), b(0, 1)],
            vec![f(3, 0), b(1, 1)],
            vec![f(2, 1), b(0, 0)],
            vec![f(3, 1), b(1, 0)],
            vec![b(2, 1)],
            vec![b(3, 1)],
            vec![b(2, 0)],
            vec![b(3, 0)],
        ];
        assert_eq!(iterations(shape, 0), want);
        // The last stage warms up with (v - 1) p = 2.
        assert_eq!(iterations(shape, 1)[2], vec![f(0, 1), b(0, 1)]);
        // m = p: every forward is warm-up.
        let full = PipeShape {
            micro_batches: 2,
            ..shape
        };
        assert!(iterations(full, 1)[..4]
            .iter()
            .all(|it| matches!(it[..], [Action::Forward { .. }])));
    }
}
