//! The device mesh: how the ranks of a job are split among data (DP),
//! context (CP), tensor (TP) and pipeline (PP) parallelism.
//!
//! Ranks are laid out in Megatron-LM order: TP innermost (neighbouring
//! ranks, so on one node), then CP, then DP, then PP outermost:
//!
//! ```text
//! rank = ((pp_index * dp + dp_index) * cp + cp_index) * tp + tp_index
//! ```
//!
//! With `cp = 1` this is `pp_index * (dp * tp) + dp_index * tp + tp_index`.

/// A mesh that does not fit the job.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    /// A degree of zero.
    #[error("--{flag} must be positive, got 0")]
    Zero {
        /// `dp`, `tp`, `cp` or `pp`.
        flag: &'static str,
    },
    /// dp x tp x cp x pp differs from the number of ranks.
    #[error(
        "{} = {product} must equal the world size {world_size}",
        degrees(&[("dp", *dp), ("tp", *tp), ("cp", *cp), ("pp", *pp)])
    )]
    WorldSize {
        /// Data-parallel degree.
        dp: usize,
        /// Tensor-parallel degree.
        tp: usize,
        /// Context-parallel degree.
        cp: usize,
        /// Pipeline-parallel degree.
        pp: usize,
        /// Their product.
        product: usize,
        /// Ranks in the job.
        world_size: usize,
    },
    /// The world size is not divisible by tp x cp x pp (when dp is left to be inferred).
    #[error(
        "the world size {world_size} is not divisible by {}",
        degrees(&[("tp", *tp), ("cp", *cp), ("pp", *pp)])
    )]
    NotDivisible {
        /// Ranks in the job.
        world_size: usize,
        /// Tensor-parallel degree.
        tp: usize,
        /// Context-parallel degree.
        cp: usize,
        /// Pipeline-parallel degree.
        pp: usize,
    },
}

/// `--dp 2 x --tp 1 x --pp 1`: the degrees as flags, `cp` named only when
/// it is not 1 (a job without context parallelism reads as it always did).
fn degrees(named: &[(&str, usize)]) -> String {
    named
        .iter()
        .filter(|&&(flag, v)| flag != "cp" || v != 1)
        .map(|(flag, v)| format!("--{flag} {v}"))
        .collect::<Vec<_>>()
        .join(" x ")
}

/// Parallel degrees of a job; `dp * tp * cp * pp` is the world size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mesh {
    /// Data-parallel degree (replicas, each on its own slice of the batch).
    pub dp: usize,
    /// Tensor-parallel degree (innermost).
    pub tp: usize,
    /// Context-parallel degree (each sequence split over `cp` ranks; next
    /// to TP).
    pub cp: usize,
    /// Pipeline-parallel degree (outermost).
    pub pp: usize,
}

/// A rank's coordinates in the mesh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MeshCoord {
    /// Pipeline stage, `0..pp`.
    pub pp: usize,
    /// Data-parallel replica, `0..dp`.
    pub dp: usize,
    /// Context-parallel rank, `0..cp` (which chunks of the sequence).
    pub cp: usize,
    /// Tensor-parallel shard, `0..tp`.
    pub tp: usize,
}

impl Mesh {
    /// The mesh for `world_size` ranks without context parallelism
    /// (`cp = 1`); `dp = None` takes `world_size / (tp * pp)`. Checks the
    /// degrees and their product.
    pub fn new(
        dp: Option<usize>,
        tp: usize,
        pp: usize,
        world_size: usize,
    ) -> Result<Self, MeshError> {
        Self::with_cp(dp, tp, 1, pp, world_size)
    }

    /// The mesh for `world_size` ranks with context-parallel degree `cp`;
    /// `dp = None` takes `world_size / (tp * cp * pp)`. Checks the degrees
    /// and their product.
    pub fn with_cp(
        dp: Option<usize>,
        tp: usize,
        cp: usize,
        pp: usize,
        world_size: usize,
    ) -> Result<Self, MeshError> {
        for (flag, v) in [("dp", dp.unwrap_or(1)), ("tp", tp), ("cp", cp), ("pp", pp)] {
            if v == 0 {
                return Err(MeshError::Zero { flag });
            }
        }
        let dp = match dp {
            Some(dp) => dp,
            None if world_size.is_multiple_of(tp * cp * pp) => world_size / (tp * cp * pp),
            None => {
                return Err(MeshError::NotDivisible {
                    world_size,
                    tp,
                    cp,
                    pp,
                })
            }
        };
        let mesh = Self { dp, tp, cp, pp };
        if mesh.world_size() != world_size {
            return Err(MeshError::WorldSize {
                dp,
                tp,
                cp,
                pp,
                product: mesh.world_size(),
                world_size,
            });
        }
        Ok(mesh)
    }

    /// Number of ranks, `dp * tp * cp * pp`.
    pub fn world_size(&self) -> usize {
        self.dp * self.tp * self.cp * self.pp
    }

    /// Coordinates of `rank` (Megatron order: TP innermost, then CP, then
    /// DP, then PP).
    pub fn coord(&self, rank: usize) -> MeshCoord {
        MeshCoord {
            tp: rank % self.tp,
            cp: (rank / self.tp) % self.cp,
            dp: (rank / (self.tp * self.cp)) % self.dp,
            pp: rank / (self.tp * self.cp * self.dp),
        }
    }

    /// The rank at coordinates `c` (the inverse of [`Mesh::coord`]).
    pub fn rank(&self, c: MeshCoord) -> usize {
        ((c.pp * self.dp + c.dp) * self.cp + c.cp) * self.tp + c.tp
    }

    /// One line for the start-up log.
    pub fn describe(&self) -> String {
        let (cp, order) = if self.cp == 1 {
            (String::new(), "TP innermost, then DP, then PP")
        } else {
            (
                format!(" x cp {}", self.cp),
                "TP innermost, then CP, then DP, then PP",
            )
        };
        format!(
            "mesh: dp {} x tp {}{cp} x pp {} = {} ranks (Megatron order: {order})",
            self.dp,
            self.tp,
            self.pp,
            self.world_size()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh(dp: usize, tp: usize, cp: usize, pp: usize) -> Mesh {
        Mesh { dp, tp, cp, pp }
    }

    #[test]
    fn dp_is_inferred_and_the_product_must_equal_the_world_size() {
        assert_eq!(Mesh::new(None, 1, 1, 4).unwrap().dp, 4);
        assert_eq!(Mesh::new(Some(2), 1, 1, 2).unwrap().world_size(), 2);
        let e = Mesh::new(Some(2), 1, 1, 4).unwrap_err().to_string();
        assert_eq!(
            e,
            "--dp 2 x --tp 1 x --pp 1 = 2 must equal the world size 4"
        );
        assert!(Mesh::new(Some(0), 1, 1, 1).is_err());
        let e = Mesh::with_cp(Some(2), 1, 2, 1, 8).unwrap_err().to_string();
        assert_eq!(
            e,
            "--dp 2 x --tp 1 x --cp 2 x --pp 1 = 4 must equal the world size 8"
        );
        let e = Mesh::with_cp(None, 1, 0, 1, 8).unwrap_err().to_string();
        assert_eq!(e, "--cp must be positive, got 0");
    }

    #[test]
    fn dp_is_what_tp_cp_and_pp_leave() {
        let m = Mesh::new(None, 2, 1, 4).unwrap();
        assert_eq!(m, mesh(2, 2, 1, 1));
        let m = Mesh::new(None, 2, 2, 8).unwrap();
        assert_eq!(m, mesh(2, 2, 1, 2));
        let e = Mesh::new(None, 1, 3, 4).unwrap_err().to_string();
        assert_eq!(e, "the world size 4 is not divisible by --tp 1 x --pp 3");
        let m = Mesh::with_cp(None, 2, 2, 1, 16).unwrap();
        assert_eq!(m, mesh(4, 2, 2, 1));
        let e = Mesh::with_cp(None, 2, 3, 1, 8).unwrap_err().to_string();
        assert_eq!(
            e,
            "the world size 8 is not divisible by --tp 2 x --cp 3 x --pp 1"
        );
    }

    #[test]
    fn ranks_are_laid_out_tp_innermost_then_dp_then_pp() {
        let m = mesh(2, 2, 1, 2);
        let c = |pp, dp, tp| MeshCoord { pp, dp, cp: 0, tp };
        assert_eq!(m.coord(0), c(0, 0, 0));
        assert_eq!(m.coord(1), c(0, 0, 1));
        assert_eq!(m.coord(2), c(0, 1, 0));
        assert_eq!(m.coord(5), c(1, 0, 1));
        assert_eq!(m.coord(7), c(1, 1, 1));
        for r in 0..8 {
            assert_eq!(m.rank(m.coord(r)), r);
        }
    }

    /// Against a plain enumeration: nested loops in Megatron's order (PP
    /// outermost, then DP, then CP, TP innermost) count the ranks.
    #[test]
    fn ranks_are_laid_out_tp_then_cp_then_dp_then_pp() {
        for m in [
            mesh(2, 2, 2, 2),
            mesh(1, 1, 4, 1),
            mesh(3, 2, 2, 1),
            mesh(1, 2, 3, 2),
        ] {
            let mut rank = 0;
            for pp in 0..m.pp {
                for dp in 0..m.dp {
                    for cp in 0..m.cp {
                        for tp in 0..m.tp {
                            let c = MeshCoord { pp, dp, cp, tp };
                            assert_eq!(m.coord(rank), c, "{m:?} rank {rank}");
                            assert_eq!(m.rank(c), rank, "{m:?} {c:?}");
                            rank += 1;
                        }
                    }
                }
            }
            assert_eq!(rank, m.world_size());
        }
    }

    #[test]
    fn the_description_names_cp_only_when_it_is_used() {
        assert_eq!(
            mesh(2, 2, 1, 1).describe(),
            "mesh: dp 2 x tp 2 x pp 1 = 4 ranks (Megatron order: TP innermost, then DP, then PP)"
        );
        assert_eq!(
            mesh(1, 2, 2, 2).describe(),
            "mesh: dp 1 x tp 2 x cp 2 x pp 2 = 8 ranks \
             (Megatron order: TP innermost, then CP, then DP, then PP)"
        );
    }
}
