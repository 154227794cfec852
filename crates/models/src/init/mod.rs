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
        let stream = NormalStream::new(self.seed, name_key(name));
        self.param(name, shape, |i| (stream.at(i) * std) as f32)
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
        self.param(name, shape, |_| value)
    }

    /// The parameter whose whole tensor has element `i` equal to
    /// `value(i)`: this rank's block of it, or a placeholder.
    fn param<const D: usize>(
        &self,
        name: &str,
        shape: [usize; D],
        value: impl Fn(u64) -> f32,
    ) -> Result<Param<Tensor<B, D>>, ShardError> {
        if !self.held {
            return Ok(Param::from_tensor(Tensor::zeros([1; D], self.device)));
        }
        let block = self.plan.block(name, &shape, self.rank)?;
        let (values, block_shape) = block_values(&shape, block, value);
        Ok(Param::from_data(
            TensorData::new(values, block_shape),
            self.device,
        ))
    }
}

/// The values of a block of a tensor of `shape` whose element `i` (flat,
/// row-major) is `value(i)`: all of it for `None`, else the indices
/// `range` of dimension `dim`, zeros past `shape[dim]`. Returns the values
/// (row-major) and the block's shape.
fn block_values(
    shape: &[usize],
    block: Option<(usize, Range<usize>)>,
    value: impl Fn(u64) -> f32,
) -> (Vec<f32>, Vec<usize>) {
    let Some((dim, range)) = block else {
        let n: usize = shape.iter().product();
        return ((0..n as u64).map(value).collect(), shape.to_vec());
    };
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    let size = shape[dim];
    let mut values = Vec::with_capacity(outer * range.len() * inner);
    for o in 0..outer {
        for j in range.clone() {
            let first = ((o * size + j) * inner) as u64;
            values.extend((0..inner as u64).map(|k| if j < size { value(first + k) } else { 0.0 }));
        }
    }
    let mut block_shape = shape.to_vec();
    block_shape[dim] = range.len();
    (values, block_shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Element `i` of a tensor of shape `[3, 4, 5]` is `i`.
    fn whole() -> Vec<f32> {
        block_values(&[3, 4, 5], None, |i| i as f32).0
    }

    #[test]
    fn a_block_along_any_dimension_is_those_elements_of_the_whole() {
        let whole = whole();
        for (dim, range) in [(0, 1..3), (1, 2..4), (2, 0..2), (2, 3..5)] {
            let (got, shape) = block_values(&[3, 4, 5], Some((dim, range.clone())), |i| i as f32);
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
        let (got, shape) = block_values(&[3, 2], Some((0, 2..4)), |i| i as f32 + 1.0);
        assert_eq!(shape, [2, 2]);
        assert_eq!(got, [5.0, 6.0, 0.0, 0.0]);
        // Columns 1..3 of a [2, 2] tensor: column 1, then a padding column.
        let (got, _) = block_values(&[2, 2], Some((1, 1..3)), |i| i as f32 + 1.0);
        assert_eq!(got, [2.0, 0.0, 4.0, 0.0]);
    }
}
