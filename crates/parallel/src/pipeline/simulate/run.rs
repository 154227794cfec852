//! The simulation loop: each stage in turn goes as far as it can, until
//! no stage can go on.

use std::collections::HashSet;

use super::{SimError, Stuck, Timeline};
use crate::pipeline::schedule::{Action, Payload, PipeShape, Transfer};

/// An exchange a stage has posted and waits in.
struct Open {
    /// The stage's clock when it posted it.
    posted_at: f64,
    /// Its transfers whose other end has not been posted yet.
    waiting: Vec<Transfer>,
    /// When the transfers that completed so far completed.
    done_at: f64,
}

/// One stage's progress through its list.
struct Stage<'a> {
    actions: &'a [Action],
    /// The index of the action it runs next.
    next: usize,
    clock: f64,
    busy: f64,
    in_flight: usize,
    peak_in_flight: usize,
    /// (micro-batch, chunk) of the forwards and backwards run.
    forwards: HashSet<(usize, usize)>,
    backwards: HashSet<(usize, usize)>,
    /// (payload, micro-batch, chunk) of the completed receives.
    received: HashSet<(Payload, usize, usize)>,
    posted: HashSet<Transfer>,
    open: Option<Open>,
}

/// Runs `lists` (one per stage of `shape`) to the end or to a deadlock.
pub(super) fn run(
    shape: PipeShape,
    lists: &[Vec<Action>],
    forward_time: f64,
    backward_time: f64,
) -> Result<Timeline, SimError> {
    let times = (forward_time, backward_time);
    let mut stages: Vec<Stage> = lists.iter().map(|list| Stage::new(list)).collect();
    while (0..stages.len()).try_fold(false, |progress, s| {
        Ok::<_, SimError>(advance(shape, &mut stages, s, times)? || progress)
    })? {}
    if stages.iter().any(|stage| stage.next < stage.actions.len()) {
        return Err(stuck(shape, &stages));
    }
    for (s, stage) in stages.iter().enumerate() {
        for micro_batch in 0..shape.micro_batches {
            for chunk in 0..shape.chunks {
                let missing = if !stage.forwards.contains(&(micro_batch, chunk)) {
                    Action::Forward { micro_batch, chunk }
                } else if !stage.backwards.contains(&(micro_batch, chunk)) {
                    Action::Backward { micro_batch, chunk }
                } else {
                    continue;
                };
                return Err(SimError::MissingCompute {
                    stage: s,
                    action: missing,
                });
            }
        }
    }
    let makespan = stages.iter().map(|stage| stage.clock).fold(0.0, f64::max);
    let per_chunk = (shape.micro_batches * shape.chunks) as f64;
    Ok(Timeline {
        makespan,
        busy: stages.iter().map(|stage| stage.busy).collect(),
        peak_in_flight: stages.iter().map(|stage| stage.peak_in_flight).collect(),
        ideal: per_chunk * (forward_time + backward_time),
    })
}

/// Runs stage `s` as far as it can; whether anything happened.
fn advance(
    shape: PipeShape,
    stages: &mut [Stage],
    s: usize,
    times: (f64, f64),
) -> Result<bool, SimError> {
    let actions = stages[s].actions;
    let mut progress = false;
    while let Some(action) = actions.get(stages[s].next) {
        if let Action::Exchange(transfers) = action {
            if stages[s].open.is_none() {
                stages[s].post(shape, s, transfers)?;
                progress = true;
            }
            progress |= complete_transfers(shape, stages, s);
            if !stages[s].close(transfers) {
                return Ok(progress);
            }
        } else {
            stages[s].compute(shape, s, action, times)?;
        }
        stages[s].next += 1;
        progress = true;
    }
    Ok(progress)
}

/// Completes the transfers of stage `s`'s open exchange whose other end its
/// peer has posted; whether any did.
fn complete_transfers(shape: PipeShape, stages: &mut [Stage], s: usize) -> bool {
    let Some(open) = &stages[s].open else {
        return false;
    };
    let (posted_at, waiting) = (open.posted_at, open.waiting.clone());
    let mut completed = Vec::new();
    for transfer in waiting {
        let other = transfer.counterpart(shape, s).expect("checked when posted");
        let Some(peer) = stages[transfer.peer].open.as_mut() else {
            continue;
        };
        if let Some(i) = peer.waiting.iter().position(|t| *t == other) {
            peer.waiting.remove(i);
            let at = posted_at.max(peer.posted_at);
            peer.done_at = peer.done_at.max(at);
            completed.push((transfer, at));
        }
    }
    let open = stages[s].open.as_mut().expect("still open");
    for (transfer, at) in &completed {
        open.waiting.retain(|t| t != transfer);
        open.done_at = open.done_at.max(*at);
    }
    !completed.is_empty()
}

/// The error for stages that cannot go on: a transfer whose other end is
/// nowhere ahead in its peer's list, else the deadlock.
fn stuck(shape: PipeShape, stages: &[Stage]) -> SimError {
    let mut stuck = Vec::new();
    for (s, stage) in stages.iter().enumerate() {
        let Some(open) = &stage.open else {
            continue;
        };
        for transfer in &open.waiting {
            let other = transfer.counterpart(shape, s).expect("checked when posted");
            let peer = &stages[transfer.peer];
            let ahead = peer.actions[peer.next..]
                .iter()
                .any(|a| matches!(a, Action::Exchange(ts) if ts.contains(&other)));
            if !ahead {
                return SimError::Unmatched {
                    stage: s,
                    transfer: *transfer,
                };
            }
        }
        stuck.push(Stuck {
            stage: s,
            index: stage.next,
            waiting: open.waiting.clone(),
        });
    }
    SimError::Deadlock(stuck)
}

impl<'a> Stage<'a> {
    fn new(actions: &'a [Action]) -> Self {
        Stage {
            actions,
            next: 0,
            clock: 0.0,
            busy: 0.0,
            in_flight: 0,
            peak_in_flight: 0,
            forwards: HashSet::new(),
            backwards: HashSet::new(),
            received: HashSet::new(),
            posted: HashSet::new(),
            open: None,
        }
    }

    /// Runs a forward or backward, after checking that it can.
    fn compute(
        &mut self,
        shape: PipeShape,
        s: usize,
        action: &Action,
        (forward_time, backward_time): (f64, f64),
    ) -> Result<(), SimError> {
        let (forward, micro_batch, chunk) = match *action {
            Action::Forward { micro_batch, chunk } => (true, micro_batch, chunk),
            Action::Backward { micro_batch, chunk } => (false, micro_batch, chunk),
            Action::Exchange(_) => unreachable!("exchanges are posted, not computed"),
        };
        if micro_batch >= shape.micro_batches || chunk >= shape.chunks {
            return Err(SimError::OutOfRange {
                stage: s,
                action: action.clone(),
            });
        }
        let here = shape.virtual_stage(s, chunk);
        let p = shape.stages;
        // Whether the neighbouring virtual stage `there` handed over what this
        // compute needs: on this stage by computing it, else by a receive.
        let came = |there: usize, payload: Payload| {
            if there % p == s {
                let done = if forward {
                    &self.forwards
                } else {
                    &self.backwards
                };
                done.contains(&(micro_batch, there / p))
            } else {
                self.received.contains(&(payload, micro_batch, chunk))
            }
        };
        if forward {
            if here > 0 && !came(here - 1, Payload::Activation) {
                return Err(SimError::InputMissing {
                    stage: s,
                    micro_batch,
                    chunk,
                });
            }
        } else {
            if !self.forwards.contains(&(micro_batch, chunk)) {
                return Err(SimError::BackwardBeforeForward {
                    stage: s,
                    micro_batch,
                    chunk,
                });
            }
            if here + 1 < shape.virtual_stages() && !came(here + 1, Payload::Gradient) {
                return Err(SimError::GradientMissing {
                    stage: s,
                    micro_batch,
                    chunk,
                });
            }
        }
        let (done, time) = if forward {
            (&mut self.forwards, forward_time)
        } else {
            (&mut self.backwards, backward_time)
        };
        if !done.insert((micro_batch, chunk)) {
            return Err(SimError::RepeatedCompute {
                stage: s,
                action: action.clone(),
            });
        }
        if forward {
            self.in_flight += 1;
            self.peak_in_flight = self.peak_in_flight.max(self.in_flight);
        } else {
            self.in_flight -= 1;
        }
        self.clock += time;
        self.busy += time;
        Ok(())
    }

    /// Posts an exchange, after checking each transfer.
    fn post(&mut self, shape: PipeShape, s: usize, transfers: &[Transfer]) -> Result<(), SimError> {
        for &transfer in transfers {
            let in_range = transfer.micro_batch < shape.micro_batches
                && transfer.chunk < shape.chunks
                && transfer.peer < shape.stages
                && transfer.peer != s;
            if !in_range || transfer.counterpart(shape, s).is_none() {
                return Err(SimError::BadTransfer { stage: s, transfer });
            }
            let key = (transfer.micro_batch, transfer.chunk);
            let produced = match transfer.payload {
                Payload::Activation => self.forwards.contains(&key),
                Payload::Gradient => self.backwards.contains(&key),
            };
            if transfer.send && !produced {
                return Err(SimError::SendBeforeCompute { stage: s, transfer });
            }
            if !self.posted.insert(transfer) {
                return Err(SimError::RepeatedTransfer { stage: s, transfer });
            }
        }
        let waiting = transfers.to_vec();
        self.open = Some(Open {
            posted_at: self.clock,
            waiting,
            done_at: self.clock,
        });
        Ok(())
    }

    /// Closes the open exchange (of `transfers`) if all its transfers have
    /// completed: the clock moves to the last completion and the receives
    /// become usable. Whether it closed.
    fn close(&mut self, transfers: &[Transfer]) -> bool {
        match &self.open {
            Some(open) if open.waiting.is_empty() => {
                self.clock = open.done_at;
                self.received.extend(
                    transfers
                        .iter()
                        .filter(|t| !t.send)
                        .map(|t| (t.payload, t.micro_batch, t.chunk)),
                );
                self.open = None;
                true
            }
            _ => false,
        }
    }
}
