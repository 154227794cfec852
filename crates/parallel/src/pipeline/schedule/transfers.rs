//! The transfers of a compute order, grouped into exchanges.
//!
//! Each compute needs at most one receive (a forward its input activation,
//! a backward its output's gradient) and gives at most one send (a forward
//! its output, a backward its input's gradient), none at the ends of the
//! pipeline or between chunks of the same stage. Two placements of the
//! receives, both with each send in the exchange right after its compute:
//!
//! - [`just_in_time`]: each receive in the exchange right before its
//!   compute, with the sends of the compute before (Megatron-LM's
//!   `send_forward_recv_backward` / `send_backward_recv_forward` pattern of
//!   1F1B, and of GPipe);
//! - [`lockstep`]: the computes are grouped into iterations with one
//!   exchange after each, and every iteration gets a tick: one more than
//!   the iteration before it on its stage and than every iteration of
//!   another stage it receives from (the iterations in unit time, as soon
//!   as they can run). A send is received by the neighbour in its exchange
//!   of the send's tick, after its last iteration at or before that tick
//!   (Megatron-LM's interleaved schedule, which batches the sends and
//!   receives of an iteration into one `batch_isend_irecv` and receives
//!   what the neighbours send in the same iteration). The exchange after an
//!   iteration holds the transfers of the ticks from that iteration's up
//!   to the next one's, so once every transfer of the ticks before `t` has
//!   completed, each stage reaches the exchange that holds its tick-`t`
//!   transfers, and these complete: no cycle of waiting sends can form,
//!   whatever the compute times. Receiving just in time instead deadlocks
//!   the interleaved schedule (at `p = 2, m = 4, v = 2` both stages block
//!   in a gradient send that the other receives only later).

use std::collections::HashMap;
use std::mem;

use super::{other_end, Action, Payload, PipeShape, Transfer};

/// One end, on `stage`, of the transfer that `compute` receives (`send`
/// false) or sends: a forward receives and sends activations, a backward
/// gradients. `None` when the other end is past the pipeline's end or on
/// the same stage.
fn end(shape: PipeShape, stage: usize, send: bool, compute: &Action) -> Option<Transfer> {
    let (payload, micro_batch, chunk) = match *compute {
        Action::Forward { micro_batch, chunk } => (Payload::Activation, micro_batch, chunk),
        Action::Backward { micro_batch, chunk } => (Payload::Gradient, micro_batch, chunk),
        Action::Exchange(_) => unreachable!("a compute order holds computes only"),
    };
    let there = other_end(shape, shape.virtual_stage(stage, chunk), send, payload)?;
    let peer = there % shape.stages;
    (peer != stage).then_some(Transfer {
        send,
        payload,
        micro_batch,
        chunk,
        peer,
    })
}

/// The receive that `compute` on `stage` needs before it runs.
fn needs(shape: PipeShape, stage: usize, compute: &Action) -> Option<Transfer> {
    end(shape, stage, false, compute)
}

/// The send that `compute` on `stage` gives after it ran.
fn gives(shape: PipeShape, stage: usize, compute: &Action) -> Option<Transfer> {
    end(shape, stage, true, compute)
}

/// Appends `transfers` as one exchange, unless there are none.
fn flush(actions: &mut Vec<Action>, transfers: &mut Vec<Transfer>) {
    if !transfers.is_empty() {
        actions.push(Action::Exchange(mem::take(transfers)));
    }
}

/// The actions of `stage` for the compute order `order`, each receive
/// posted together with the sends of the compute before it.
pub(super) fn just_in_time(shape: PipeShape, stage: usize, order: &[Action]) -> Vec<Action> {
    let mut actions = Vec::new();
    let mut transfers = Vec::new();
    for compute in order {
        transfers.extend(needs(shape, stage, compute));
        flush(&mut actions, &mut transfers);
        actions.push(compute.clone());
        transfers.extend(gives(shape, stage, compute));
    }
    flush(&mut actions, &mut transfers);
    actions
}

/// The actions of `stage` when every stage `s` runs the iterations
/// `iterations(s)`, the transfers placed on the tick grid of [`ticks`].
pub(super) fn lockstep(
    shape: PipeShape,
    stage: usize,
    iterations: impl Fn(usize) -> Vec<Vec<Action>>,
) -> Vec<Action> {
    let all: Vec<Vec<Vec<Action>>> = (0..shape.stages).map(iterations).collect();
    let ticks = ticks(shape, &all);
    let own = &ticks[stage];
    // The exchange of tick `t` follows the last iteration of `stage` at or
    // before `t`: exchanges[g] comes after the first g iterations.
    let mut exchanges: Vec<Vec<(usize, Transfer)>> = vec![Vec::new(); own.len() + 1];
    for (q, iterations) in all.iter().enumerate() {
        for (k, iteration) in iterations.iter().enumerate() {
            let tick = ticks[q][k];
            for send in iteration.iter().filter_map(|c| gives(shape, q, c)) {
                let here = if q == stage {
                    send
                } else if send.peer == stage {
                    send.counterpart(shape, q).expect("a send built by `end`")
                } else {
                    continue;
                };
                exchanges[own.partition_point(|&t| t <= tick)].push((tick, here));
            }
        }
    }
    let mut actions = Vec::new();
    let mut iterations = all.into_iter().nth(stage).expect("stage < p").into_iter();
    for mut exchange in exchanges {
        exchange.sort_by_key(|&(tick, transfer)| (tick, !transfer.send));
        flush(
            &mut actions,
            &mut exchange.into_iter().map(|(_, t)| t).collect(),
        );
        actions.extend(iterations.next().into_iter().flatten());
    }
    actions
}

/// The tick of every iteration of every stage (`all[s][k]`): one more than
/// the tick of the iteration before on the same stage, and than the ticks
/// of the iterations of other stages that its computes receive from; the
/// first iteration of a stage that receives nothing at tick 0.
///
/// Panics if the compute orders wait on each other in a cycle (a bug).
fn ticks(shape: PipeShape, all: &[Vec<Vec<Action>>]) -> Vec<Vec<usize>> {
    // (stage, payload, micro-batch, chunk) of a compute -> its tick.
    let mut done = HashMap::new();
    let key = |stage: usize, compute: &Action| match *compute {
        Action::Forward { micro_batch, chunk } => (stage, Payload::Activation, micro_batch, chunk),
        Action::Backward { micro_batch, chunk } => (stage, Payload::Gradient, micro_batch, chunk),
        Action::Exchange(_) => unreachable!("a compute order holds computes only"),
    };
    let mut ticks: Vec<Vec<usize>> = vec![Vec::new(); all.len()];
    while ticks
        .iter()
        .zip(all)
        .any(|(t, iterations)| t.len() < iterations.len())
    {
        let mut progress = false;
        for (s, iterations) in all.iter().enumerate() {
            'stage: while let Some(iteration) = iterations.get(ticks[s].len()) {
                let mut tick = ticks[s].last().map_or(0, |t| t + 1);
                for compute in iteration {
                    let Some(recv) = needs(shape, s, compute) else {
                        continue;
                    };
                    let from = recv
                        .counterpart(shape, s)
                        .expect("a receive built by `end`");
                    let producer = (recv.peer, recv.payload, recv.micro_batch, from.chunk);
                    match done.get(&producer) {
                        Some(&t) => tick = tick.max(t + 1),
                        None => break 'stage,
                    }
                }
                for compute in iteration {
                    done.insert(key(s, compute), tick);
                }
                ticks[s].push(tick);
                progress = true;
            }
        }
        assert!(
            progress,
            "the compute orders of {shape:?} wait on each other in a cycle"
        );
    }
    ticks
}
