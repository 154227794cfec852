//! A rank's place in a group, without the group: enough to build that
//! rank's part of a model in one process (building never communicates);
//! every collective is an error.

use std::sync::Arc;

use ferrotron_parallel::comm::{CommError, Communicator, Incoming, Outgoing};

/// Rank `rank` of a group of `size` that cannot communicate.
pub struct RankOf {
    pub rank: usize,
    pub size: usize,
}

impl RankOf {
    fn refuse(&self) -> CommError {
        CommError::Transport(format!(
            "rank {} of {}: this test group does not communicate",
            self.rank, self.size
        ))
    }
}

impl Communicator for RankOf {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.size
    }
    fn split(&self, _: usize, _: usize) -> Result<Arc<dyn Communicator>, CommError> {
        Err(self.refuse())
    }
    fn all_reduce_sum(&self, _: &mut [f32]) -> Result<(), CommError> {
        Err(self.refuse())
    }
    fn all_gather(&self, _: &[f32], _: &mut [f32]) -> Result<(), CommError> {
        Err(self.refuse())
    }
    fn reduce_scatter_sum(&self, _: &[f32], _: &mut [f32]) -> Result<(), CommError> {
        Err(self.refuse())
    }
    fn broadcast(&self, _: &mut [f32], _: usize) -> Result<(), CommError> {
        Err(self.refuse())
    }
    fn send(&self, _: &[f32], _: usize, _: i32) -> Result<(), CommError> {
        Err(self.refuse())
    }
    fn recv(&self, _: &mut [f32], _: usize, _: i32) -> Result<(), CommError> {
        Err(self.refuse())
    }
    fn exchange(&self, _: &[Outgoing<'_>], _: &mut [Incoming<'_>]) -> Result<(), CommError> {
        Err(self.refuse())
    }
    fn barrier(&self) -> Result<(), CommError> {
        Err(self.refuse())
    }
    fn abort(&self, code: i32) -> ! {
        panic!("rank {} of {} aborted with {code}", self.rank, self.size)
    }
}
