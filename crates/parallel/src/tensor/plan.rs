//! Which parameters tensor parallelism splits, and how: a table from
//! parameter names to [`Split`]s, declared as data by the model (as
//! `models/src/hf/names.rs` declares Hugging Face names), and the host-side
//! cutting and joining of whole tensors that the table implies.
//!
//! A TP run cuts each parameter of the whole model it builds with
//! [`ShardPlan::shard`]; [`ShardPlan::gather`] joins the blocks of every
//! rank (validation's weights). A sharded checkpoint stores each rank's
//! block where [`ShardPlan::placement`] says it lies in the whole tensor,
//! so a checkpoint loads on any number of ranks.

use std::ops::Range;

use burn::tensor::TensorData;

use super::vocab::{padded_vocab, VocabShard};
use crate::comm::{CommError, Communicator};

/// How one parameter is laid out over the TP group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Every rank holds all of it, and computes the same gradient for it
    /// (norms, position embeddings, biases of row-parallel layers).
    Replicated,
    /// Cut along dimension `.0` into `tp` equal blocks; rank `r` holds
    /// block `r` (column-parallel weights and biases: dimension 1 and 0;
    /// row-parallel weights: dimension 0).
    Even(usize),
    /// Dimension `.0` is the vocabulary: padded with zeros to the padded
    /// vocabulary, then cut like [`Split::Even`].
    Vocab(usize),
}

/// What can go wrong when cutting or joining parameters.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// The model has a parameter its table does not name.
    #[error("parameter '{0}' is not in the tensor-parallel sharding table")]
    Unplanned(String),
    /// A dimension that should be cut does not divide by the TP degree.
    #[error("parameter '{name}': dimension {dim} of size {size} does not divide by --tp {tp}")]
    Indivisible {
        /// Parameter name.
        name: String,
        /// The dimension cut.
        dim: usize,
        /// Its size.
        size: usize,
        /// The TP degree.
        tp: usize,
    },
    /// The tensor's values are not `f32`.
    #[error("parameter '{0}' does not hold f32 values")]
    NotF32(String),
    /// A collective failed while joining the blocks.
    #[error(transparent)]
    Comm(#[from] CommError),
}

/// The split of every parameter of one model over `tp` ranks.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardPlan {
    /// `(suffix, split)`: a parameter named `suffix` or ending in
    /// `.suffix` is split so; the first matching rule wins.
    rules: Vec<(&'static str, Split)>,
    tp: usize,
    vocab: usize,
    divisible_by: usize,
    sequence: bool,
}

impl ShardPlan {
    /// No tensor parallelism: every parameter whole on every rank.
    pub fn none() -> Self {
        Self {
            rules: Vec::new(),
            tp: 1,
            vocab: 0,
            divisible_by: 1,
            sequence: false,
        }
    }

    /// The table `rules` for a model of `vocab` tokens split over `tp`
    /// ranks, the vocabulary padded to a multiple of `divisible_by x tp`.
    pub fn new(
        rules: &[(&'static str, Split)],
        vocab: usize,
        tp: usize,
        divisible_by: usize,
    ) -> Self {
        Self {
            rules: rules.to_vec(),
            tp,
            vocab,
            divisible_by,
            sequence: false,
        }
    }

    /// The plan with sequence parallelism on or off (on more than one rank).
    pub fn with_sequence_parallel(self, on: bool) -> Self {
        Self {
            sequence: on && self.tp > 1,
            ..self
        }
    }

    /// Whether the activations around the split layers are split along
    /// the sequence (Korthikanti et al. 2022).
    pub fn sequence_parallel(&self) -> bool {
        self.sequence
    }

    /// Whether each rank's gradient of parameter `name` covers only its
    /// block of the sequence, so that the TP group must sum it: the
    /// replicated parameters under sequence parallelism (norms, biases of
    /// row-parallel layers, position embeddings).
    pub fn partial_gradient(&self, name: &str) -> Result<bool, ShardError> {
        Ok(self.sequence && self.split(name)? == Split::Replicated)
    }

    /// The TP degree.
    pub fn tp(&self) -> usize {
        self.tp
    }

    /// Rank `rank`'s block of the vocabulary.
    pub fn vocab_shard(&self, rank: usize) -> VocabShard {
        VocabShard::new(self.vocab, self.tp, rank, self.divisible_by)
    }

    /// How parameter `name` is split (everything is whole on one rank).
    pub fn split(&self, name: &str) -> Result<Split, ShardError> {
        if self.tp == 1 {
            return Ok(Split::Replicated);
        }
        self.rules
            .iter()
            .find(|(suffix, _)| {
                name == *suffix
                    || name
                        .strip_suffix(suffix)
                        .is_some_and(|head| head.ends_with('.'))
            })
            .map(|&(_, split)| split)
            .ok_or_else(|| ShardError::Unplanned(name.to_string()))
    }

    /// The part of the squared norm of parameter `name`'s gradient that
    /// this rank counts: 1 for a block only it holds, `1 / tp` for a
    /// replicated parameter (every rank holds the same gradient), so that
    /// summing over the TP group counts each value once.
    pub fn norm_share(&self, name: &str) -> Result<f64, ShardError> {
        Ok(match self.split(name)? {
            Split::Replicated => 1.0 / self.tp as f64,
            _ => 1.0,
        })
    }

    /// Where rank `rank`'s block of parameter `name` (of shape `local`, as
    /// the rank holds it) lies in the whole tensor: its offset in each
    /// dimension, and the whole tensor's shape (without vocabulary padding;
    /// the last rank's block may reach past it).
    pub fn placement(
        &self,
        name: &str,
        local: &[usize],
        rank: usize,
    ) -> Result<(Vec<usize>, Vec<usize>), ShardError> {
        let mut offsets = vec![0; local.len()];
        let mut global = local.to_vec();
        match self.split(name)? {
            Split::Replicated => {}
            Split::Even(dim) => {
                offsets[dim] = rank * local[dim];
                global[dim] = local[dim] * self.tp;
            }
            Split::Vocab(dim) => {
                offsets[dim] = rank * local[dim];
                global[dim] = self.vocab;
            }
        }
        Ok((offsets, global))
    }

    /// The block of parameter `name`, whose whole shape is `shape`, that
    /// rank `rank` holds: `None` when it holds all of it, else the
    /// dimension cut and this rank's range of it, which runs past
    /// `shape[dim]` into the vocabulary padding (zeros) on the last ranks.
    pub fn block(
        &self,
        name: &str,
        shape: &[usize],
        rank: usize,
    ) -> Result<Option<(usize, Range<usize>)>, ShardError> {
        let (dim, padded) = match self.split(name)? {
            Split::Replicated => return Ok(None),
            Split::Even(dim) => (dim, shape[dim]),
            Split::Vocab(dim) => (dim, padded_vocab(shape[dim], self.tp, self.divisible_by)),
        };
        if padded % self.tp != 0 {
            return Err(ShardError::Indivisible {
                name: name.to_string(),
                dim,
                size: padded,
                tp: self.tp,
            });
        }
        let len = padded / self.tp;
        Ok(Some((dim, rank * len..(rank + 1) * len)))
    }

    /// Rank `rank`'s block of the whole tensor `data` of parameter `name`.
    pub fn shard(
        &self,
        name: &str,
        data: TensorData,
        rank: usize,
    ) -> Result<TensorData, ShardError> {
        let mut shape = data.shape.to_vec();
        let Some((dim, range)) = self.block(name, &shape, rank)? else {
            return Ok(data);
        };
        let values = f32_values(name, data)?;
        let padded = range.len() * self.tp;
        let values = pad(&values, &shape, dim, padded);
        shape[dim] = padded;
        let block = take(&values, &shape, dim, range.start, range.len());
        shape[dim] = range.len();
        Ok(TensorData::new(block, shape))
    }

    /// The whole tensor of parameter `name` from every rank's block `data`
    /// (a collective over `group`, the TP group: every rank calls it for
    /// the same names in the same order). Vocabulary padding is dropped.
    pub fn gather(
        &self,
        name: &str,
        data: TensorData,
        group: &dyn Communicator,
    ) -> Result<TensorData, ShardError> {
        let dim = match self.split(name)? {
            Split::Replicated => return Ok(data),
            Split::Even(dim) | Split::Vocab(dim) => dim,
        };
        let mut shape = data.shape.to_vec();
        let block = f32_values(name, data)?;
        let mut all = vec![0.0; block.len() * self.tp];
        group.all_gather(&block, &mut all)?;
        let joined = join(&all, &shape, dim, self.tp);
        shape[dim] *= self.tp;
        if let Split::Vocab(_) = self.split(name)? {
            let joined = take(&joined, &shape, dim, 0, self.vocab);
            shape[dim] = self.vocab;
            return Ok(TensorData::new(joined, shape));
        }
        Ok(TensorData::new(joined, shape))
    }
}

fn f32_values(name: &str, data: TensorData) -> Result<Vec<f32>, ShardError> {
    data.into_vec::<f32>()
        .map_err(|_| ShardError::NotF32(name.to_string()))
}

/// Elements before dimension `dim` (outer) and after it (inner) of `shape`.
fn outer_inner(shape: &[usize], dim: usize) -> (usize, usize) {
    (
        shape[..dim].iter().product(),
        shape[dim + 1..].iter().product(),
    )
}

/// Indices `start..start+len` of dimension `dim` of `values` (of `shape`).
fn take(values: &[f32], shape: &[usize], dim: usize, start: usize, len: usize) -> Vec<f32> {
    let (outer, inner) = outer_inner(shape, dim);
    let size = shape[dim];
    let mut out = Vec::with_capacity(outer * len * inner);
    for o in 0..outer {
        let from = (o * size + start) * inner;
        out.extend_from_slice(&values[from..from + len * inner]);
    }
    out
}

/// `values` (of `shape`) with dimension `dim` extended by zeros to `to`.
fn pad(values: &[f32], shape: &[usize], dim: usize, to: usize) -> Vec<f32> {
    let size = shape[dim];
    if to == size {
        return values.to_vec();
    }
    let (outer, inner) = outer_inner(shape, dim);
    let mut out = Vec::with_capacity(outer * to * inner);
    for o in 0..outer {
        out.extend_from_slice(&values[o * size * inner..(o + 1) * size * inner]);
        out.resize(out.len() + (to - size) * inner, 0.0);
    }
    out
}

/// `blocks` consecutive tensors of `shape` in `all`, joined along `dim`.
fn join(all: &[f32], shape: &[usize], dim: usize, blocks: usize) -> Vec<f32> {
    let (outer, inner) = outer_inner(shape, dim);
    let run = shape[dim] * inner;
    let numel = outer * run;
    let mut out = Vec::with_capacity(all.len());
    for o in 0..outer {
        for b in 0..blocks {
            let from = b * numel + o * run;
            out.extend_from_slice(&all[from..from + run]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::SingleProcess;

    const RULES: [(&str, Split); 3] = [
        ("embed", Split::Vocab(0)),
        ("q.weight", Split::Even(1)),
        ("norm.weight", Split::Replicated),
    ];

    fn matrix(rows: usize, cols: usize) -> TensorData {
        let v: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        TensorData::new(v, [rows, cols])
    }

    #[test]
    fn names_match_whole_path_segments_and_unknown_names_are_errors() {
        let plan = ShardPlan::new(&RULES, 3, 2, 1);
        assert_eq!(
            plan.split("layers.0.attn.q.weight").unwrap(),
            Split::Even(1)
        );
        assert_eq!(plan.split("embed").unwrap(), Split::Vocab(0));
        // `pos_embed` is not `embed`: suffixes match whole segments.
        let e = plan.split("pos_embed").unwrap_err().to_string();
        assert!(e.contains("'pos_embed'"), "{e}");
        assert_eq!(plan.norm_share("final.norm.weight").unwrap(), 0.5);
        assert_eq!(plan.norm_share("layers.1.attn.q.weight").unwrap(), 1.0);
        assert_eq!(
            ShardPlan::none().split("anything").unwrap(),
            Split::Replicated
        );
    }

    #[test]
    fn column_blocks_are_the_columns_of_each_rank() {
        let plan = ShardPlan::new(&RULES, 3, 2, 1);
        let b1 = plan.shard("a.q.weight", matrix(2, 4), 1).unwrap();
        assert_eq!(b1.shape.to_vec(), [2, 2]);
        assert_eq!(b1.to_vec::<f32>().unwrap(), [2.0, 3.0, 6.0, 7.0]);
    }

    #[test]
    fn vocabulary_rows_are_padded_with_zeros_then_cut() {
        // 3 tokens over 2 ranks, divisible by 1: padded to 4 rows.
        let plan = ShardPlan::new(&RULES, 3, 2, 1);
        let b0 = plan.shard("embed", matrix(3, 2), 0).unwrap();
        let b1 = plan.shard("embed", matrix(3, 2), 1).unwrap();
        assert_eq!(b0.to_vec::<f32>().unwrap(), [0.0, 1.0, 2.0, 3.0]);
        assert_eq!(b1.to_vec::<f32>().unwrap(), [4.0, 5.0, 0.0, 0.0]);
    }

    #[test]
    fn joining_blocks_inverts_cutting() {
        let plan = ShardPlan::new(&RULES, 3, 2, 1);
        for (name, whole) in [("embed", matrix(3, 2)), ("x.q.weight", matrix(3, 4))] {
            let blocks: Vec<Vec<f32>> = (0..2)
                .map(|r| {
                    plan.shard(name, whole.clone(), r)
                        .unwrap()
                        .to_vec()
                        .unwrap()
                })
                .collect();
            let block_shape = plan.shard(name, whole.clone(), 0).unwrap().shape.to_vec();
            let dim = match plan.split(name).unwrap() {
                Split::Even(d) | Split::Vocab(d) => d,
                Split::Replicated => unreachable!(),
            };
            let mut joined = join(&blocks.concat(), &block_shape, dim, 2);
            let mut shape = block_shape.clone();
            shape[dim] *= 2;
            if name == "embed" {
                joined = take(&joined, &shape, 0, 0, 3);
            }
            assert_eq!(joined, whole.to_vec::<f32>().unwrap(), "{name}");
        }
    }

    #[test]
    fn one_rank_gathers_and_cuts_nothing() {
        let plan = ShardPlan::none();
        let m = matrix(2, 3);
        assert_eq!(plan.shard("embed", m.clone(), 0).unwrap(), m);
        assert_eq!(plan.gather("embed", m.clone(), &SingleProcess).unwrap(), m);
    }

    #[test]
    fn a_dimension_that_does_not_divide_is_named() {
        let plan = ShardPlan::new(&RULES, 3, 2, 1);
        let e = plan
            .shard("x.q.weight", matrix(2, 3), 0)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "parameter 'x.q.weight': dimension 1 of size 3 does not divide by --tp 2"
        );
    }

    #[test]
    fn placement_names_where_each_block_lies_in_the_whole_tensor() {
        let plan = ShardPlan::new(&RULES, 3, 2, 1);
        // Each rank's block of `shard` is the whole tensor at `placement`'s offsets.
        for (name, whole) in [("embed", matrix(3, 4)), ("q.weight", matrix(4, 6))] {
            let values = whole.to_vec::<f32>().unwrap();
            let cols = whole.shape[1];
            for rank in 0..2 {
                let block = plan.shard(name, whole.clone(), rank).unwrap();
                let local = block.shape.to_vec();
                let (offsets, global) = plan.placement(name, &local, rank).unwrap();
                assert_eq!(global, whole.shape.to_vec(), "{name}");
                let got = block.to_vec::<f32>().unwrap();
                for r in 0..local[0] {
                    for c in 0..local[1] {
                        let (gr, gc) = (offsets[0] + r, offsets[1] + c);
                        let want = if gr < global[0] {
                            values[gr * cols + gc]
                        } else {
                            0.0
                        };
                        assert_eq!(got[r * local[1] + c], want, "{name} rank {rank} ({r}, {c})");
                    }
                }
            }
        }
        let (offsets, global) = plan.placement("norm.weight", &[5], 1).unwrap();
        assert_eq!((offsets, global), (vec![0], vec![5]));
    }
}
