//! Deterministic, layout-independent host-side initialisation.
//!
//! Every value is drawn on the host by a counter-based generator
//! ([`counter`]) keyed by the seed, the parameter's full name and the
//! element's index in the whole tensor, so the same seed gives the same
//! model on every backend, on every rank and under every layout: a rank
//! under tensor parallelism draws only its block of each tensor (the
//! shard plan's rows or columns, vocabulary padding as zeros), and a
//! pipeline stage draws only its units' tensors (the others are
//! one-element placeholders). Gathered, the blocks are the one-rank
//! model bit for bit.

pub mod counter;
mod source;

pub use self::source::PartSource;

use std::cell::RefCell;
use std::ops::Range;

use burn::module::Param;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use ferrotron_parallel::tensor::{ShardError, ShardPlan};

use self::counter::{name_key, NormalStream};

/// A seeded source of initial parameter values for one rank's part of a
/// model.
pub struct Init<'d, B: Backend> {
    seed: u64,
    device: &'d B::Device,
    /// How each parameter is split over the TP group (`ShardPlan::none()`:
    /// whole).
    plan: ShardPlan,
    /// This rank's place in the TP group.
    rank: usize,
    /// Whether the tensors are built; `false` gives placeholders (a unit
    /// of another pipeline stage).
    held: bool,
    /// Where a recording source notes each held parameter it is asked
    /// for, by name, instead of drawing it (every tensor a placeholder).
    record: Option<&'d RefCell<Vec<(String, Spec)>>>,
}

impl<'d, B: Backend> Init<'d, B> {
    /// Whole tensors seeded with `seed`, created on `device`.
    pub fn new(seed: u64, device: &'d B::Device) -> Self {
        Self::sharded(seed, device, ShardPlan::none(), 0)
    }

    /// Rank `rank`'s blocks under `plan` of tensors seeded with `seed`.
    pub fn sharded(seed: u64, device: &'d B::Device, plan: ShardPlan, rank: usize) -> Self {
        Self {
            seed,
            device,
            plan,
            rank,
            held: true,
            record: None,
        }
    }

    /// The same source drawing nothing: every parameter is a placeholder,
    /// and each held one is noted in `record` with how it would have been
    /// drawn (what [`PartSource`] draws pieces of).
    pub(crate) fn recording(&self, record: &'d RefCell<Vec<(String, Spec)>>) -> Self {
        Self {
            plan: self.plan.clone(),
            record: Some(record),
            ..*self
        }
    }

    /// The same source building its tensors (`held`) or one-element
    /// placeholders in their place.
    pub fn holding(&self, held: bool) -> Self {
        Self {
            plan: self.plan.clone(),
            held,
            ..*self
        }
    }

    /// The device tensors are created on.
    pub fn device(&self) -> &'d B::Device {
        self.device
    }

    /// This rank's block of parameter `name`, whose whole shape is
    /// `shape`, drawn from `N(0, std^2)` (element `i` of the whole tensor
    /// is `std` times [`NormalStream::at`]`(i)`, rounded to f32).
    ///
    /// # Errors
    /// `name` is not in the shard plan, or its cut dimension does not
    /// divide by the TP degree.
    pub fn normal<const D: usize>(
        &self,
        name: &str,
        shape: [usize; D],
        std: f64,
    ) -> Result<Param<Tensor<B, D>>, ShardError> {
        self.param(name, shape, Draw::Normal { std })
    }

    /// This rank's block of parameter `name` (whole shape `shape`) filled
    /// with `value` (vocabulary padding: zeros).
    ///
    /// # Errors
    /// As [`Init::normal`].
    pub fn constant<const D: usize>(
        &self,
        name: &str,
        shape: [usize; D],
        value: f32,
    ) -> Result<Param<Tensor<B, D>>, ShardError> {
        self.param(name, shape, Draw::Constant(value))
    }

    /// The parameter whose whole tensor is drawn by `draw`: this rank's
    /// block of it, or a placeholder.
    fn param<const D: usize>(
        &self,
        name: &str,
        shape: [usize; D],
        draw: Draw,
    ) -> Result<Param<Tensor<B, D>>, ShardError> {
        let placeholder = || Param::from_tensor(Tensor::zeros([1; D], self.device));
        if !self.held {
            return Ok(placeholder());
        }
        let spec = Spec {
            block: self.plan.block(name, &shape, self.rank)?,
            shape: shape.to_vec(),
            draw,
        };
        if let Some(record) = self.record {
            record.borrow_mut().push((name.to_string(), spec));
            return Ok(placeholder());
        }
        let block_shape = spec.block_shape();
        let values = spec.values(self.seed, name, 0..block_shape.iter().product());
        Ok(Param::from_data(
            TensorData::new(values, block_shape),
            self.device,
        ))
    }
}

/// How the elements of a parameter's whole tensor are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Draw {
    /// `std` times the counter-based standard normal of the element.
    Normal {
        /// Standard deviation.
        std: f64,
    },
    /// Every element `value`.
    Constant(f32),
}

/// One parameter of a rank's part: its whole shape, the rank's block of
/// it and how it is drawn (enough to draw any range of the block alone).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Spec {
    /// The whole tensor's shape.
    pub shape: Vec<usize>,
    /// The rank's block: indices of one dimension (`None`: all of it).
    pub block: Option<(usize, Range<usize>)>,
    /// How its elements are drawn.
    pub draw: Draw,
}

impl Spec {
    /// The shape of the rank's block.
    pub fn block_shape(&self) -> Vec<usize> {
        let mut shape = self.shape.clone();
        if let Some((dim, range)) = &self.block {
            shape[*dim] = range.len();
        }
        shape
    }

    /// Elements `range` of the flat (row-major) view of the rank's block
    /// of parameter `name` under `seed`.
    pub fn values(&self, seed: u64, name: &str, range: Range<usize>) -> Vec<f32> {
        let block = self.block.clone();
        match self.draw {
            Draw::Normal { std } => {
                let stream = NormalStream::new(seed, name_key(name));
                block_values(&self.shape, block, range, |i| (stream.at(i) * std) as f32)
            }
            Draw::Constant(value) => block_values(&self.shape, block, range, |_| value),
        }
    }
}

/// Elements `range` of the flat (row-major) view of a block of a tensor
/// of `shape` whose element `i` (flat, row-major) is `value(i)`: all of
/// it for `block` `None`, else the indices `block.1` of dimension
/// `block.0`, zeros past `shape[dim]`. The block is walked row by row (a
/// row: its elements with all but the last `dim + 1` coordinates fixed),
/// so a range costs its own length.
pub(crate) fn block_values(
    shape: &[usize],
    block: Option<(usize, Range<usize>)>,
    range: Range<usize>,
    value: impl Fn(u64) -> f32,
) -> Vec<f32> {
    let Some((dim, cut)) = block else {
        return range.map(|i| value(i as u64)).collect();
    };
    let inner: usize = shape[dim + 1..].iter().product();
    let (size, width) = (shape[dim], cut.len());
    let mut values = Vec::with_capacity(range.len());
    let mut f = range.start;
    while f < range.end {
        // Element `f` of the block is element `k` of row `j` (of the cut
        // dimension) of slice `o` (of the dimensions before it).
        let row = f / inner;
        let (o, j, k) = (row / width, cut.start + row % width, f % inner);
        let end = inner.min(k + range.end - f);
        let first = ((o * size + j) * inner) as u64;
        values.extend((k..end).map(|e| {
            if j < size {
                value(first + e as u64)
            } else {
                0.0
            }
        }));
        f += end - k;
    }
    values
}

#[cfg(test)]
mod tests {
    use super::*;

    /// All of a block (`None`: the whole tensor) of a tensor of `shape`
    /// whose element `i` is `value(i)`, and the block's shape.
    fn all_of(
        shape: &[usize],
        block: Option<(usize, Range<usize>)>,
        value: impl Fn(u64) -> f32,
    ) -> (Vec<f32>, Vec<usize>) {
        let mut block_shape = shape.to_vec();
        if let Some((dim, range)) = &block {
            block_shape[*dim] = range.len();
        }
        let n = block_shape.iter().product();
        (block_values(shape, block, 0..n, value), block_shape)
    }

    /// Element `i` of a tensor of shape `[3, 4, 5]` is `i`.
    fn whole() -> Vec<f32> {
        all_of(&[3, 4, 5], None, |i| i as f32).0
    }

    #[test]
    fn a_block_along_any_dimension_is_those_elements_of_the_whole() {
        let whole = whole();
        for (dim, range) in [(0, 1..3), (1, 2..4), (2, 0..2), (2, 3..5)] {
            let (got, shape) = all_of(&[3, 4, 5], Some((dim, range.clone())), |i| i as f32);
            let mut want_shape = vec![3, 4, 5];
            want_shape[dim] = range.len();
            assert_eq!(shape, want_shape, "dim {dim}");
            // Every element of the block is the whole tensor's element at
            // the same coordinates, shifted by the block's start along `dim`.
            for (n, &v) in got.iter().enumerate() {
                let mut c = [
                    n / (shape[1] * shape[2]),
                    n / shape[2] % shape[1],
                    n % shape[2],
                ];
                c[dim] += range.start;
                assert_eq!(
                    v,
                    whole[(c[0] * 4 + c[1]) * 5 + c[2]],
                    "dim {dim} element {n}"
                );
            }
        }
    }

    #[test]
    fn a_block_past_the_end_is_zero_padding() {
        // Rows 2..4 of a [3, 2] tensor: row 2, then a padding row.
        let (got, shape) = all_of(&[3, 2], Some((0, 2..4)), |i| i as f32 + 1.0);
        assert_eq!(shape, [2, 2]);
        assert_eq!(got, [5.0, 6.0, 0.0, 0.0]);
        // Columns 1..3 of a [2, 2] tensor: column 1, then a padding column.
        let (got, _) = all_of(&[2, 2], Some((1, 1..3)), |i| i as f32 + 1.0);
        assert_eq!(got, [2.0, 0.0, 4.0, 0.0]);
    }

    #[test]
    fn any_range_of_a_block_drawn_alone_is_that_range_of_the_block() {
        // Blocks along each dimension, one running into padding (rows 3..5
        // of a dimension of 4), and the whole tensor.
        let shape = [3, 4, 5];
        for block in [
            None,
            Some((0, 1..3)),
            Some((1, 2..4)),
            Some((1, 3..5)),
            Some((2, 1..4)),
        ] {
            let (all, _) = all_of(&shape, block.clone(), |i| i as f32 + 1.0);
            for start in 0..all.len() {
                for end in start..=all.len() {
                    let got = block_values(&shape, block.clone(), start..end, |i| i as f32 + 1.0);
                    assert_eq!(got, all[start..end], "{block:?} {start}..{end}");
                }
            }
        }
    }
}
