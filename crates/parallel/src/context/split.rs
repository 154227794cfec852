//! The load-balanced split of a sequence over a context-parallel ring.
//!
//! A sequence of `seq` tokens is cut into `2 * cp` chunks of
//! `seq / (2 * cp)` tokens; rank `r` holds chunks `r` and `2cp - 1 - r`, in
//! that order. Under a causal mask a query's work grows with its position,
//! so pairing an early chunk with a late one gives every rank the same
//! work (`cp = 2`: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2).
//! Every per-token array (token ids, targets, the goldfish mask, the
//! positions) is split the same way; each rank's tokens keep their
//! *global* positions ([`ChunkLayout::positions`]), from which RoPE's
//! angles, learned positions, ALiBi's distances and the causal mask are
//! computed.

/// A sequence length that the ring cannot split.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SplitError {
    /// A context-parallel degree of zero.
    #[error("the context-parallel degree must be positive, got 0")]
    ZeroCp,
    /// `seq` is not a positive multiple of `2 * cp`.
    #[error("the sequence length {seq} is not a positive multiple of 2 x cp = {chunks}")]
    NotDivisible {
        /// Tokens per sequence.
        seq: usize,
        /// `2 * cp`, the number of chunks.
        chunks: usize,
    },
}

/// How sequences of `seq` tokens are cut over a ring of `cp` ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkLayout {
    seq: usize,
    cp: usize,
}

impl ChunkLayout {
    /// The layout of `seq`-token sequences over `cp` ranks; `seq` must be
    /// a positive multiple of `2 * cp`.
    pub fn new(seq: usize, cp: usize) -> Result<Self, SplitError> {
        if cp == 0 {
            return Err(SplitError::ZeroCp);
        }
        if seq == 0 || !seq.is_multiple_of(2 * cp) {
            return Err(SplitError::NotDivisible {
                seq,
                chunks: 2 * cp,
            });
        }
        Ok(Self { seq, cp })
    }

    /// Tokens per sequence.
    pub fn seq(&self) -> usize {
        self.seq
    }

    /// Ranks in the ring.
    pub fn cp(&self) -> usize {
        self.cp
    }

    /// Tokens per chunk, `seq / (2 * cp)`.
    pub fn chunk_len(&self) -> usize {
        self.seq / (2 * self.cp)
    }

    /// Tokens per sequence on one rank, `seq / cp` (two chunks).
    pub fn local_len(&self) -> usize {
        2 * self.chunk_len()
    }

    /// The chunks rank `rank` holds, in its local order: `[rank, 2cp - 1 - rank]`.
    pub fn chunks(&self, rank: usize) -> [usize; 2] {
        assert!(rank < self.cp, "rank {rank} of a ring of {}", self.cp);
        [rank, 2 * self.cp - 1 - rank]
    }

    /// The global positions of rank `rank`'s tokens, in its local order
    /// (`local_len` of them, two ascending runs).
    pub fn positions(&self, rank: usize) -> Vec<usize> {
        let c = self.chunk_len();
        self.chunks(rank)
            .into_iter()
            .flat_map(|chunk| chunk * c..(chunk + 1) * c)
            .collect()
    }

    /// Rank `rank`'s part of `values` `[rows, seq, width]` (row-major, any
    /// number of sequences `rows`, `width` values per token):
    /// `[rows, local_len, width]`, each row's tokens in local order.
    pub fn split<T: Copy>(&self, values: &[T], width: usize, rank: usize) -> Vec<T> {
        let rows = self.rows(values.len(), self.seq, width);
        let positions = self.positions(rank);
        let mut out = Vec::with_capacity(rows * positions.len() * width);
        for row in values.chunks(self.seq * width).take(rows) {
            for &p in &positions {
                out.extend_from_slice(&row[p * width..(p + 1) * width]);
            }
        }
        out
    }

    /// The inverse of [`ChunkLayout::split`]: from every rank's part
    /// (`parts[r]` `[rows, local_len, width]`, all `cp` of them) the whole
    /// `[rows, seq, width]`.
    pub fn unsplit<T: Copy + Default>(&self, parts: &[Vec<T>], width: usize) -> Vec<T> {
        assert_eq!(parts.len(), self.cp, "one part per rank of the ring");
        let rows = self.rows(parts[0].len(), self.local_len(), width);
        let mut out = vec![T::default(); rows * self.seq * width];
        for (rank, part) in parts.iter().enumerate() {
            assert_eq!(part.len(), parts[0].len(), "rank {rank}'s part");
            let positions = self.positions(rank);
            for (row, local) in part.chunks(self.local_len() * width).enumerate() {
                let whole = &mut out[row * self.seq * width..(row + 1) * self.seq * width];
                for (i, &p) in positions.iter().enumerate() {
                    whole[p * width..(p + 1) * width]
                        .copy_from_slice(&local[i * width..(i + 1) * width]);
                }
            }
        }
        out
    }

    /// The number of sequences in `len` values of `tokens` tokens of `width`.
    fn rows(&self, len: usize, tokens: usize, width: usize) -> usize {
        assert!(
            width > 0 && len.is_multiple_of(tokens * width),
            "{len} values are not whole sequences of {tokens} tokens x {width}"
        );
        len / (tokens * width)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_lengths_are_refused_with_the_numbers() {
        assert_eq!(ChunkLayout::new(8, 0), Err(SplitError::ZeroCp));
        let e = ChunkLayout::new(12, 4).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the sequence length 12 is not a positive multiple of 2 x cp = 8"
        );
        assert!(ChunkLayout::new(0, 1).is_err());
        assert!(ChunkLayout::new(2, 1).is_ok());
    }

    #[test]
    fn rank_r_holds_chunks_r_and_2cp_minus_1_minus_r() {
        let l = ChunkLayout::new(16, 2).unwrap();
        assert_eq!((l.chunk_len(), l.local_len()), (4, 8));
        assert_eq!(l.chunks(0), [0, 3]);
        assert_eq!(l.chunks(1), [1, 2]);
        assert_eq!(l.positions(0), [0, 1, 2, 3, 12, 13, 14, 15]);
        assert_eq!(l.positions(1), [4, 5, 6, 7, 8, 9, 10, 11]);
    }

    /// Against a plain implementation: token `t` belongs to chunk
    /// `t / chunk_len`, whose owner is `min(chunk, 2cp - 1 - chunk)`;
    /// each rank lists its tokens by (first or second chunk, position).
    #[test]
    fn split_and_unsplit_match_a_plain_assignment_of_tokens() {
        for (seq, cp, width, rows) in [(8, 1, 1, 1), (16, 2, 3, 2), (24, 3, 1, 3), (32, 4, 2, 1)] {
            let l = ChunkLayout::new(seq, cp).unwrap();
            let c = seq / (2 * cp);
            let values: Vec<u32> = (0..(rows * seq * width) as u32).collect();
            let mut parts = Vec::new();
            for rank in 0..cp {
                let mut mine: Vec<usize> = (0..seq)
                    .filter(|t| (t / c).min(2 * cp - 1 - t / c) == rank)
                    .collect();
                mine.sort_by_key(|t| (t / c != rank, *t));
                assert_eq!(l.positions(rank), mine, "seq {seq} cp {cp} rank {rank}");
                let want: Vec<u32> = (0..rows)
                    .flat_map(|row| {
                        mine.iter().flat_map(move |&t| {
                            (0..width).map(move |w| ((row * seq + t) * width + w) as u32)
                        })
                    })
                    .collect();
                let part = l.split(&values, width, rank);
                assert_eq!(part, want, "seq {seq} cp {cp} rank {rank}");
                parts.push(part);
            }
            assert_eq!(l.unsplit(&parts, width), values, "seq {seq} cp {cp}");
        }
    }

    /// Each rank's causal work (query-key pairs a causal mask keeps) is
    /// the same: the point of pairing chunk `r` with `2cp - 1 - r`.
    #[test]
    fn every_rank_has_the_same_causal_work() {
        let l = ChunkLayout::new(64, 4).unwrap();
        let work: Vec<usize> = (0..4)
            .map(|r| l.positions(r).iter().map(|p| p + 1).sum())
            .collect();
        assert!(work.iter().all(|&w| w == work[0]), "{work:?}");
    }
}
