//! Whole gradients summed over a step's micro-batches and averaged over
//! the DP group bucket by bucket (DDP and ZeRO-1), with the buckets'
//! all-reduces started as soon as their gradients are complete when the
//! reduction overlaps backward.

use std::collections::{HashMap, HashSet};

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;
use ferrotron_engine::optim::scale_grads;
use ferrotron_engine::precision::Precision;

use crate::comm::nccl::device::SharedCollectives;
use crate::comm::tensor::{from_host, host_f32};
use crate::comm::{CommError, CommThread, Started};
use crate::flat::tensors::GradBytes;
use crate::flat::FlatLayout;
use crate::grad_sync::norm::{weighted_squares, NormShares};

/// Flat (rank-1) tensors by parameter.
type Flat<B> = HashMap<ParamId, Tensor<<B as AutodiffBackend>::InnerBackend, 1>>;

/// An all-reduce in flight: the bucket's parameters with gradients and
/// their lengths (in the order they were joined), and its handle.
type InFlight<B> = (
    Vec<(ParamId, usize)>,
    Started<Tensor<<B as AutodiffBackend>::InnerBackend, 1>>,
);

/// Whole gradients of a step: summed over its micro-batches, averaged over
/// the DP group by one all-reduce per bucket of the layout, then applied
/// or dropped.
///
/// Without overlap every bucket is all-reduced in [`Self::settle`], after
/// the last backward, and waited for before the next starts. With overlap,
/// during the step's last micro-batch ([`Self::last_micro_batch`]) a
/// bucket whose every parameter has received its gradient is started at
/// once on the communication thread while backward goes on (blocks finish
/// in reverse, so the buckets of the last blocks go first: reverse order
/// of use); [`Self::settle`] starts the rest and waits for all. Either way
/// each bucket's all-reduce gets the same values, so the results are
/// bit-identical.
pub struct ReplicatedGrads<B: AutodiffBackend> {
    layout: FlatLayout,
    /// The bucket of each parameter.
    bucket_of: HashMap<ParamId, usize>,
    reduce: Precision,
    overlap: bool,
    /// The step's gradients so far, summed over its micro-batches (averaged
    /// once settled).
    sum: Flat<B>,
    /// During the last micro-batch, with overlap: the parameters whose
    /// gradient it has given so far.
    last: Option<HashSet<ParamId>>,
    /// Whether each bucket's all-reduce has started this step.
    started: Vec<bool>,
    /// Started all-reduces not yet waited for, in the order they started.
    in_flight: Vec<InFlight<B>>,
    /// Where the all-reduces run when not on the DP group's host path.
    device: Option<SharedCollectives<B::InnerBackend>>,
    /// The averaged gradients between `reduce` and `take`, and their bytes.
    reduced: Option<(GradientsParams, usize)>,
}

impl<B: AutodiffBackend> ReplicatedGrads<B> {
    /// Gradients of the buckets of `layout`, reduced in precision `reduce`,
    /// with `overlap` of the reduction and the last backward.
    pub fn new(layout: FlatLayout, reduce: Precision, overlap: bool) -> Self {
        let bucket_of = layout
            .units()
            .iter()
            .enumerate()
            .flat_map(|(u, unit)| unit.slots.iter().map(move |s| (s.id, u)))
            .collect();
        Self {
            started: vec![false; layout.units().len()],
            bucket_of,
            layout,
            reduce,
            overlap,
            sum: HashMap::new(),
            last: None,
            in_flight: Vec::new(),
            device: None,
            reduced: None,
        }
    }

    /// Runs every bucket's all-reduce on `device` (collectives over the
    /// same DP group on the bucket's tensor, still ordered and timed on the
    /// communication thread) instead of copying it to the host: the same
    /// sums in the same order, so f32 results are bit-identical; under
    /// `--reduce-dtype bf16` the wire carries bf16 (see the parent module).
    ///
    /// # Panics
    /// If `device` spans another number of ranks than the layout's DP group.
    pub fn reduce_on(&mut self, device: SharedCollectives<B::InnerBackend>) {
        assert_eq!(
            device.world_size(),
            self.layout.dp(),
            "device collectives over another group than the DP group"
        );
        self.device = Some(device);
    }

    /// The next micro-batch is the step's last: with overlap, buckets it
    /// completes start their all-reduce at once.
    pub fn last_micro_batch(&mut self) {
        if self.overlap && self.layout.dp() > 1 {
            self.last = Some(HashSet::new());
        }
    }

    /// Adds one micro-batch's gradients; with overlap, in the last
    /// micro-batch, starts the all-reduce of every bucket now complete.
    ///
    /// # Panics
    /// If a gradient arrives for a bucket already started (a schedule that
    /// gives a parameter's gradient twice in one micro-batch).
    pub fn add<M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        grads: GradientsParams,
        thread: &CommThread,
    ) {
        let mut take = TakeFlat::<B> {
            grads,
            flat: HashMap::new(),
        };
        model.visit(&mut take);
        for (id, g) in take.flat {
            if let Some(&u) = self.bucket_of.get(&id) {
                assert!(
                    !self.started[u],
                    "a gradient arrived for bucket {u}, whose all-reduce has started"
                );
            }
            let sum = match self.sum.remove(&id) {
                Some(acc) => acc.add(g),
                None => g,
            };
            self.sum.insert(id, sum);
            if let Some(seen) = self.last.as_mut() {
                seen.insert(id);
            }
        }
        let Some(seen) = &self.last else {
            return;
        };
        let complete: Vec<usize> = (0..self.started.len())
            .rev()
            .filter(|&u| {
                self.layout.units()[u]
                    .slots
                    .iter()
                    .all(|s| seen.contains(&s.id))
            })
            .collect();
        for u in complete {
            if !self.started[u] {
                self.start_bucket(u, thread);
            }
        }
    }

    /// Starts the all-reduce of bucket `u`'s summed gradients (rounded to
    /// the reduction precision); without overlap it is waited for at once.
    fn start_bucket(&mut self, u: usize, thread: &CommThread) {
        self.started[u] = true;
        let present: Vec<(ParamId, usize)> = self.layout.units()[u]
            .slots
            .iter()
            .filter(|s| self.sum.contains_key(&s.id))
            .map(|s| (s.id, s.numel()))
            .collect();
        if present.is_empty() {
            return;
        }
        let joined = Tensor::cat(
            present.iter().map(|(id, _)| self.sum[id].clone()).collect(),
            0,
        );
        let rounded = self.reduce.round_tensor(joined);
        let pending = match &self.device {
            Some(device) => {
                let (device, reduce) = (device.clone(), self.reduce);
                Started::Own(thread.start_own(move || device.all_reduce_sum(rounded, reduce)))
            }
            None => Started::Host(thread.start_all_reduce_sum(host_f32(rounded))),
        };
        self.in_flight.push((present, pending));
    }

    /// Ends the step's sum: starts every bucket not started yet (in reverse
    /// order) and waits for every all-reduce in the order they started,
    /// leaving the averaged gradients (rounded to the reduction precision).
    /// A no-op on one DP rank and when already settled.
    pub fn settle(&mut self, thread: &CommThread) -> Result<(), CommError> {
        self.last = None;
        if self.layout.dp() == 1 {
            return Ok(());
        }
        for u in (0..self.started.len()).rev() {
            if !self.started[u] {
                self.start_bucket(u, thread);
                if !self.overlap {
                    self.finish_started()?;
                }
            }
        }
        self.finish_started()
    }

    /// Waits for the all-reduces in flight, in the order they started, and
    /// puts each bucket's average into the sums.
    fn finish_started(&mut self) -> Result<(), CommError> {
        let w = self.layout.dp() as f64;
        for (present, pending) in std::mem::take(&mut self.in_flight) {
            let summed = match pending {
                Started::Host(pending) => {
                    from_host(pending.wait()?, &self.sum[&present[0].0].device())
                }
                Started::Own(pending) => pending.wait()?,
            };
            let averaged = self.reduce.round_tensor(summed.div_scalar(w));
            let mut at = 0;
            for (id, n) in present {
                self.sum.insert(id, averaged.clone().slice(at..at + n));
                at += n;
            }
        }
        Ok(())
    }

    /// Settles the step's sum, keeps the averaged gradients for
    /// [`Self::take`] and returns the sum of their squares, each parameter
    /// weighted by `shares`.
    pub fn reduce<M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        thread: &CommThread,
        shares: &NormShares,
    ) -> Result<f64, CommError> {
        self.settle(thread)?;
        self.started.iter_mut().for_each(|s| *s = false);
        let mut put = PutBack::<B> {
            grads: GradientsParams::new(),
            flat: std::mem::take(&mut self.sum),
        };
        model.visit(&mut put);
        let grads = put.grads;
        let mut bytes = GradBytes {
            grads: &grads,
            bytes: 0,
        };
        model.visit(&mut bytes);
        let grad_bytes = bytes.bytes;
        // Every DP rank holds every (averaged) gradient: nothing to add up across them.
        let squares = weighted_squares(model, &grads, shares);
        self.reduced = Some((grads, grad_bytes));
        Ok(squares)
    }

    /// The reduced gradients, multiplied by `scale` if given, and the bytes
    /// they held.
    ///
    /// # Panics
    /// Without a [`Self::reduce`] since the last `take` or `discard`.
    pub fn take<M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        scale: Option<f64>,
    ) -> (GradientsParams, usize) {
        let (mut grads, bytes) = self.reduced.take().expect("take follows reduce");
        if let Some(factor) = scale {
            scale_grads(model, &mut grads, factor);
        }
        (grads, bytes)
    }

    /// Drops the reduced gradients (a skipped step).
    pub fn discard(&mut self) {
        self.reduced = None;
    }
}

/// Moves every gradient out of `grads` as a rank-1 tensor.
struct TakeFlat<B: AutodiffBackend> {
    grads: GradientsParams,
    flat: Flat<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for TakeFlat<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            let n = g.shape().num_elements();
            self.flat.insert(param.id, g.reshape([n]));
        }
    }
}

/// Puts the (averaged) rank-1 gradients back into `grads` in their parameters' shapes.
struct PutBack<B: AutodiffBackend> {
    grads: GradientsParams,
    flat: Flat<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for PutBack<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.flat.remove(&param.id) {
            let shape: [usize; D] = param.val().dims();
            self.grads.register(param.id, g.reshape(shape));
        }
    }
}
