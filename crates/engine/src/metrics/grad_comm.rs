//! How much of a step's gradient-synchronisation communication the
//! compute thread waited for.

use serde::{Deserialize, Serialize};

/// The communication of one step's gradient synchronisation over the DP
/// group (the all-reduces, reduce-scatters and all-gathers run on the
/// communication thread), as the compute thread saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GradCommTimes {
    /// Time the communication thread spent in collectives, seconds.
    pub comm_s: f64,
    /// Time the compute thread spent waiting for them, seconds.
    pub wait_s: f64,
    /// Fraction of the communication time hidden behind compute:
    /// `1 - wait_s / comm_s`, clamped to `[0, 1]` (0 without communication).
    pub hidden: f64,
    /// Collectives run.
    pub ops: u64,
    /// Most collectives started and not yet waited for at one time: 1 when
    /// every collective is waited for as soon as it starts (no overlap),
    /// more when the compute thread went on while several were in flight.
    pub max_in_flight: u64,
}

impl GradCommTimes {
    /// The record of `ops` collectives that took `comm_s` on the
    /// communication thread while the compute thread waited `wait_s`, at
    /// most `max_in_flight` of them outstanding at once.
    pub fn new(comm_s: f64, wait_s: f64, ops: u64, max_in_flight: u64) -> Self {
        let hidden = if comm_s > 0.0 {
            (1.0 - wait_s / comm_s).clamp(0.0, 1.0)
        } else {
            0.0
        };
        Self {
            comm_s,
            wait_s,
            hidden,
            ops,
            max_in_flight,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_fraction_is_the_share_not_waited_for() {
        assert_eq!(GradCommTimes::new(2.0, 0.5, 3, 2).hidden, 0.75);
        assert_eq!(GradCommTimes::new(2.0, 2.5, 3, 1).hidden, 0.0);
        assert_eq!(GradCommTimes::new(0.0, 0.0, 0, 0).hidden, 0.0);
    }
}
