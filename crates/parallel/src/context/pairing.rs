//! The ring schedule as data: at step `t` rank `r` holds the K/V of rank
//! `(r - t) mod cp` (blocks travel to the next rank each step), and which
//! of its queries meet which of those keys follows from the chunks alone.
//!
//! Rank `r` holds query chunks `r` and `2cp-1-r`; the K/V of rank `s` are
//! chunks `s` and `2cp-1-s`. Chunk `a` sees chunk `b` entirely when
//! `b < a`, causally when `b == a`, not at all when `b > a`. So:
//!
//! - `s == r` ([`Pairing::Diagonal`]): all queries against all keys, under
//!   the causal mask on global positions (the first query chunk does not
//!   see the second key chunk, which the kernel's row blocks skip);
//! - `s < r` ([`Pairing::FirstKeys`]): chunk `s` precedes both query
//!   chunks and chunk `2cp-1-s` follows both: all queries against the
//!   first key chunk, unmasked;
//! - `s > r` ([`Pairing::LastQueries`]): both key chunks lie between the
//!   query chunks: the second query chunk against all keys, unmasked.
//!
//! The chunk pairs left out are exactly those entirely masked, and every
//! step but the diagonal costs `2 c x c` scores (`c` the chunk length), on
//! every rank.

use std::ops::Range;

/// Which of a rank's queries meet which keys of the block it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pairing {
    /// Its own K/V: every query, every key, causally masked.
    Diagonal,
    /// An earlier rank's K/V: every query against the first key chunk.
    FirstKeys,
    /// A later rank's K/V: the second query chunk against every key.
    LastQueries,
}

impl Pairing {
    /// What rank `rank` computes with the K/V of rank `source`.
    pub fn of(rank: usize, source: usize) -> Self {
        match source.cmp(&rank) {
            std::cmp::Ordering::Equal => Pairing::Diagonal,
            std::cmp::Ordering::Less => Pairing::FirstKeys,
            std::cmp::Ordering::Greater => Pairing::LastQueries,
        }
    }

    /// The local query rows `0..2c` taking part, for chunks of `c` tokens.
    pub fn query_rows(self, c: usize) -> Range<usize> {
        match self {
            Pairing::LastQueries => c..2 * c,
            _ => 0..2 * c,
        }
    }

    /// The rows `0..2c` of the held K/V block taking part.
    pub fn key_rows(self, c: usize) -> Range<usize> {
        match self {
            Pairing::FirstKeys => 0..c,
            _ => 0..2 * c,
        }
    }
}

/// The rank whose K/V rank `rank` holds at step `step` of a ring of `cp`.
pub fn source(rank: usize, step: usize, cp: usize) -> usize {
    (rank + cp - step % cp) % cp
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::context::ChunkLayout;

    /// Over a whole ring, the (query position, key position) pairs each
    /// rank computes are exactly the causal pairs of its queries, each
    /// once, and no entirely masked chunk pair is ever formed.
    #[test]
    fn the_ring_covers_every_causal_pair_once_and_skips_masked_chunks() {
        for cp in 1..=5 {
            let l = ChunkLayout::new(4 * cp, cp).unwrap();
            let c = l.chunk_len();
            let mut work = Vec::new();
            for r in 0..cp {
                let queries = l.positions(r);
                let mut seen = BTreeSet::new();
                let mut scores = 0;
                let sources: Vec<usize> = (0..cp).map(|t| source(r, t, cp)).collect();
                assert_eq!(sources.iter().collect::<BTreeSet<_>>().len(), cp);
                assert_eq!(sources[0], r, "a rank starts with its own K/V");
                for s in sources {
                    let p = Pairing::of(r, s);
                    let keys = l.positions(s);
                    for i in p.query_rows(c) {
                        let row = p.key_rows(c).filter(|&j| keys[j] <= queries[i]).count();
                        assert!(row > 0, "cp {cp} r {r} s {s}: query {i} sees nothing");
                        for j in p.key_rows(c) {
                            if keys[j] <= queries[i] {
                                assert!(seen.insert((queries[i], keys[j])), "twice");
                            }
                        }
                    }
                    if p != Pairing::Diagonal {
                        // Off the diagonal nothing is masked.
                        assert_eq!(
                            p.query_rows(c).len() * p.key_rows(c).len(),
                            p.query_rows(c)
                                .map(|i| p.key_rows(c).filter(|&j| keys[j] <= queries[i]).count())
                                .sum::<usize>(),
                            "cp {cp} r {r} s {s}"
                        );
                    }
                    scores += p.query_rows(c).len() * p.key_rows(c).len();
                }
                let want: BTreeSet<(usize, usize)> = queries
                    .iter()
                    .flat_map(|&q| (0..=q).map(move |k| (q, k)))
                    .collect();
                assert_eq!(seen, want, "cp {cp} rank {r}");
                work.push(scores);
            }
            assert!(work.iter().all(|&w| w == work[0]), "cp {cp}: {work:?}");
        }
    }

    #[test]
    fn blocks_travel_to_the_next_rank() {
        // At step t + 1, rank r holds what rank r - 1 held at step t.
        for cp in 1..=4 {
            for t in 0..cp {
                for r in 0..cp {
                    assert_eq!(source(r, t + 1, cp), source((r + cp - 1) % cp, t, cp));
                }
            }
        }
    }
}
