//! Waiting for a nonblocking operation under the timeout, and finding out
//! who is missing when it runs out (design in the parent module's doc).

use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use ::mpi::point_to_point::Status;
use ::mpi::request::Request;
use ::mpi::traits::{Communicator as _, Destination, Source};

use super::op::{Op, Position};
use super::{report, MpiCommunicator};
use crate::comm::{CommError, Communicator};

/// Tag of timeout notices, on the communicator reserved for them.
const NOTICE_TAG: i32 = 1;
/// Notice kind: "I timed out here; where are you?" (answered).
const ANNOUNCE: u64 = 0;
/// Notice kind: "I am here" (not answered).
const REPLY: u64 = 1;
/// A waiting rank re-tests without sleeping (yielding the core) this long...
const SPIN: Duration = Duration::from_millis(1);
/// ...then sleeps this long between tests.
const NAP: Duration = Duration::from_micros(200);

/// The ranks an operation waits for.
#[derive(Clone, Copy, Debug)]
pub(super) enum Peers {
    /// Every other rank (a collective).
    All,
    /// One rank (a send or receive).
    One(usize),
}

/// How long a rank that timed out collects the answers of the others:
/// a tenth of the timeout, at least 100 ms and at most 2 s.
pub(super) fn grace(timeout: Duration) -> Duration {
    (timeout / 10).clamp(Duration::from_millis(100), Duration::from_secs(2))
}

impl MpiCommunicator {
    /// Numbers the next `op` of this rank (the first is #1); fails if an
    /// earlier operation timed out.
    pub(super) fn start(&self, op: Op) -> Result<Position, CommError> {
        if self.has_failed() {
            return Err(CommError::Transport(format!(
                "{}: an earlier operation timed out, so this communicator can no longer be used (abort the job)",
                op.name()
            )));
        }
        let n = self.counts[op.code() as usize].fetch_add(1, Ordering::Relaxed) + 1;
        Ok((op, n))
    }

    /// Tests `req` until it completes or the timeout passes.
    ///
    /// On timeout the request is abandoned (its buffers must be [`Lent`]s,
    /// which then leak), the communicator is marked failed, and the error
    /// names the ranks of `peers` that never arrived.
    ///
    /// [`Lent`]: super::lent::Lent
    pub(super) fn finish<D: ?Sized>(
        &self,
        mut req: Request<'static, D>,
        at: Position,
        peers: Peers,
    ) -> Result<Status, CommError> {
        let started = Instant::now();
        let mut heard = Vec::new();
        loop {
            req = match req.test() {
                Ok(status) => return Ok(status),
                Err(pending) => pending,
            };
            let waited = started.elapsed();
            if waited < SPIN {
                thread::yield_now();
                continue;
            }
            self.answer_notices(at, &mut heard);
            if waited >= self.timeout {
                // MPI may still use the buffers: never complete, never free.
                std::mem::forget(req);
                self.failed.store(true, Ordering::Relaxed);
                return Err(self.diagnose(at, peers, heard));
            }
            thread::sleep(NAP);
        }
    }

    /// After a timeout at `at`: asks `peers` where they are, collects the
    /// answers for the grace period, and builds the error.
    fn diagnose(&self, at: Position, peers: Peers, mut heard: Vec<Option<Position>>) -> CommError {
        let me = self.rank();
        let peers: Vec<usize> = match peers {
            Peers::All => (0..self.world_size()).filter(|&r| r != me).collect(),
            Peers::One(r) => vec![r],
        };
        for &p in &peers {
            self.notify(p, ANNOUNCE, at);
        }
        let until = Instant::now() + grace(self.timeout);
        let all_heard = |heard: &[Option<Position>]| {
            peers
                .iter()
                .all(|&p| heard.get(p).is_some_and(Option::is_some))
        };
        while Instant::now() < until && !all_heard(&heard) {
            self.answer_notices(at, &mut heard);
            thread::sleep(NAP);
        }
        heard.resize(self.world_size(), None);
        let (lost, detail) = report::describe(me, at, &peers, &heard, &self.world_ranks);
        CommError::Timeout {
            op: at.0.name(),
            seq: at.1,
            timeout: self.timeout,
            lost,
            detail,
        }
    }

    /// Receives every waiting notice: records where its sender is in
    /// `heard` (grown to one entry per rank on first use) and answers
    /// announcements with this rank's position `at`.
    fn answer_notices(&self, at: Position, heard: &mut Vec<Option<Position>>) {
        while let Some((message, status)) = self
            .notices
            .any_process()
            .immediate_matched_probe_with_tag(NOTICE_TAG)
        {
            let mut notice = [0u64; 3];
            message.matched_receive_into(&mut notice[..]);
            let from = status.source_rank() as usize;
            if heard.is_empty() {
                heard.resize(self.world_size(), None);
            }
            if let Some(op) = Op::from_code(notice[1]) {
                heard[from] = Some((op, notice[2]));
            }
            if notice[0] == ANNOUNCE {
                self.notify(from, REPLY, at);
            }
        }
    }

    /// Sends a notice (24 bytes, which MPI sends eagerly: the call does not
    /// wait for `to` to receive it).
    fn notify(&self, to: usize, kind: u64, at: Position) {
        let notice = [kind, at.0.code(), at.1];
        self.notices
            .process_at_rank(to as i32)
            .send_with_tag(&notice[..], NOTICE_TAG);
    }
}
