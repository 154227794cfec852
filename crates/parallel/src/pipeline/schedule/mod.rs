//! Pipeline schedules as pure data.
//!
//! Terms (Megatron-LM's): `p` stages (the PP group's ranks), `m`
//! micro-batches per optimizer step, `v` model chunks per stage (virtual
//! stages; 1 except for the interleaved schedule). Virtual stage
//! `c * p + s` is chunk `c` of stage `s`; the embedding sits on virtual
//! stage 0 and the head and loss on virtual stage `v * p - 1`. A forward of
//! micro-batch `mb` on a virtual stage needs the activation of the virtual
//! stage before it, a backward the gradient of the one after it.
//!
//! [`stage_actions`] gives one stage's list for one optimizer step: the
//! compute order of the schedule (files `gpipe.rs`, `one_f_one_b.rs`,
//! `interleaved.rs`) with the transfers derived from it (`transfers.rs`):
//!
//! - a send sits in the first [`Action::Exchange`] after the compute that
//!   produced it, a receive in an `Exchange` before the compute that
//!   consumes it;
//! - sends are taken to block until the receiver has posted the receive
//!   (MPI's rendezvous protocol for large messages), so the grouping is what
//!   makes a schedule deadlock-free; [`super::simulate()`] runs the lists of
//!   every stage together and is the proof, in the unit tests, for every
//!   shape they cover;
//! - a transfer is named the same way on both ends by its payload, its
//!   micro-batch and the virtual stage that receives it
//!   ([`Transfer::counterpart`] turns one end into the other), which an
//!   executor can use as a message tag: one `Exchange` may hold several
//!   transfers with the same peer;
//! - with one stage (`p = 1`) there is no `Exchange` at all: chunk `c > 0`
//!   takes chunk `c - 1`'s output, and gives chunk `c - 1` its input
//!   gradient, on the same stage.

mod gpipe;
mod interleaved;
mod one_f_one_b;
mod transfers;

/// Which schedule runs the micro-batches of a step (`--pp-schedule`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleKind {
    /// Every forward, then every backward (Huang et al. 2019).
    GPipe,
    /// One forward, one backward (PipeDream-Flush, Narayanan et al. 2021):
    /// at most `p - s` micro-batches in flight on stage `s`.
    OneFOneB,
    /// 1F1B over `v` model chunks per stage (Narayanan et al. 2021, §2.2):
    /// the bubble shrinks by `v`.
    Interleaved,
}

/// The size of a pipeline step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PipeShape {
    /// Pipeline stages `p` (ranks of the PP group), at least 1.
    pub stages: usize,
    /// Micro-batches `m` of one optimizer step, at least 1.
    pub micro_batches: usize,
    /// Model chunks `v` per stage: 1 for GPipe and 1F1B, `--pp-virtual`
    /// for the interleaved schedule.
    pub chunks: usize,
}

/// What crosses between two stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Payload {
    /// A virtual stage's output hidden states `[batch, seq, hidden]`,
    /// forward (to the next virtual stage).
    Activation,
    /// The loss gradient of a virtual stage's input, backward (to the
    /// previous virtual stage), of the same shape.
    Gradient,
}

/// One point-to-point transfer, seen from one of its two ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Transfer {
    /// `true` on the sending end, `false` on the receiving end.
    pub send: bool,
    /// What is transferred.
    pub payload: Payload,
    /// The micro-batch it belongs to, `0..m`.
    pub micro_batch: usize,
    /// The chunk of this stage that produced (send) or will consume
    /// (receive) it, `0..v`.
    pub chunk: usize,
    /// The stage at the other end, `0..p`.
    pub peer: usize,
}

/// One thing a stage does, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Forward of `micro_batch` through chunk `chunk` of this stage (its
    /// input was received by an earlier [`Action::Exchange`], or is the
    /// token ids on virtual stage 0).
    Forward {
        /// `0..m`.
        micro_batch: usize,
        /// `0..v`.
        chunk: usize,
    },
    /// Backward of `micro_batch` through chunk `chunk` (its output's
    /// gradient was received earlier, or is the loss on the last virtual
    /// stage).
    Backward {
        /// `0..m`.
        micro_batch: usize,
        /// `0..v`.
        chunk: usize,
    },
    /// Transfers posted together and all complete before the next action
    /// (one `MPI_Sendrecv`-like exchange, or one NCCL group): a send and a
    /// receive posted together cannot deadlock against a peer doing the same.
    Exchange(Vec<Transfer>),
}

/// A pipeline that a schedule cannot run.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// Stages, micro-batches or chunks of zero.
    #[error("the pipeline needs at least one stage, micro-batch and chunk, got {0:?}")]
    Empty(PipeShape),
    /// `v > 1` for a schedule other than interleaved, or `v < 2` for it.
    #[error("{kind:?} runs {want} chunk(s) per stage, got --pp-virtual {chunks}")]
    Chunks {
        /// The schedule.
        kind: ScheduleKind,
        /// Chunks asked for.
        chunks: usize,
        /// What it runs, in words ("1", "at least 2").
        want: &'static str,
    },
    /// The interleaved schedule needs `m` to be a multiple of `p` (as Megatron-LM).
    #[error("the interleaved schedule needs the micro-batches ({micro_batches}) to be a multiple of --pp {stages}")]
    Interleave {
        /// `m`.
        micro_batches: usize,
        /// `p`.
        stages: usize,
    },
}

impl PipeShape {
    /// Virtual stages `v * p`: chunk `c` of stage `s` is virtual stage
    /// `c * p + s`.
    pub fn virtual_stages(&self) -> usize {
        self.chunks * self.stages
    }

    /// The virtual stage of chunk `chunk` on stage `stage`: `chunk * p + stage`.
    pub fn virtual_stage(&self, stage: usize, chunk: usize) -> usize {
        chunk * self.stages + stage
    }

    /// Whether `kind` can run this shape (the errors of [`stage_actions`]).
    pub fn check(&self, kind: ScheduleKind) -> Result<(), ScheduleError> {
        if self.stages == 0 || self.micro_batches == 0 || self.chunks == 0 {
            return Err(ScheduleError::Empty(*self));
        }
        let (fits, want) = match kind {
            ScheduleKind::GPipe | ScheduleKind::OneFOneB => (self.chunks == 1, "1"),
            ScheduleKind::Interleaved => (self.chunks >= 2, "at least 2"),
        };
        if !fits {
            return Err(ScheduleError::Chunks {
                kind,
                chunks: self.chunks,
                want,
            });
        }
        if kind == ScheduleKind::Interleaved && !self.micro_batches.is_multiple_of(self.stages) {
            return Err(ScheduleError::Interleave {
                micro_batches: self.micro_batches,
                stages: self.stages,
            });
        }
        Ok(())
    }
}

impl Transfer {
    /// The other end of this transfer, seen from `peer`, when this end sits
    /// on stage `stage` of `shape`; `None` when no such transfer exists
    /// (an activation sent from the last virtual stage or received on the
    /// first, a gradient the other way round, or a `peer` that does not hold
    /// the neighbouring virtual stage).
    pub fn counterpart(&self, shape: PipeShape, stage: usize) -> Option<Transfer> {
        let here = shape.virtual_stage(stage, self.chunk);
        let there = other_end(shape, here, self.send, self.payload)?;
        if there % shape.stages != self.peer {
            return None;
        }
        Some(Transfer {
            send: !self.send,
            chunk: there / shape.stages,
            peer: stage,
            ..*self
        })
    }
}

/// The virtual stage at the other end of a transfer of `payload` whose end
/// on virtual stage `here` sends (`send`) or receives: activations flow to
/// the next virtual stage, gradients to the previous one; `None` past either
/// end of the pipeline.
fn other_end(shape: PipeShape, here: usize, send: bool, payload: Payload) -> Option<usize> {
    let downstream = send == (payload == Payload::Activation);
    let there = if downstream {
        here + 1
    } else {
        here.checked_sub(1)?
    };
    (there < shape.virtual_stages()).then_some(there)
}

/// The ordered actions of stage `stage` (`0..p`) for one optimizer step of
/// `kind` on `shape`: every forward and backward of each (micro-batch,
/// chunk) once, with the [`Action::Exchange`]s that feed them.
///
/// Panics if `stage >= p` (a programming error, not bad input).
pub fn stage_actions(
    kind: ScheduleKind,
    shape: PipeShape,
    stage: usize,
) -> Result<Vec<Action>, ScheduleError> {
    shape.check(kind)?;
    assert!(
        stage < shape.stages,
        "stage {stage} of a {}-stage pipeline",
        shape.stages
    );
    Ok(match kind {
        ScheduleKind::GPipe => transfers::just_in_time(shape, stage, &gpipe::order(shape)),
        ScheduleKind::OneFOneB => {
            transfers::just_in_time(shape, stage, &one_f_one_b::order(shape, stage))
        }
        ScheduleKind::Interleaved => {
            transfers::lockstep(shape, stage, |s| interleaved::iterations(shape, s))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_a_schedule_cannot_run_are_refused() {
        let shape = |stages, micro_batches, chunks| PipeShape {
            stages,
            micro_batches,
            chunks,
        };
        for empty in [shape(0, 4, 1), shape(2, 0, 1), shape(2, 4, 0)] {
            let got = stage_actions(ScheduleKind::OneFOneB, empty, 0);
            assert_eq!(got, Err(ScheduleError::Empty(empty)));
        }
        let got = stage_actions(ScheduleKind::GPipe, shape(2, 4, 2), 0);
        let want = ScheduleError::Chunks {
            kind: ScheduleKind::GPipe,
            chunks: 2,
            want: "1",
        };
        assert_eq!(got, Err(want));
        let got = stage_actions(ScheduleKind::Interleaved, shape(2, 4, 1), 0);
        let want = ScheduleError::Chunks {
            kind: ScheduleKind::Interleaved,
            chunks: 1,
            want: "at least 2",
        };
        assert_eq!(got, Err(want));
        let got = stage_actions(ScheduleKind::Interleaved, shape(4, 6, 2), 0);
        assert_eq!(
            got,
            Err(ScheduleError::Interleave {
                micro_batches: 6,
                stages: 4
            })
        );
        assert_eq!(
            got.unwrap_err().to_string(),
            "the interleaved schedule needs the micro-batches (6) to be a multiple of --pp 4"
        );
    }

    #[test]
    fn counterpart_names_the_same_transfer_from_the_other_end() {
        let shape = PipeShape {
            stages: 2,
            micro_batches: 4,
            chunks: 2,
        };
        // Chunk 0 of stage 1 (virtual stage 1) feeds chunk 1 of stage 0
        // (virtual stage 2).
        let send = Transfer {
            send: true,
            payload: Payload::Activation,
            micro_batch: 3,
            chunk: 0,
            peer: 0,
        };
        let recv = Transfer {
            send: false,
            chunk: 1,
            peer: 1,
            ..send
        };
        assert_eq!(send.counterpart(shape, 1), Some(recv));
        assert_eq!(recv.counterpart(shape, 0), Some(send));
        // Its gradient goes back the same way.
        let back = Transfer {
            send: true,
            payload: Payload::Gradient,
            ..recv
        };
        let back_recv = Transfer {
            send: false,
            payload: Payload::Gradient,
            ..send
        };
        assert_eq!(back.counterpart(shape, 0), Some(back_recv));
        // A peer that does not hold the neighbouring virtual stage.
        assert_eq!(Transfer { peer: 1, ..send }.counterpart(shape, 1), None);
        // Nothing leaves the loss's virtual stage forward, or the first backward.
        let loss = Transfer {
            chunk: 1,
            peer: 0,
            ..send
        };
        assert_eq!(loss.counterpart(shape, 1), None);
        let first = Transfer {
            send: true,
            payload: Payload::Gradient,
            micro_batch: 0,
            chunk: 0,
            peer: 1,
        };
        assert_eq!(first.counterpart(shape, 0), None);
    }
}
