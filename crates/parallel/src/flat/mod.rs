//! The one flat layout of parameters and gradients that data parallelism
//! and every ZeRO stage communicate through.
//!
//! Parameters are grouped into units: buckets of at most `--bucket-mb` in
//! visiting order (DDP's all-reduce buckets, ZeRO-1/2's units), or the
//! model's FSDP units ([`LmUnit`]s, ZeRO-3). A unit's parameters are laid
//! end to end in one flat `f32` vector (visiting order), padded with zeros
//! to a multiple of the DP size, and cut into `dp` equal chunks: rank `r`
//! owns chunk `r` of every unit. A chunk may start or end inside a
//! parameter (as in DeepSpeed), so a rank owns at most one contiguous
//! piece of each parameter.
//!
//! DDP is ZeRO-0 on this layout: it all-reduces each unit's gradients
//! (every rank keeps the whole unit) where ZeRO reduce-scatters them.
//!
//! `tensors` holds the module visitors and mappers that move parameters
//! and gradients between a model and this layout (a rank's pieces, bytes
//! held, assigning gathered values, releasing to placeholders), shared by
//! DDP, ZeRO and the pipeline's placement.
//!
//! [`LmUnit`]: ferrotron_engine::lm::LmUnit

pub(crate) mod tensors;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use ferrotron_engine::lm::{LmUnit, LmUnits};

/// One parameter's place in its unit's flat vector.
#[derive(Clone, Debug, PartialEq)]
pub struct Slot {
    /// The parameter.
    pub id: ParamId,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Offset of its first element in the unit's flat vector, elements.
    pub offset: usize,
    /// Whether AdamW's weight decay applies (parameters of rank >= 2).
    pub decay: bool,
}

impl Slot {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Parameters communicated together: one all-gather and one
/// reduce-scatter each.
#[derive(Clone, Debug, PartialEq)]
pub struct Unit {
    /// The parameters, in flat order.
    pub slots: Vec<Slot>,
    /// Elements of all parameters together (without padding).
    pub len: usize,
    /// Elements per rank: `ceil(len / dp)`; the flat vector is padded to `chunk * dp`.
    pub chunk: usize,
}

/// The part of one parameter that a rank owns.
#[derive(Clone, Debug, PartialEq)]
pub struct Piece {
    /// The parameter.
    pub id: ParamId,
    /// First owned element of the parameter's flat (row-major) view.
    pub start: usize,
    /// One past the last owned element.
    pub end: usize,
    /// Where the piece starts in the owner's chunk, elements.
    pub chunk_offset: usize,
    /// Whether weight decay applies.
    pub decay: bool,
}

impl Piece {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether the piece holds no element (never returned by [`FlatLayout::pieces`]).
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// A parameter as listed by [`param_infos`]: id, shape, weight decay.
pub type ParamInfo = (ParamId, Vec<usize>, bool);

/// Every unit of a model and which chunk of each this rank owns.
#[derive(Clone, Debug, PartialEq)]
pub struct FlatLayout {
    units: Vec<Unit>,
    rank: usize,
    dp: usize,
}

impl FlatLayout {
    /// Lays out `groups` (each a unit's parameters, in order) for rank
    /// `rank` of `dp` DP ranks.
    pub fn new(groups: Vec<Vec<ParamInfo>>, rank: usize, dp: usize) -> Self {
        assert!(rank < dp, "rank {rank} outside a DP group of {dp}");
        let units = groups
            .into_iter()
            .map(|params| {
                let mut len = 0;
                let slots = params
                    .into_iter()
                    .map(|(id, shape, decay)| {
                        let slot = Slot {
                            id,
                            shape,
                            offset: len,
                            decay,
                        };
                        len += slot.numel();
                        slot
                    })
                    .collect();
                Unit {
                    slots,
                    len,
                    chunk: len.div_ceil(dp),
                }
            })
            .collect();
        Self { units, rank, dp }
    }

    /// Splits `params` (visiting order) into units of at most `max_elems`
    /// elements; a parameter larger than that is a unit of its own.
    pub fn buckets(params: Vec<ParamInfo>, max_elems: usize) -> Vec<Vec<ParamInfo>> {
        let mut groups: Vec<Vec<ParamInfo>> = Vec::new();
        let mut size = 0;
        for p in params {
            let n: usize = p.1.iter().product();
            match groups.last_mut() {
                Some(g) if size + n <= max_elems => g.push(p),
                _ => {
                    size = 0;
                    groups.push(vec![p]);
                }
            }
            size += n;
        }
        groups
    }

    /// The units.
    pub fn units(&self) -> &[Unit] {
        &self.units
    }

    /// This rank's index in the DP group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of DP ranks.
    pub fn dp(&self) -> usize {
        self.dp
    }

    /// The pieces of unit `unit` that this rank owns, in chunk order.
    pub fn pieces(&self, unit: usize) -> Vec<Piece> {
        let u = &self.units[unit];
        let (lo, hi) = (self.rank * u.chunk, (self.rank + 1) * u.chunk);
        u.slots
            .iter()
            .filter_map(|s| {
                let start = lo.max(s.offset);
                let end = hi.min(s.offset + s.numel());
                (start < end).then(|| Piece {
                    id: s.id,
                    start: start - s.offset,
                    end: end - s.offset,
                    chunk_offset: start - lo,
                    decay: s.decay,
                })
            })
            .collect()
    }

    /// Elements this rank owns over all units, padding included (the
    /// length of its shard of parameters, gradients or one moment).
    pub fn shard_elems(&self) -> usize {
        self.units.iter().map(|u| u.chunk).sum()
    }

    /// Elements of every parameter together (the unsharded model).
    pub fn total_elems(&self) -> usize {
        self.units.iter().map(|u| u.len).sum()
    }
}

/// Lists the float parameters of `module` in visiting order.
pub fn param_infos<B: Backend, M: Module<B>>(module: &M) -> Vec<ParamInfo> {
    let mut v = Infos(Vec::new());
    module.visit(&mut v);
    v.0
}

/// The parameters of each FSDP unit of `model`, in [`LmUnit::all`] order.
///
/// # Panics
/// If the units do not cover every parameter exactly once (a broken
/// [`LmUnits::visit_unit`]).
pub fn unit_params<B: Backend, M: LmUnits<B>>(model: &M) -> Vec<Vec<ParamInfo>> {
    let units: Vec<Vec<ParamInfo>> = LmUnit::all(model.num_blocks())
        .into_iter()
        .map(|unit| {
            let mut v = Infos(Vec::new());
            model.visit_unit(unit, &mut v);
            v.0
        })
        .collect();
    let covered: usize = units.iter().map(Vec::len).sum();
    let all = param_infos(model).len();
    assert_eq!(
        covered, all,
        "the model's units hold {covered} parameters, the model {all}"
    );
    units
}

/// Collects `(id, shape, rank >= 2)` of every float parameter visited.
pub(crate) struct Infos(pub(crate) Vec<ParamInfo>);

impl<B: Backend> ModuleVisitor<B> for Infos {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.0.push((param.id, param.val().dims().to_vec(), D >= 2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(n: usize, decay: bool) -> ParamInfo {
        (ParamId::new(), vec![n], decay)
    }

    #[test]
    fn every_element_is_owned_by_exactly_one_rank() {
        let groups = vec![
            vec![info(5, true), info(3, false), info(9, true)],
            vec![info(1, false)],
        ];
        for dp in 1..=5 {
            let mut owned = [vec![0u32; 17], vec![0u32; 1]];
            for rank in 0..dp {
                let l = FlatLayout::new(groups.clone(), rank, dp);
                assert_eq!(l.total_elems(), 18);
                for (ui, unit) in l.units().iter().enumerate() {
                    assert_eq!(unit.chunk, unit.len.div_ceil(dp));
                    let mut in_chunk = 0;
                    for p in l.pieces(ui) {
                        assert!(!p.is_empty());
                        assert!(p.chunk_offset + p.len() <= unit.chunk);
                        let slot = unit.slots.iter().find(|s| s.id == p.id).unwrap();
                        assert_eq!(p.decay, slot.decay);
                        assert_eq!(rank * unit.chunk + p.chunk_offset, slot.offset + p.start);
                        for e in p.start..p.end {
                            owned[ui][slot.offset + e] += 1;
                        }
                        in_chunk += p.len();
                    }
                    assert!(in_chunk <= unit.chunk);
                }
            }
            assert!(
                owned.iter().flatten().all(|&c| c == 1),
                "dp {dp}: {owned:?}"
            );
        }
    }

    #[test]
    fn buckets_close_before_overflowing_and_keep_large_params_alone() {
        let sizes = |g: &Vec<Vec<ParamInfo>>| -> Vec<Vec<usize>> {
            g.iter()
                .map(|u| u.iter().map(|p| p.1[0]).collect())
                .collect()
        };
        let params = [4, 4, 3, 20, 1, 1].map(|n| info(n, true)).to_vec();
        assert_eq!(
            sizes(&FlatLayout::buckets(params, 10)),
            vec![vec![4, 4], vec![3], vec![20], vec![1, 1]]
        );
    }
}
