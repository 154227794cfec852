//! Which blocks each pipeline stage runs.
//!
//! The `n` blocks are cut into `p * v` contiguous runs, one per virtual
//! stage (`v` chunks per stage, 1 unless interleaved); virtual stage
//! `c * p + s` is chunk `c` of stage `s`. The embedding belongs to virtual
//! stage 0 (stage 0), the final norm, head and loss to the last virtual
//! stage (stage `p - 1`). By default the runs are as even as possible, the
//! first `n mod (p v)` one block longer; `--pp-layers` sets them.

use std::ops::Range;

use ferrotron_engine::lm::LmUnit;

/// A split of the blocks that cannot run.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// Fewer blocks than virtual stages.
    #[error("--pp {stages} x --pp-virtual {chunks} = {want} stages need at least as many blocks; the model has {blocks}")]
    TooFewBlocks {
        /// `p`.
        stages: usize,
        /// `v`.
        chunks: usize,
        /// `p * v`.
        want: usize,
        /// Blocks of the model.
        blocks: usize,
    },
    /// `--pp-layers` with another number of entries than virtual stages.
    #[error(
        "--pp-layers has {got} entries; it needs one per stage (--pp x --pp-virtual = {want})"
    )]
    Length {
        /// Entries given.
        got: usize,
        /// `p * v`.
        want: usize,
    },
    /// `--pp-layers` not adding up to the blocks.
    #[error("--pp-layers adds up to {sum} blocks; the model has {blocks}")]
    Sum {
        /// The entries' sum.
        sum: usize,
        /// Blocks of the model.
        blocks: usize,
    },
    /// A stage of no block.
    #[error("--pp-layers entry {index} is 0; every stage needs at least one block")]
    Empty {
        /// The entry, from 0.
        index: usize,
    },
    /// The interleaved schedule's even split does not divide.
    #[error("the interleaved schedule needs the {blocks} blocks to divide into --pp {stages} x --pp-virtual {chunks} equal chunks (or set --pp-layers)")]
    Uneven {
        /// Blocks of the model.
        blocks: usize,
        /// `p`.
        stages: usize,
        /// `v`.
        chunks: usize,
    },
}

/// The blocks of every virtual stage of a pipeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageLayout {
    stages: usize,
    chunks: usize,
    /// Blocks of virtual stage `w`, `runs[w]`.
    runs: Vec<Range<usize>>,
}

impl StageLayout {
    /// The layout of `blocks` blocks over `stages` stages of `chunks`
    /// chunks: `layers` (blocks per virtual stage, in order) when given,
    /// else as even as possible; `interleaved` asks the even split to be
    /// exact. `stages` and `chunks` are at least 1.
    pub fn new(
        blocks: usize,
        stages: usize,
        chunks: usize,
        layers: Option<&[usize]>,
        interleaved: bool,
    ) -> Result<Self, LayoutError> {
        let want = stages * chunks;
        let sizes = match layers {
            Some(given) => {
                if given.len() != want {
                    return Err(LayoutError::Length {
                        got: given.len(),
                        want,
                    });
                }
                if let Some(index) = given.iter().position(|&n| n == 0) {
                    return Err(LayoutError::Empty { index });
                }
                let sum = given.iter().sum();
                if sum != blocks {
                    return Err(LayoutError::Sum { sum, blocks });
                }
                given.to_vec()
            }
            None => {
                if blocks < want {
                    return Err(LayoutError::TooFewBlocks {
                        stages,
                        chunks,
                        want,
                        blocks,
                    });
                }
                if interleaved && !blocks.is_multiple_of(want) {
                    return Err(LayoutError::Uneven {
                        blocks,
                        stages,
                        chunks,
                    });
                }
                (0..want)
                    .map(|w| blocks / want + usize::from(w < blocks % want))
                    .collect()
            }
        };
        let mut at = 0;
        let runs = sizes
            .into_iter()
            .map(|n| {
                at += n;
                at - n..at
            })
            .collect();
        Ok(Self {
            stages,
            chunks,
            runs,
        })
    }

    /// Stages `p`.
    pub fn stages(&self) -> usize {
        self.stages
    }

    /// Chunks `v` per stage.
    pub fn chunks(&self) -> usize {
        self.chunks
    }

    /// Whether virtual stage `w` computes the loss (it is the last).
    pub fn is_last(&self, w: usize) -> bool {
        w + 1 == self.runs.len()
    }

    /// The blocks virtual stage `w` runs.
    pub fn blocks(&self, w: usize) -> Range<usize> {
        self.runs[w].clone()
    }

    /// Blocks per virtual stage, in order (what `--pp-layers` would say).
    pub fn sizes(&self) -> Vec<usize> {
        self.runs.iter().map(ExactSizeIterator::len).collect()
    }

    /// The stage that holds `unit`.
    pub fn owner(&self, unit: LmUnit) -> usize {
        match unit {
            LmUnit::Embedding => 0,
            LmUnit::Head => self.stages - 1,
            LmUnit::Block(i) => {
                let w = self
                    .runs
                    .iter()
                    .position(|r| r.contains(&i))
                    .expect("every block belongs to a virtual stage");
                w % self.stages
            }
        }
    }

    /// The units stage `stage` owns, in forward order (the last stage also
    /// keeps a copy of a tied embedding, which stage 0 owns).
    pub fn units(&self, stage: usize) -> Vec<LmUnit> {
        let blocks = self.runs.last().map_or(0, |r| r.end);
        LmUnit::all(blocks)
            .into_iter()
            .filter(|&u| self.owner(u) == stage)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_split_gives_the_first_stages_the_extra_blocks() {
        let l = StageLayout::new(7, 3, 1, None, false).unwrap();
        assert_eq!(l.sizes(), [3, 2, 2]);
        assert_eq!(l.blocks(1), 3..5);
        assert_eq!(l.owner(LmUnit::Block(6)), 2);
        assert_eq!(l.owner(LmUnit::Embedding), 0);
        assert_eq!(l.owner(LmUnit::Head), 2);
        assert_eq!(l.units(1), [LmUnit::Block(3), LmUnit::Block(4)]);
        let last = [LmUnit::Block(5), LmUnit::Block(6), LmUnit::Head];
        assert_eq!(l.units(2), last);
    }

    #[test]
    fn interleaved_chunks_wrap_around_the_stages() {
        let l = StageLayout::new(8, 2, 2, None, true).unwrap();
        assert_eq!(l.sizes(), [2, 2, 2, 2]);
        // Virtual stages 0..4 are stage 0, 1, 0, 1.
        let owners: Vec<usize> = (0..8).map(|i| l.owner(LmUnit::Block(i))).collect();
        assert_eq!(owners, [0, 0, 1, 1, 0, 0, 1, 1]);
        assert!(l.is_last(3));
    }

    #[test]
    fn given_layers_are_used_as_they_are() {
        let l = StageLayout::new(6, 2, 1, Some(&[4, 2]), false).unwrap();
        assert_eq!(l.blocks(0), 0..4);
        assert_eq!(l.blocks(1), 4..6);
    }

    #[test]
    fn bad_splits_are_refused_with_what_is_wrong() {
        assert_eq!(
            StageLayout::new(2, 4, 1, None, false),
            Err(LayoutError::TooFewBlocks {
                stages: 4,
                chunks: 1,
                want: 4,
                blocks: 2
            })
        );
        assert_eq!(
            StageLayout::new(6, 2, 1, Some(&[3, 2, 1]), false),
            Err(LayoutError::Length { got: 3, want: 2 })
        );
        assert_eq!(
            StageLayout::new(6, 2, 1, Some(&[3, 2]), false),
            Err(LayoutError::Sum { sum: 5, blocks: 6 })
        );
        assert_eq!(
            StageLayout::new(6, 2, 1, Some(&[6, 0]), false),
            Err(LayoutError::Empty { index: 1 })
        );
        assert_eq!(
            StageLayout::new(6, 2, 2, None, true),
            Err(LayoutError::Uneven {
                blocks: 6,
                stages: 2,
                chunks: 2
            })
        );
    }
}
