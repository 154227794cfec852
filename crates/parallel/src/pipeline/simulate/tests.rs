//! The schedules under the simulator: deadlock-free, in order, matched
//! transfers, the in-flight bound of 1F1B and the bubble formulas; and the
//! simulator's own checks on broken lists.

use super::*;
use crate::pipeline::schedule::Payload;

const STAGES: [usize; 5] = [1, 2, 3, 4, 8];
const MICRO_BATCHES: [usize; 9] = [1, 2, 3, 4, 5, 6, 7, 8, 16];

/// Every (kind, shape) of the tests: GPipe and 1F1B for every `p` and `m`,
/// interleaved with `v = 2, 3` where `p` divides `m`.
fn cases() -> Vec<(ScheduleKind, PipeShape)> {
    let mut cases = Vec::new();
    for stages in STAGES {
        for micro_batches in MICRO_BATCHES {
            for kind in [ScheduleKind::GPipe, ScheduleKind::OneFOneB] {
                cases.push((
                    kind,
                    PipeShape {
                        stages,
                        micro_batches,
                        chunks: 1,
                    },
                ));
            }
            if micro_batches.is_multiple_of(stages) {
                for chunks in [2, 3] {
                    let shape = PipeShape {
                        stages,
                        micro_batches,
                        chunks,
                    };
                    cases.push((ScheduleKind::Interleaved, shape));
                }
            }
        }
    }
    cases
}

fn lists(kind: ScheduleKind, shape: PipeShape) -> Vec<Vec<Action>> {
    (0..shape.stages)
        .map(|s| stage_actions(kind, shape, s).unwrap())
        .collect()
}

/// The bubble of the formula: `(p - 1) / (v m)`.
fn formula(shape: PipeShape) -> f64 {
    (shape.stages - 1) as f64 / (shape.chunks * shape.micro_batches) as f64
}

#[test]
fn every_schedule_runs_to_the_end_without_deadlock() {
    for (kind, shape) in cases() {
        for (forward, backward) in [(1.0, 1.0), (1.0, 2.0)] {
            let timeline = simulate(kind, shape, forward, backward)
                .unwrap_or_else(|e| panic!("{kind:?} {shape:?}: {e}"));
            // Each stage computed every forward and backward once (the
            // simulator checks which; here, how long).
            for busy in &timeline.busy {
                assert_eq!(*busy, timeline.ideal, "{kind:?} {shape:?}");
            }
        }
    }
}

#[test]
fn every_forward_precedes_its_backward() {
    for (kind, shape) in cases() {
        for (s, list) in lists(kind, shape).iter().enumerate() {
            let position = |want: &Action| list.iter().position(|a| a == want).unwrap();
            for micro_batch in 0..shape.micro_batches {
                for chunk in 0..shape.chunks {
                    let forward = position(&Action::Forward { micro_batch, chunk });
                    let backward = position(&Action::Backward { micro_batch, chunk });
                    assert!(forward < backward, "{kind:?} {shape:?} stage {s}");
                }
            }
        }
    }
}

#[test]
fn every_send_meets_exactly_one_receive() {
    for (kind, shape) in cases() {
        let lists = lists(kind, shape);
        let transfers = |s: usize| -> Vec<Transfer> {
            lists[s]
                .iter()
                .flat_map(|a| match a {
                    Action::Exchange(ts) => ts.clone(),
                    _ => Vec::new(),
                })
                .collect()
        };
        let mut sends = 0;
        for s in 0..shape.stages {
            for transfer in transfers(s) {
                let other = transfer
                    .counterpart(shape, s)
                    .expect("a transfer of the pipeline");
                let matches = transfers(transfer.peer)
                    .iter()
                    .filter(|t| **t == other)
                    .count();
                assert_eq!(matches, 1, "{kind:?} {shape:?} stage {s} {transfer:?}");
                sends += usize::from(transfer.send);
            }
        }
        // Two sends per micro-batch and virtual-stage boundary that crosses
        // stages: the activation forward, its gradient backward.
        let crossing = if shape.stages == 1 {
            0
        } else {
            shape.virtual_stages() - 1
        };
        assert_eq!(
            sends,
            2 * crossing * shape.micro_batches,
            "{kind:?} {shape:?}"
        );
    }
}

#[test]
fn one_stage_has_no_exchange() {
    for (kind, shape) in cases().into_iter().filter(|(_, shape)| shape.stages == 1) {
        let list = stage_actions(kind, shape, 0).unwrap();
        assert!(
            !list.iter().any(|a| matches!(a, Action::Exchange(_))),
            "{kind:?} {shape:?}"
        );
    }
}

#[test]
fn one_f_one_b_holds_at_most_p_minus_s_micro_batches_and_gpipe_all_m() {
    for (kind, shape) in cases() {
        let timeline = simulate(kind, shape, 1.0, 1.0).unwrap();
        for (s, peak) in timeline.peak_in_flight.iter().enumerate() {
            let (p, m) = (shape.stages, shape.micro_batches);
            match kind {
                ScheduleKind::GPipe => assert_eq!(*peak, m, "{shape:?} stage {s}"),
                ScheduleKind::OneFOneB => assert_eq!(*peak, (p - s).min(m), "{shape:?} stage {s}"),
                // The warm-up forwards and the forward of the first pair.
                ScheduleKind::Interleaved => {
                    let total = m * shape.chunks;
                    let warm_up = 2 * (p - s - 1) + (shape.chunks - 1) * p;
                    let want = if m == p {
                        total
                    } else {
                        (warm_up + 1).min(total)
                    };
                    assert_eq!(*peak, want, "{shape:?} stage {s}");
                }
            }
        }
    }
}

#[test]
fn bubble_is_p_minus_1_over_v_m() {
    for (kind, shape) in cases() {
        for (forward, backward) in [(1.0, 1.0), (1.0, 2.0)] {
            let timeline = simulate(kind, shape, forward, backward).unwrap();
            let (bubble, want) = (timeline.bubble_fraction(), formula(shape));
            assert!(
                (bubble - want).abs() < 1e-12,
                "{kind:?} {shape:?} F {forward} B {backward}: bubble {bubble}, formula {want}"
            );
        }
    }
}

fn f(micro_batch: usize) -> Action {
    Action::Forward {
        micro_batch,
        chunk: 0,
    }
}

fn b(micro_batch: usize) -> Action {
    Action::Backward {
        micro_batch,
        chunk: 0,
    }
}

fn x(transfers: &[Transfer]) -> Action {
    Action::Exchange(transfers.to_vec())
}

/// A transfer of chunk 0 (all there is with `v = 1`).
fn t(send: bool, payload: Payload, micro_batch: usize, peer: usize) -> Transfer {
    Transfer {
        send,
        payload,
        micro_batch,
        chunk: 0,
        peer,
    }
}

#[test]
fn facing_blocking_sends_deadlock_and_paired_ones_run() {
    use Payload::{Activation as A, Gradient as G};
    let shape = PipeShape {
        stages: 2,
        micro_batches: 2,
        chunks: 1,
    };
    // Stage 0 sends activation 1 before it receives gradient 0; stage 1
    // sends gradient 0 before it receives activation 1: each send waits for
    // a receive the other side posts only after its own send completed.
    let facing = [
        vec![
            f(0),
            x(&[t(true, A, 0, 1)]),
            f(1),
            x(&[t(true, A, 1, 1)]),
            x(&[t(false, G, 0, 1)]),
            b(0),
        ],
        vec![
            x(&[t(false, A, 0, 0)]),
            f(0),
            b(0),
            x(&[t(true, G, 0, 0)]),
            x(&[t(false, A, 1, 0)]),
        ],
    ];
    let want = SimError::Deadlock(vec![
        Stuck {
            stage: 0,
            index: 3,
            waiting: vec![t(true, A, 1, 1)],
        },
        Stuck {
            stage: 1,
            index: 3,
            waiting: vec![t(true, G, 0, 0)],
        },
    ]);
    assert_eq!(simulate_lists(shape, &facing, 1.0, 1.0), Err(want));
    // The same sends, each posted with the receive the other side waits
    // for: 1F1B's lists, which run.
    let paired = [
        vec![
            f(0),
            x(&[t(true, A, 0, 1)]),
            f(1),
            x(&[t(true, A, 1, 1), t(false, G, 0, 1)]),
            b(0),
            x(&[t(false, G, 1, 1)]),
            b(1),
        ],
        vec![
            x(&[t(false, A, 0, 0)]),
            f(0),
            b(0),
            x(&[t(true, G, 0, 0), t(false, A, 1, 0)]),
            f(1),
            b(1),
            x(&[t(true, G, 1, 0)]),
        ],
    ];
    assert_eq!(paired.to_vec(), lists(ScheduleKind::OneFOneB, shape));
    // By hand, forward 1 and backward 2: stage 1 runs F0 [1, 2] and
    // B0 [2, 4], then exchanges with stage 0 (waiting since 2) at 4; stage 0
    // runs B0 [4, 6] and waits for gradient 1, sent after stage 1's
    // F1 [4, 5] B1 [5, 7]; its B1 ends at 9.
    let want = Timeline {
        makespan: 9.0,
        busy: vec![6.0, 6.0],
        peak_in_flight: vec![2, 1],
        ideal: 6.0,
    };
    assert_eq!(simulate_lists(shape, &paired, 1.0, 2.0), Ok(want));
}

#[test]
fn lists_that_could_not_train_are_refused_with_the_reason() {
    use Payload::{Activation as A, Gradient as G};
    let one = PipeShape {
        stages: 1,
        micro_batches: 1,
        chunks: 1,
    };
    let run = |shape, lists: &[Vec<Action>]| simulate_lists(shape, lists, 1.0, 1.0).unwrap_err();
    assert_eq!(
        run(one, &[vec![b(0), f(0)]]),
        SimError::BackwardBeforeForward {
            stage: 0,
            micro_batch: 0,
            chunk: 0
        }
    );
    assert_eq!(
        run(one, &[vec![f(0), f(0), b(0)]]),
        SimError::RepeatedCompute {
            stage: 0,
            action: f(0)
        }
    );
    assert_eq!(
        run(one, &[vec![f(0)]]),
        SimError::MissingCompute {
            stage: 0,
            action: b(0)
        }
    );
    assert_eq!(
        run(one, &[vec![f(1)]]),
        SimError::OutOfRange {
            stage: 0,
            action: f(1)
        }
    );
    let two = PipeShape { stages: 2, ..one };
    let first = vec![f(0), x(&[t(true, A, 0, 1)]), x(&[t(false, G, 0, 1)]), b(0)];
    let last = vec![x(&[t(false, A, 0, 0)]), f(0), b(0), x(&[t(true, G, 0, 0)])];
    assert!(simulate_lists(two, &[first.clone(), last.clone()], 1.0, 1.0).is_ok());
    // The last stage forgets to receive its input, or to send the gradient.
    assert_eq!(
        run(
            two,
            &[first.clone(), vec![f(0), b(0), x(&[t(true, G, 0, 0)])]]
        ),
        SimError::InputMissing {
            stage: 1,
            micro_batch: 0,
            chunk: 0
        }
    );
    assert_eq!(
        run(two, &[first.clone(), last[..3].to_vec()]),
        SimError::Unmatched {
            stage: 0,
            transfer: t(false, G, 0, 1)
        }
    );
    // The first stage runs its backward before the gradient came.
    assert_eq!(
        run(
            two,
            &[
                vec![f(0), x(&[t(true, A, 0, 1)]), b(0), x(&[t(false, G, 0, 1)])],
                last.clone()
            ]
        ),
        SimError::GradientMissing {
            stage: 0,
            micro_batch: 0,
            chunk: 0
        }
    );
    // It sends before computing, sends twice, or sends a gradient out of
    // the first virtual stage.
    assert_eq!(
        run(two, &[vec![x(&[t(true, A, 0, 1)]), f(0)], last.clone()]),
        SimError::SendBeforeCompute {
            stage: 0,
            transfer: t(true, A, 0, 1)
        }
    );
    let twice = [&first[..2], &first[1..]].concat();
    assert_eq!(
        run(two, &[twice, last.clone()]),
        SimError::RepeatedTransfer {
            stage: 0,
            transfer: t(true, A, 0, 1)
        }
    );
    assert_eq!(
        run(two, &[vec![f(0), x(&[t(true, G, 0, 1)])], last]),
        SimError::BadTransfer {
            stage: 0,
            transfer: t(true, G, 0, 1)
        }
    );
}
