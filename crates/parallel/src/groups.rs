//! Process groups: the tensor-, context-, data- and pipeline-parallel
//! communicators of one rank, split from the world communicator along the
//! [`Mesh`].
//!
//! Megatron-LM's layout (TP innermost, then CP, then DP, then PP; see
//! [`mesh`]):
//!
//! - a **TP group** is `tp` consecutive ranks (one node's GPUs, the
//!   bandwidth-hungry dimension);
//! - a **CP group** is the ranks of one replica and stage with the same TP
//!   index, `tp` apart: the ring that passes K/V blocks around
//!   ([`context`]); its rank is the rank's place in the ring;
//! - a **DP group** is the ranks of one pipeline stage with the same CP
//!   and TP index, `cp * tp` apart; ZeRO shards over it;
//! - a **PP group** is the ranks with the same DP, CP and TP index, one per
//!   stage, `dp * cp * tp` apart;
//! - the **DP x CP group** is the ranks of one stage with the same TP
//!   index (every DP and CP index): they hold the same parameters, so the
//!   gradients are reduced and ZeRO shards over it, as in Megatron-Core
//!   ([`dp_cp_index`]; the DP group itself without context parallelism).
//!
//! [`members`] says who is in a rank's group without any communication
//! (unit-tested against Megatron's documented layouts); [`ProcessGroups`]
//! builds the communicators with [`Communicator::split`], the group index
//! as color and the world rank as key, so a group's ranks are numbered in
//! world order. A group of one rank needs no communication: it is a
//! [`SingleProcess`], and a group equal to the world is the world itself.
//!
//! [`mesh`]: crate::mesh
//! [`context`]: crate::context

use std::sync::Arc;

use crate::comm::{CommError, Communicator, SingleProcess};
use crate::mesh::{Mesh, MeshCoord};

/// One dimension of the mesh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    /// Tensor parallelism (innermost).
    Tp,
    /// Context parallelism (the sequence split over a ring of ranks).
    Cp,
    /// Data parallelism (ZeRO shards over it).
    Dp,
    /// Pipeline parallelism (outermost).
    Pp,
}

impl Dim {
    /// Every dimension, in the order the groups are built.
    pub const ALL: [Dim; 4] = [Dim::Tp, Dim::Cp, Dim::Dp, Dim::Pp];

    /// The dimension's degree in `mesh`.
    pub fn degree(self, mesh: &Mesh) -> usize {
        match self {
            Dim::Tp => mesh.tp,
            Dim::Cp => mesh.cp,
            Dim::Dp => mesh.dp,
            Dim::Pp => mesh.pp,
        }
    }
}

/// The world ranks of `rank`'s group along `dim`, ascending (its own
/// included); the group's rank `i` is `members(..)[i]`.
pub fn members(mesh: &Mesh, dim: Dim, rank: usize) -> Vec<usize> {
    let at = mesh.coord(rank);
    (0..dim.degree(mesh))
        .map(|i| {
            let c = match dim {
                Dim::Tp => MeshCoord { tp: i, ..at },
                Dim::Cp => MeshCoord { cp: i, ..at },
                Dim::Dp => MeshCoord { dp: i, ..at },
                Dim::Pp => MeshCoord { pp: i, ..at },
            };
            mesh.rank(c)
        })
        .collect()
}

/// Which group along `dim` `rank` belongs to: the same number for exactly
/// the ranks of one group, `0..world_size / degree` (the color of the split).
pub fn group_index(mesh: &Mesh, dim: Dim, rank: usize) -> usize {
    let MeshCoord { pp, dp, cp, tp } = mesh.coord(rank);
    match dim {
        Dim::Tp => (pp * mesh.dp + dp) * mesh.cp + cp,
        Dim::Cp => (pp * mesh.dp + dp) * mesh.tp + tp,
        Dim::Dp => (pp * mesh.cp + cp) * mesh.tp + tp,
        Dim::Pp => (dp * mesh.cp + cp) * mesh.tp + tp,
    }
}

/// One rank's communicators: the whole job and its group along each dimension.
#[derive(Clone)]
pub struct ProcessGroups {
    mesh: Mesh,
    world: Arc<dyn Communicator>,
    tp: Arc<dyn Communicator>,
    cp: Arc<dyn Communicator>,
    dp: Arc<dyn Communicator>,
    pp: Arc<dyn Communicator>,
    dp_cp: Arc<dyn Communicator>,
}

/// The DP x CP group of `rank` in `mesh`, numbered `pp * tp + tp_index`:
/// the ranks with the same pipeline stage and TP index share it.
pub fn dp_cp_index(mesh: &Mesh, rank: usize) -> usize {
    let MeshCoord { pp, tp, .. } = mesh.coord(rank);
    pp * mesh.tp + tp
}

impl ProcessGroups {
    /// The groups of a one-rank job (every degree 1).
    pub fn single() -> Self {
        let one: Arc<dyn Communicator> = Arc::new(SingleProcess);
        Self {
            mesh: Mesh {
                dp: 1,
                tp: 1,
                cp: 1,
                pp: 1,
            },
            world: one.clone(),
            tp: one.clone(),
            cp: one.clone(),
            dp: one.clone(),
            pp: one.clone(),
            dp_cp: one,
        }
    }

    /// Splits `world` into the groups of `mesh`. Collective: every rank of
    /// `world` calls it with the same mesh, whose size must be the world's.
    pub fn new(world: Arc<dyn Communicator>, mesh: Mesh) -> Result<Self, CommError> {
        if mesh.world_size() != world.world_size() {
            return Err(CommError::Transport(format!(
                "process groups: the mesh has {} ranks, the communicator {}",
                mesh.world_size(),
                world.world_size()
            )));
        }
        let rank = world.rank();
        let group = |dim: Dim| -> Result<Arc<dyn Communicator>, CommError> {
            match dim.degree(&mesh) {
                1 => Ok(Arc::new(SingleProcess)),
                d if d == world.world_size() => Ok(world.clone()),
                _ => world.split(group_index(&mesh, dim, rank), rank),
            }
        };
        let dp = group(Dim::Dp)?;
        let dp_cp = match mesh.dp * mesh.cp {
            _ if mesh.cp == 1 => dp.clone(),
            n if n == world.world_size() => world.clone(),
            _ => world.split(dp_cp_index(&mesh, rank), rank)?,
        };
        Ok(Self {
            tp: group(Dim::Tp)?,
            cp: group(Dim::Cp)?,
            dp,
            pp: group(Dim::Pp)?,
            dp_cp,
            world,
            mesh,
        })
    }

    /// The mesh the groups were built from.
    pub fn mesh(&self) -> Mesh {
        self.mesh
    }

    /// This rank's coordinates in the mesh.
    pub fn coord(&self) -> MeshCoord {
        self.mesh.coord(self.world.rank())
    }

    /// Every rank of the job.
    pub fn world(&self) -> &Arc<dyn Communicator> {
        &self.world
    }

    /// This rank's group along `dim`.
    pub fn group(&self, dim: Dim) -> &Arc<dyn Communicator> {
        match dim {
            Dim::Tp => &self.tp,
            Dim::Cp => &self.cp,
            Dim::Dp => &self.dp,
            Dim::Pp => &self.pp,
        }
    }

    /// The data-parallel group (ZeRO shards over it).
    pub fn dp(&self) -> &Arc<dyn Communicator> {
        &self.dp
    }

    /// The DP x CP group: the ranks holding the same parameters (this
    /// stage's, this TP block), over which the gradients are reduced and
    /// ZeRO shards; the DP group when `cp` is 1. Its rank is `dp_index *
    /// cp + cp_index`.
    pub fn dp_cp(&self) -> &Arc<dyn Communicator> {
        &self.dp_cp
    }

    /// The tensor-parallel group (the model's layers are split over it).
    pub fn tp(&self) -> &Arc<dyn Communicator> {
        &self.tp
    }

    /// The context-parallel group: the ring of ranks that hold the chunks
    /// of the same sequences, the group's rank being the place in the ring.
    pub fn cp(&self) -> &Arc<dyn Communicator> {
        &self.cp
    }

    /// The pipeline-parallel group: one rank per stage, the group's rank
    /// being the stage.
    pub fn pp(&self) -> &Arc<dyn Communicator> {
        &self.pp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh(tp: usize, dp: usize, pp: usize) -> Mesh {
        Mesh { dp, tp, cp: 1, pp }
    }

    /// Every group along `dim`, as lists of world ranks, in order of their first rank.
    fn groups(m: &Mesh, dim: Dim) -> Vec<Vec<usize>> {
        let mut all: Vec<Vec<usize>> = (0..m.world_size()).map(|r| members(m, dim, r)).collect();
        all.sort();
        all.dedup();
        all
    }

    fn check(m: Mesh, tp: &[&[usize]], dp: &[&[usize]], pp: &[&[usize]]) {
        check_dims(m, &[(Dim::Tp, tp), (Dim::Dp, dp), (Dim::Pp, pp)]);
        let singles: Vec<Vec<usize>> = (0..m.world_size()).map(|r| vec![r]).collect();
        assert_eq!(groups(&m, Dim::Cp), singles, "{m:?} without CP");
    }

    fn check_dims(m: Mesh, dims: &[(Dim, &[&[usize]])]) {
        for &(dim, want) in dims {
            let want: Vec<Vec<usize>> = want.iter().map(|g| g.to_vec()).collect();
            assert_eq!(groups(&m, dim), want, "{m:?} {dim:?}");
            // The color is shared by exactly the members of a group.
            for r in 0..m.world_size() {
                for q in 0..m.world_size() {
                    let same = members(&m, dim, r).contains(&q);
                    assert_eq!(
                        group_index(&m, dim, r) == group_index(&m, dim, q),
                        same,
                        "{m:?} {dim:?} ranks {r} {q}"
                    );
                }
                assert!(group_index(&m, dim, r) < m.world_size() / dim.degree(&m));
            }
        }
    }

    #[test]
    fn tp2_dp2_groups_follow_megatron() {
        check(
            mesh(2, 2, 1),
            &[&[0, 1], &[2, 3]],
            &[&[0, 2], &[1, 3]],
            &[&[0], &[1], &[2], &[3]],
        );
    }

    #[test]
    fn tp2_pp2_groups_follow_megatron() {
        check(
            mesh(2, 1, 2),
            &[&[0, 1], &[2, 3]],
            &[&[0], &[1], &[2], &[3]],
            &[&[0, 2], &[1, 3]],
        );
    }

    #[test]
    fn dp2_pp2_groups_follow_megatron() {
        check(
            mesh(1, 2, 2),
            &[&[0], &[1], &[2], &[3]],
            &[&[0, 1], &[2, 3]],
            &[&[0, 2], &[1, 3]],
        );
    }

    #[test]
    fn tp2_dp2_pp2_groups_follow_megatron() {
        check(
            mesh(2, 2, 2),
            &[&[0, 1], &[2, 3], &[4, 5], &[6, 7]],
            &[&[0, 2], &[1, 3], &[4, 6], &[5, 7]],
            &[&[0, 4], &[1, 5], &[2, 6], &[3, 7]],
        );
    }

    /// The example in the docstring of Megatron-LM's
    /// `megatron/core/parallel_state.py::initialize_model_parallel`:
    /// 16 GPUs, tensor parallel 2, pipeline parallel 4 (so data parallel 2).
    #[test]
    fn megatron_docstring_example_16_gpus_tp2_pp4() {
        check(
            mesh(2, 2, 4),
            &[
                &[0, 1],
                &[2, 3],
                &[4, 5],
                &[6, 7],
                &[8, 9],
                &[10, 11],
                &[12, 13],
                &[14, 15],
            ],
            &[
                &[0, 2],
                &[1, 3],
                &[4, 6],
                &[5, 7],
                &[8, 10],
                &[9, 11],
                &[12, 14],
                &[13, 15],
            ],
            &[
                &[0, 4, 8, 12],
                &[1, 5, 9, 13],
                &[2, 6, 10, 14],
                &[3, 7, 11, 15],
            ],
        );
    }

    /// 8 ranks, tp 2 x cp 2 x dp 2: Megatron-Core's `tp-cp-ep-dp-pp`
    /// order (`parallel_state.py`'s `RankGenerator`) without expert
    /// parallelism.
    #[test]
    fn tp2_cp2_dp2_groups_follow_megatron() {
        let m = Mesh {
            dp: 2,
            tp: 2,
            cp: 2,
            pp: 1,
        };
        check_dims(
            m,
            &[
                (Dim::Tp, &[&[0, 1], &[2, 3], &[4, 5], &[6, 7]]),
                (Dim::Cp, &[&[0, 2], &[1, 3], &[4, 6], &[5, 7]]),
                (Dim::Dp, &[&[0, 4], &[1, 5], &[2, 6], &[3, 7]]),
                (Dim::Pp, &[&[0], &[1], &[2], &[3], &[4], &[5], &[6], &[7]]),
            ],
        );
    }

    /// Every group of every dimension against a plain enumeration: the
    /// ranks (counted in nested loops, PP outermost, TP innermost) whose
    /// other three coordinates are equal, in ring order.
    #[test]
    fn groups_with_cp_equal_a_plain_enumeration() {
        for (dp, tp, cp, pp) in [(1, 1, 4, 1), (2, 1, 2, 2), (1, 2, 2, 2), (3, 2, 2, 1)] {
            let m = Mesh { dp, tp, cp, pp };
            let mut coords = Vec::new();
            for p in 0..pp {
                for d in 0..dp {
                    for c in 0..cp {
                        for t in 0..tp {
                            coords.push([p, d, c, t]);
                        }
                    }
                }
            }
            // The coordinate each dimension varies, in [pp, dp, cp, tp].
            for (dim, axis) in [(Dim::Pp, 0), (Dim::Dp, 1), (Dim::Cp, 2), (Dim::Tp, 3)] {
                let mut want: Vec<Vec<usize>> = (0..coords.len())
                    .map(|r| {
                        (0..coords.len())
                            .filter(|&q| (0..4).all(|i| i == axis || coords[q][i] == coords[r][i]))
                            .collect()
                    })
                    .collect();
                want.sort();
                want.dedup();
                let want: Vec<&[usize]> = want.iter().map(|g| g.as_slice()).collect();
                check_dims(m, &[(dim, &want)]);
            }
            // DP x CP: same stage and TP index, every DP and CP index.
            for r in 0..coords.len() {
                for q in 0..coords.len() {
                    let same = coords[q][0] == coords[r][0] && coords[q][3] == coords[r][3];
                    assert_eq!(
                        dp_cp_index(&m, q) == dp_cp_index(&m, r),
                        same,
                        "{m:?}: ranks {q} and {r}"
                    );
                }
            }
        }
    }

    #[test]
    fn one_rank_groups_are_single_processes() {
        let g = ProcessGroups::single();
        for dim in Dim::ALL {
            assert_eq!(g.group(dim).world_size(), 1);
        }
        let g = ProcessGroups::new(Arc::new(SingleProcess), mesh(1, 1, 1)).unwrap();
        assert_eq!(g.dp().world_size(), 1);
        assert!(ProcessGroups::new(Arc::new(SingleProcess), mesh(2, 1, 1)).is_err());
    }
}
