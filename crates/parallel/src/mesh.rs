//! The device mesh: how the ranks of a job are split among data (DP),
//! tensor (TP) and pipeline (PP) parallelism.
//!
//! Ranks are laid out in Megatron-LM order: TP innermost (neighbouring
//! ranks, so on one node), then DP, then PP outermost:
//!
//! ```text
//! rank = pp_index * (dp * tp) + dp_index * tp + tp_index
//! ```

/// A mesh that does not fit the job.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    /// A degree of zero.
    #[error("--{flag} must be positive, got 0")]
    Zero {
        /// `dp`, `tp` or `pp`.
        flag: &'static str,
    },
    /// dp x tp x pp differs from the number of ranks.
    #[error(
        "--dp {dp} x --tp {tp} x --pp {pp} = {product} must equal the world size {world_size}"
    )]
    WorldSize {
        /// Data-parallel degree.
        dp: usize,
        /// Tensor-parallel degree.
        tp: usize,
        /// Pipeline-parallel degree.
        pp: usize,
        /// Their product.
        product: usize,
        /// Ranks in the job.
        world_size: usize,
    },
    /// The world size is not divisible by tp x pp (when dp is left to be inferred).
    #[error("the world size {world_size} is not divisible by --tp {tp} x --pp {pp}")]
    NotDivisible {
        /// Ranks in the job.
        world_size: usize,
        /// Tensor-parallel degree.
        tp: usize,
        /// Pipeline-parallel degree.
        pp: usize,
    },
}

/// Parallel degrees of a job; `dp * tp * pp` is the world size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mesh {
    /// Data-parallel degree (replicas, each on its own slice of the batch).
    pub dp: usize,
    /// Tensor-parallel degree (innermost).
    pub tp: usize,
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
    /// Tensor-parallel shard, `0..tp`.
    pub tp: usize,
}

impl Mesh {
    /// The mesh for `world_size` ranks; `dp = None` takes `world_size / (tp * pp)`.
    /// Checks the degrees and their product.
    pub fn new(
        dp: Option<usize>,
        tp: usize,
        pp: usize,
        world_size: usize,
    ) -> Result<Self, MeshError> {
        for (flag, v) in [("dp", dp.unwrap_or(1)), ("tp", tp), ("pp", pp)] {
            if v == 0 {
                return Err(MeshError::Zero { flag });
            }
        }
        let dp = match dp {
            Some(dp) => dp,
            None if world_size.is_multiple_of(tp * pp) => world_size / (tp * pp),
            None => return Err(MeshError::NotDivisible { world_size, tp, pp }),
        };
        if dp * tp * pp != world_size {
            return Err(MeshError::WorldSize {
                dp,
                tp,
                pp,
                product: dp * tp * pp,
                world_size,
            });
        }
        Ok(Self { dp, tp, pp })
    }

    /// Number of ranks, `dp * tp * pp`.
    pub fn world_size(&self) -> usize {
        self.dp * self.tp * self.pp
    }

    /// Coordinates of `rank` (Megatron order: TP innermost, then DP, then PP).
    pub fn coord(&self, rank: usize) -> MeshCoord {
        MeshCoord {
            tp: rank % self.tp,
            dp: (rank / self.tp) % self.dp,
            pp: rank / (self.tp * self.dp),
        }
    }

    /// The rank at coordinates `c` (the inverse of [`Mesh::coord`]).
    pub fn rank(&self, c: MeshCoord) -> usize {
        c.pp * (self.dp * self.tp) + c.dp * self.tp + c.tp
    }

    /// One line for the start-up log.
    pub fn describe(&self) -> String {
        format!(
            "mesh: dp {} x tp {} x pp {} = {} ranks (Megatron order: TP innermost, then DP, then PP)",
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

    #[test]
    fn dp_is_inferred_and_the_product_must_equal_the_world_size() {
        assert_eq!(Mesh::new(None, 1, 1, 4).unwrap().dp, 4);
        assert_eq!(Mesh::new(Some(2), 1, 1, 2).unwrap().world_size(), 2);
        let e = Mesh::new(Some(2), 1, 1, 4).unwrap_err().to_string();
        assert!(e.contains("must equal the world size 4"), "{e}");
        assert!(Mesh::new(Some(0), 1, 1, 1).is_err());
    }

    #[test]
    fn dp_is_what_tp_and_pp_leave() {
        let m = Mesh::new(None, 2, 1, 4).unwrap();
        assert_eq!((m.dp, m.tp, m.pp), (2, 2, 1));
        let m = Mesh::new(None, 2, 2, 8).unwrap();
        assert_eq!((m.dp, m.tp, m.pp), (2, 2, 2));
        let e = Mesh::new(None, 1, 3, 4).unwrap_err().to_string();
        assert!(e.contains("not divisible by --tp 1 x --pp 3"), "{e}");
    }

    #[test]
    fn ranks_are_laid_out_tp_innermost_then_dp_then_pp() {
        let m = Mesh {
            dp: 2,
            tp: 2,
            pp: 2,
        };
        let c = |pp, dp, tp| MeshCoord { pp, dp, tp };
        assert_eq!(m.coord(0), c(0, 0, 0));
        assert_eq!(m.coord(1), c(0, 0, 1));
        assert_eq!(m.coord(2), c(0, 1, 0));
        assert_eq!(m.coord(5), c(1, 0, 1));
        assert_eq!(m.coord(7), c(1, 1, 1));
        for r in 0..8 {
            assert_eq!(m.rank(m.coord(r)), r);
        }
    }
}
