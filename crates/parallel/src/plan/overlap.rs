//! The exposed part of the data-parallel communication when the trainer
//! overlaps it with compute (`--overlap-grad-reduce`, honoured where the
//! DP group is the only group of more than one rank: `tp = pp = 1`).
//!
//! The trainer runs the step's DP collectives on one communication
//! thread, one at a time in the order they were started, while the
//! compute thread goes on; the compute thread waits only for a gather it
//! is about to use and, once per step, for everything (the settle before
//! the clipping norm). [`exposed`] replays that schedule on two clocks,
//! the compute thread's and the communication thread's, from the times
//! of its parts; what the compute thread waits is the exposed part. The
//! schedule is the trainer's ([`crate::micro_batch`], [`crate::zero`],
//! [`crate::ddp`]), per micro-batch:
//!
//! - The unit-by-unit backward (full recomputation, always under ZeRO-3):
//!   the forward runs the `L` blocks, then the head's forward and
//!   backward, then each block in reverse is recomputed and
//!   back-propagated and its gradients' reduction started at once (ZeRO-2
//!   and 3: a reduce-scatter in every micro-batch; DDP and ZeRO-1: an
//!   all-reduce in the step's last micro-batch only, the earlier ones
//!   accumulating locally); the embedding's and head's reduction starts
//!   after the last block. So every block's reduction but the last one's
//!   hides behind the backward of the blocks after it (and under ZeRO-2
//!   and 3 behind the next micro-batch), the last stays exposed.
//! - ZeRO-3 acquires the `2L` blocks in order (forward `0..L`, backward
//!   `L-1` down to 0) and, after each acquire, starts the gathers of the
//!   next `N` (`--zero3-prefetch`), so a block's gather hides behind the
//!   compute of the `N` blocks before it, but queues behind the
//!   reductions started before it; with `N = 0` every gather is waited
//!   for when its block is acquired. The embedding's and head's gathers
//!   are waited for at the start of the micro-batch (the trainer holds
//!   them for the whole step; the time model counts them per micro-batch
//!   and pass, as without overlap).
//! - A whole-graph backward gives all gradients at once: the reductions
//!   start after it, so they hide only behind the following micro-batches
//!   (ZeRO-2), and DDP's and ZeRO-1's, started after the last, not at all.
//! - After the settle, ZeRO-1's and 2's all-gather of the updated
//!   parameters runs with nothing beside it: exposed.
//!
//! Each collective's time is its share (by bytes) of the collective the
//! time model prices over the whole stage, so the parts add up to the
//! same total as without overlap; only the exposed part is new. Megatron
//! prices nothing here; its `--overlap-grad-reduce` and
//! `--overlap-param-gather` run the same way on a separate CUDA stream
//! (bucket by bucket rather than block by block).

use crate::zero::ZeroStage;

/// The times of one step's parts, seconds, as the trainer runs it with
/// overlap on one DP group.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OverlapInput {
    /// What is sharded over the DP group.
    pub zero: ZeroStage,
    /// Blocks of the model, `L`.
    pub blocks: usize,
    /// Micro-batches per DP rank in the step.
    pub micro_batches: usize,
    /// Whether backward runs unit by unit (full recomputation; ZeRO-3).
    pub unit_by_unit: bool,
    /// ZeRO-3: blocks whose gathers start ahead (`--zero3-prefetch`).
    pub prefetch: usize,
    /// One block's forward.
    pub block_forward_s: f64,
    /// One block's backward, its recomputation included.
    pub block_backward_s: f64,
    /// The head's forward and backward (and the embedding's).
    pub head_s: f64,
    /// Reducing one block's gradients (all-reduce or reduce-scatter).
    pub block_reduce_s: f64,
    /// Reducing the embedding's and head's gradients.
    pub ends_reduce_s: f64,
    /// ZeRO-3: gathering one block's parameters.
    pub block_gather_s: f64,
    /// ZeRO-3: gathering the embedding's and head's parameters, per
    /// micro-batch.
    pub ends_gather_s: f64,
    /// ZeRO-1 and 2: the all-gather of the updated parameters after the
    /// settle.
    pub after_s: f64,
}

/// The compute thread's and the communication thread's clocks, seconds.
#[derive(Default)]
struct Clocks {
    /// When the compute thread is free.
    compute: f64,
    /// When the communication thread has finished what was started.
    comm: f64,
}

impl Clocks {
    fn run(&mut self, secs: f64) {
        self.compute += secs;
    }

    /// Starts a collective of `secs` behind those started before; returns
    /// when it ends.
    fn start(&mut self, secs: f64) -> f64 {
        self.comm = self.comm.max(self.compute) + secs;
        self.comm
    }

    /// The compute thread waits for a collective ending at `end`.
    fn wait(&mut self, end: f64) {
        self.compute = self.compute.max(end);
    }
}

/// The part of the DP communication of `x` the compute thread waits for,
/// seconds (the step's time beyond its compute).
pub fn exposed(x: &OverlapInput) -> f64 {
    let mut t = Clocks::default();
    for mb in 0..x.micro_batches {
        let reduce = x.zero >= ZeroStage::Two || mb + 1 == x.micro_batches;
        match (x.zero, x.unit_by_unit) {
            (ZeroStage::Three, _) => zero3_micro_batch(x, &mut t),
            (_, true) => {
                t.run(x.blocks as f64 * x.block_forward_s + x.head_s);
                for _ in 0..x.blocks {
                    t.run(x.block_backward_s);
                    if reduce {
                        t.start(x.block_reduce_s);
                    }
                }
                if reduce {
                    t.start(x.ends_reduce_s);
                }
            }
            (_, false) => {
                let blocks = x.blocks as f64;
                t.run(blocks * (x.block_forward_s + x.block_backward_s) + x.head_s);
                if reduce {
                    t.start(blocks * x.block_reduce_s + x.ends_reduce_s);
                }
            }
        }
    }
    let settled = t.comm;
    t.wait(settled);
    t.run(x.after_s);
    let compute = x.micro_batches as f64
        * (x.blocks as f64 * (x.block_forward_s + x.block_backward_s) + x.head_s);
    t.compute - compute
}

/// One ZeRO-3 micro-batch: the ends' gathers, then the `2L` acquires of
/// the blocks, each gather started `prefetch` acquires ahead.
fn zero3_micro_batch(x: &OverlapInput, t: &mut Clocks) {
    let end = t.start(x.ends_gather_s);
    t.wait(end);
    let acquires = 2 * x.blocks;
    // When each acquire's gather ends, once started.
    let mut gathers: Vec<Option<f64>> = vec![None; acquires];
    for k in 0..acquires {
        let end = match gathers[k] {
            Some(end) => end,
            None => t.start(x.block_gather_s),
        };
        t.wait(end);
        for g in gathers
            .iter_mut()
            .take((k + 1 + x.prefetch).min(acquires))
            .skip(k + 1)
        {
            if g.is_none() {
                *g = Some(t.start(x.block_gather_s));
            }
        }
        if k < x.blocks {
            t.run(x.block_forward_s);
            if k + 1 == x.blocks {
                t.run(x.head_s);
            }
        } else {
            t.run(x.block_backward_s);
            t.start(x.block_reduce_s);
        }
    }
    t.start(x.ends_reduce_s);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2 blocks, 1 micro-batch: forward 1 s per block, backward 3 s, the
    /// head 1 s; a block's reduction 0.4 s, the ends' 0.3 s; under ZeRO-3 a
    /// block's gather 0.5 s, the ends' 0.2 s; no all-gather after.
    fn input(zero: ZeroStage, prefetch: usize) -> OverlapInput {
        OverlapInput {
            zero,
            blocks: 2,
            micro_batches: 1,
            unit_by_unit: true,
            prefetch,
            block_forward_s: 1.0,
            block_backward_s: 3.0,
            head_s: 1.0,
            block_reduce_s: 0.4,
            ends_reduce_s: 0.3,
            block_gather_s: 0.5,
            ends_gather_s: 0.2,
            after_s: 0.0,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    /// DDP: compute ends at 2 + 1 + 3 + 3 = 9; block 1's all-reduce runs
    /// 6-6.4 behind block 0's backward, block 0's 9-9.4, the ends'
    /// 9.4-9.7: 0.7 s exposed of 1.1 s.
    #[test]
    fn ddp_hides_all_but_the_last_blocks_reduction() {
        let x = input(ZeroStage::Off, 0);
        assert!(close(exposed(&x), 0.7), "{}", exposed(&x));
        // The whole-graph backward hides nothing.
        let whole = OverlapInput {
            unit_by_unit: false,
            ..x
        };
        assert!(close(exposed(&whole), 1.1), "{}", exposed(&whole));
        // An all-gather after the update is exposed whole.
        let z1 = OverlapInput {
            zero: ZeroStage::One,
            after_s: 0.25,
            ..x
        };
        assert!(close(exposed(&z1), 0.95), "{}", exposed(&z1));
    }

    /// ZeRO-3 with one block ahead, by hand (c: compute clock, q: the
    /// communication thread's): ends' gather 0-0.2 (c 0.2); acquire 0:
    /// gather 0.2-0.7 (c 0.7), prefetch 1 (0.7-1.2), forward 0 (c 1.7);
    /// acquire 1 (no wait), prefetch 1 again for backward (1.7-2.2),
    /// forward 1 and head (c 3.7); acquire 1 (no wait), prefetch 0
    /// (3.7-4.2), backward 1 (c 6.7), reduce 1 (6.7-7.1); acquire 0 (no
    /// wait), backward 0 (c 9.7), reduce 0 (9.7-10.1), ends' reduce
    /// (10.1-10.4); settle at 10.4. Compute is 9: 1.4 s exposed.
    #[test]
    fn zero3_prefetch_1_by_hand() {
        assert!(close(exposed(&input(ZeroStage::Three, 1)), 1.4));
    }

    /// Without prefetch every gather is waited for: the ends' 0.2, four
    /// block gathers 2.0, block 0's backward gather also behind block
    /// 1's reduce-scatter 0.4 (7.7-8.1), then the last reduction and the
    /// ends' 0.7: 3.3 s exposed. Two ahead hides as much as one here
    /// (every gather is shorter than the compute before it).
    #[test]
    fn zero3_prefetch_0_waits_for_every_gather() {
        let none = exposed(&input(ZeroStage::Three, 0));
        assert!(close(none, 3.3), "{none}");
        let two = exposed(&input(ZeroStage::Three, 2));
        assert!(close(two, 1.4), "{two}");
    }

    /// Gathers and reductions longer than a block's compute, and a long
    /// head: with one block ahead the communication thread idles during
    /// the head, with two it gathers one more block then.
    #[test]
    fn a_deeper_prefetch_hides_long_gathers() {
        let slow = |prefetch| OverlapInput {
            blocks: 4,
            block_backward_s: 2.0,
            head_s: 6.0,
            block_gather_s: 1.5,
            block_reduce_s: 1.0,
            ..input(ZeroStage::Three, prefetch)
        };
        let (one, two) = (exposed(&slow(1)), exposed(&slow(2)));
        assert!(two < one && one < exposed(&slow(0)), "{two} {one}");
    }
}
