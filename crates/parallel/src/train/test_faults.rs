//! Faults injected on purpose, for the tests of what the other ranks do
//! when one rank fails (test-only hooks, not a user feature). Read from
//! the environment in this one place, at the start of every step:
//!
//! - `FERROTRON_TEST_PANIC_AT_STEP=RANK:STEP`: world rank `RANK` panics at
//!   the start of step `STEP`.
//! - `FERROTRON_TEST_STALL_AT_STEP=RANK:STEP:SECONDS`: world rank `RANK`
//!   sleeps `SECONDS` at the start of step `STEP` (a rank stuck between
//!   two collectives of the step).
//! - `FERROTRON_TEST_COMM_BYTES_PER_S=RATE`: the gradient synchronisation's
//!   DP communicator is slowed to `RATE` bytes per second
//!   ([`Latency`](crate::comm::Latency)), read once when the trainer is
//!   built (the overlap tests and benchmark).
//!
//! A value that does not parse is ignored (the run goes on unharmed).

use std::sync::Arc;
use std::time::Duration;

use crate::comm::{Communicator, Latency};

/// Panics or sleeps if a hook names this `rank` at this `step`.
pub(super) fn at_step(rank: usize, step: usize) {
    if let Some([r, s]) = read::<2>("FERROTRON_TEST_PANIC_AT_STEP") {
        if (r, s) == (rank as u64, step as u64) {
            panic!("FERROTRON_TEST_PANIC_AT_STEP: rank {rank} panics at step {step}");
        }
    }
    if let Some([r, s, seconds]) = read::<3>("FERROTRON_TEST_STALL_AT_STEP") {
        if (r, s) == (rank as u64, step as u64) {
            std::thread::sleep(Duration::from_secs(seconds));
        }
    }
}

/// `comm`, slowed by [`Latency`] when `FERROTRON_TEST_COMM_BYTES_PER_S`
/// is set to a positive rate.
pub(super) fn slowed(comm: Arc<dyn Communicator>) -> Arc<dyn Communicator> {
    match read::<1>("FERROTRON_TEST_COMM_BYTES_PER_S") {
        Some([rate]) if rate > 0 => Arc::new(Latency::new(comm, rate as f64)),
        _ => comm,
    }
}

/// The variable `name` as `N` numbers separated by colons, if it is set
/// and has that form.
fn read<const N: usize>(name: &str) -> Option<[u64; N]> {
    parse(&std::env::var(name).ok()?)
}

fn parse<const N: usize>(value: &str) -> Option<[u64; N]> {
    let numbers: Vec<u64> = value
        .split(':')
        .map(|p| p.trim().parse().ok())
        .collect::<Option<_>>()?;
    numbers.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_values_parse_only_in_their_exact_form() {
        assert_eq!(parse::<2>("1:3"), Some([1, 3]));
        assert_eq!(parse::<3>("0:2:30"), Some([0, 2, 30]));
        assert_eq!(parse::<2>("1:3:5"), None);
        assert_eq!(parse::<3>("1:3"), None);
        assert_eq!(parse::<2>("one:3"), None);
        assert_eq!(parse::<2>(""), None);
    }
}
