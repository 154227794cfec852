//! ZeRO-3's gathers started ahead of their acquire (`--zero3-prefetch N`).
//!
//! The schedule acquires units in a known order and, after each acquire,
//! names the units that follow ([`crate::grad_sync::GradSync::prefetch`]).
//! [`Ahead`] keeps the gathers in flight for the first `depth` of them, in
//! that order: each acquire takes the oldest, and the next prefetch starts
//! the one that has come within reach. So at most `depth` gathers are in
//! flight besides the unit in use: `depth + 1` units' parameters gathered
//! at once (the embedding and head, held for the whole step, apart).

use std::collections::VecDeque;

/// Handles `T` of gathers started ahead, by unit, in the order the units
/// will be acquired.
pub(super) struct Ahead<T> {
    /// Gathers kept in flight (0: none).
    depth: usize,
    queue: VecDeque<(usize, T)>,
}

impl<T> Ahead<T> {
    /// Nothing started; `depth` gathers kept in flight ahead.
    pub(super) fn new(depth: usize) -> Self {
        Self {
            depth,
            queue: VecDeque::new(),
        }
    }

    /// Keeps `depth` gathers in flight from now on (between steps).
    pub(super) fn set_depth(&mut self, depth: usize) {
        self.depth = depth;
    }

    /// The gather started for unit `u`, if `u` is the next one started
    /// ahead (a schedule acquires the units in the order it named them).
    pub(super) fn take(&mut self, u: usize) -> Option<T> {
        match self.queue.front() {
            Some(&(first, _)) if first == u => self.queue.pop_front().map(|(_, t)| t),
            _ => None,
        }
    }

    /// Starts (with `start`) the gathers of the first `depth` units of
    /// `next` that are not in flight yet: those in flight are the first
    /// of `next`, in order, as the schedule named them before.
    pub(super) fn fill(&mut self, next: &[usize], mut start: impl FnMut(usize) -> T) {
        debug_assert!(
            self.queue.iter().zip(next).all(|((u, _), n)| u == n),
            "gathers in flight for units the schedule no longer names next"
        );
        let want = next.len().min(self.depth);
        for &u in next.iter().take(want).skip(self.queue.len()) {
            self.queue.push_back((u, start(u)));
        }
    }

    /// Every gather in flight, oldest first, leaving none.
    pub(super) fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.queue.drain(..).map(|(_, t)| t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The acquires of one micro-batch of 3 blocks (forward 0, 1, 2, then
    /// backward 2, 1, 0), each followed by a prefetch of what follows;
    /// returns, per acquire, whether its gather was prefetched, and the
    /// most gathers in flight at once (besides the unit in use).
    fn run(depth: usize) -> (Vec<bool>, usize, Vec<usize>) {
        let order = [0, 1, 2, 2, 1, 0];
        let mut ahead = Ahead::new(depth);
        let (mut hits, mut most, mut started) = (Vec::new(), 0, Vec::new());
        for (k, &u) in order.iter().enumerate() {
            hits.push(ahead.take(u).is_some());
            ahead.fill(&order[k + 1..], |u| {
                started.push(u);
                u
            });
            most = most.max(ahead.queue.len());
        }
        assert_eq!(ahead.drain().count(), 0, "nothing is left after the last");
        (hits, most, started)
    }

    #[test]
    fn depth_0_prefetches_nothing() {
        assert_eq!(run(0), (vec![false; 6], 0, vec![]));
    }

    #[test]
    fn depth_1_gathers_every_later_unit_one_acquire_ahead() {
        let (hits, most, started) = run(1);
        assert_eq!(hits, [false, true, true, true, true, true]);
        assert_eq!(most, 1);
        assert_eq!(started, [1, 2, 2, 1, 0]);
    }

    #[test]
    fn depth_2_keeps_two_in_flight_and_starts_each_gather_once() {
        let (hits, most, started) = run(2);
        assert_eq!(hits, [false, true, true, true, true, true]);
        assert_eq!(most, 2);
        // In acquire order, each once: the first acquire starts two.
        assert_eq!(started, [1, 2, 2, 1, 0]);
    }

    #[test]
    fn a_depth_beyond_the_units_left_gathers_all_of_them() {
        let (_, most, started) = run(10);
        assert_eq!(most, 5);
        assert_eq!(started, [1, 2, 2, 1, 0]);
    }

    #[test]
    fn an_acquire_out_of_order_takes_nothing() {
        let mut ahead = Ahead::new(1);
        ahead.fill(&[3], |u| u);
        assert_eq!(ahead.take(4), None);
        assert_eq!(ahead.take(3), Some(3));
    }
}
