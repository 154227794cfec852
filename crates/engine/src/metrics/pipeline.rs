//! Where the time of a pipeline-parallel step went, stage by stage, and
//! the bubble it measured next to the schedule's formula.

use serde::{Deserialize, Serialize};

/// Times of one step's pipeline schedule (its forwards, backwards and
/// transfers; not the optimizer update), seconds, one entry per stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PipelineTimes {
    /// Per stage: time in its forward and backward actions (the loss on
    /// the last stage included), seconds.
    pub compute_s: Vec<f64>,
    /// Per stage: time in its exchanges (posting sends and waiting for
    /// receives), seconds.
    pub wait_s: Vec<f64>,
    /// Wall time of the schedule: the longest stage's, seconds.
    pub schedule_s: f64,
    /// Measured bubble: `(schedule_s - c) / c` with `c` the largest stage
    /// compute time, i.e. the time the busiest stage lost to the pipeline
    /// as a fraction of its compute (the definition of the formula).
    pub bubble: f64,
    /// The schedule's bubble for equal stages and free transfers:
    /// `(p - 1) / (v m)` (Narayanan et al. 2021; `v` = 1 except for
    /// interleaved 1F1B).
    pub bubble_formula: f64,
}

impl PipelineTimes {
    /// The record of a step from each stage's `compute_s`, `wait_s` and
    /// `total_s` (its schedule's wall time), on a pipeline of `chunks`
    /// model chunks per stage running `micro_batches` micro-batches.
    ///
    /// # Panics
    /// If the three lists differ in length or are empty, or if
    /// `micro_batches` or `chunks` is zero.
    pub fn new(
        compute_s: Vec<f64>,
        wait_s: Vec<f64>,
        total_s: &[f64],
        micro_batches: usize,
        chunks: usize,
    ) -> Self {
        let p = compute_s.len();
        assert!(p > 0 && wait_s.len() == p && total_s.len() == p);
        assert!(micro_batches > 0 && chunks > 0);
        let busiest = compute_s.iter().copied().fold(0.0, f64::max);
        let schedule_s = total_s.iter().copied().fold(0.0, f64::max);
        let bubble = if busiest > 0.0 {
            (schedule_s - busiest) / busiest
        } else {
            0.0
        };
        Self {
            compute_s,
            wait_s,
            schedule_s,
            bubble,
            bubble_formula: (p - 1) as f64 / (chunks * micro_batches) as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bubble_is_the_busiest_stages_lost_time_over_its_compute() {
        let t = PipelineTimes::new(vec![2.0, 3.0], vec![1.5, 0.5], &[3.9, 4.0], 4, 1);
        assert_eq!(t.schedule_s, 4.0);
        assert!((t.bubble - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(t.bubble_formula, 0.25);
        let interleaved = PipelineTimes::new(vec![1.0; 4], vec![0.0; 4], &[1.0; 4], 8, 2);
        assert_eq!(interleaved.bubble, 0.0);
        assert_eq!(interleaved.bubble_formula, 3.0 / 16.0);
    }
}
