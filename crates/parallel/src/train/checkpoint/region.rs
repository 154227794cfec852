//! Where a block of a sharded checkpoint lies in its tensor: a box of the
//! global tensor (offsets and shape per dimension: a TP block) and a
//! contiguous range of that box's row-major elements (a ZeRO piece; the
//! whole box without ZeRO). Every layout's share of a tensor is one
//! [`Region`], so a reader of any layout finds what it needs by overlap.
//!
//! A range of a box stays a range when the box is clipped to the tensor
//! (vocabulary padding cut off): the elements of a box are ordered
//! lexicographically by their indices, and the elements of the clipped box
//! lying between two indices are consecutive in the clipped box's order.

use serde::{Deserialize, Serialize};

/// A box of a tensor and a range of its row-major elements.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Region {
    /// Index of the box's first element in each dimension of the tensor.
    pub offsets: Vec<usize>,
    /// Size of the box in each dimension (at least one dimension).
    #[serde(rename = "box")]
    pub shape: Vec<usize>,
    /// First element of the range, in the box's row-major order.
    pub start: usize,
    /// One past the range's last element.
    pub end: usize,
}

/// One row segment of a region: `len` consecutive elements along the last
/// dimension, from the global index `at`, at position `pos` of the
/// region's values.
struct Run<'a> {
    at: &'a [usize],
    pos: usize,
    len: usize,
}

impl Region {
    /// The whole box `shape` at `offsets`.
    pub fn whole(offsets: Vec<usize>, shape: Vec<usize>) -> Self {
        let end = shape.iter().product();
        Self {
            offsets,
            shape,
            start: 0,
            end,
        }
    }

    /// Whether the region lies in a tensor of shape `tensor`: an offset
    /// and a box size for each of its dimensions, the box inside it, and
    /// the range inside the box (what an index read from disk must hold
    /// before it is used).
    pub fn lies_in(&self, tensor: &[usize]) -> bool {
        let rank = tensor.len();
        let box_inside = self
            .offsets
            .iter()
            .zip(&self.shape)
            .zip(tensor)
            .all(|((&o, &b), &n)| o.checked_add(b).is_some_and(|end| end <= n));
        let elems = self.shape.iter().try_fold(1usize, |a, &b| a.checked_mul(b));
        rank > 0
            && self.offsets.len() == rank
            && self.shape.len() == rank
            && box_inside
            && elems.is_some_and(|n| self.start <= self.end && self.end <= n)
    }

    /// Elements in the range.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether the range holds no element.
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }

    /// Calls `f` for each row segment of the range, in order.
    fn runs(&self, mut f: impl FnMut(Run<'_>)) {
        let last = *self.shape.last().expect("a region has a dimension");
        let mut p = self.start;
        let mut at = vec![0; self.shape.len()];
        while p < self.end {
            let mut rest = p;
            for d in (0..self.shape.len()).rev() {
                at[d] = self.offsets[d] + rest % self.shape[d];
                rest /= self.shape[d];
            }
            let col = p % last;
            let len = (last - col).min(self.end - p);
            f(Run {
                at: &at,
                pos: p - self.start,
                len,
            });
            p += len;
        }
    }

    /// The region cut to a tensor of shape `global` (padding beyond it
    /// dropped), and `values` (the region's, in order) cut the same way.
    pub fn clip(&self, global: &[usize], values: &[f32]) -> (Region, Vec<f32>) {
        let last = self.shape.len() - 1;
        let mut kept = Vec::with_capacity(values.len());
        self.runs(|r| {
            let inside = (0..last).all(|d| r.at[d] < global[d]);
            let col = r.at[last];
            if inside && col < global[last] {
                let n = r.len.min(global[last] - col);
                kept.extend_from_slice(&values[r.pos..r.pos + n]);
            }
        });
        (self.clipped(global), kept)
    }

    /// The region cut to a tensor of shape `global` (what [`Region::clip`]
    /// gives, without the values).
    pub fn clipped(&self, global: &[usize]) -> Region {
        let clipped: Vec<usize> = (0..self.shape.len())
            .map(|d| {
                (self.offsets[d] + self.shape[d])
                    .min(global[d])
                    .saturating_sub(self.offsets[d])
            })
            .collect();
        let start = rank_in(&clipped, &self.unravel(self.start));
        Region {
            offsets: self.offsets.clone(),
            shape: clipped,
            start,
            end: start + self.inside(global),
        }
    }

    /// The box index (relative to the box) of element `p` of the box; `p`
    /// equal to the box's size gives one past its last row.
    fn unravel(&self, mut p: usize) -> Vec<usize> {
        let mut idx = vec![0; self.shape.len()];
        for d in (0..self.shape.len()).rev() {
            if d == 0 {
                idx[0] = p;
            } else {
                idx[d] = p % self.shape[d];
                p /= self.shape[d];
            }
        }
        idx
    }

    /// Copies what `self` (the wanted region, values `dst`) shares with the
    /// stored region `src`, whose values `read(pos, len)` gives (positions
    /// in `src`'s range). Returns the number of elements copied.
    pub fn fill_from<E>(
        &self,
        dst: &mut [f32],
        src: &Region,
        mut read: impl FnMut(usize, &mut [f32]) -> Result<(), E>,
    ) -> Result<usize, E> {
        let last = self.shape.len() - 1;
        let mut copied = 0;
        let mut result = Ok(());
        self.runs(|r| {
            if result.is_err() {
                return;
            }
            let inside = (0..last)
                .all(|d| r.at[d] >= src.offsets[d] && r.at[d] < src.offsets[d] + src.shape[d]);
            let (lo, hi) = (
                r.at[last].max(src.offsets[last]),
                (r.at[last] + r.len).min(src.offsets[last] + src.shape[last]),
            );
            if !inside || lo >= hi {
                return;
            }
            // Where column `lo` of this row is in `src`'s box.
            let mut flat = 0;
            for d in 0..=last {
                let i = if d == last { lo } else { r.at[d] };
                flat = flat * src.shape[d] + (i - src.offsets[d]);
            }
            let (a, b) = (flat.max(src.start), (flat + hi - lo).min(src.end));
            if a >= b {
                return;
            }
            let at = r.pos + (lo - r.at[last]) + (a - flat);
            result = read(a - src.start, &mut dst[at..at + b - a]);
            copied += b - a;
        });
        result.map(|()| copied)
    }

    /// Elements of the range that lie inside a tensor of shape `global`.
    pub fn inside(&self, global: &[usize]) -> usize {
        let last = self.shape.len() - 1;
        let mut n = 0;
        self.runs(|r| {
            if (0..last).all(|d| r.at[d] < global[d]) && r.at[last] < global[last] {
                n += r.len.min(global[last] - r.at[last]);
            }
        });
        n
    }
}

/// How many elements of a box of shape `shape` come before index `idx`
/// (relative to the box; it may lie outside it) in row-major order.
fn rank_in(shape: &[usize], idx: &[usize]) -> usize {
    let mut below = 0;
    for d in 0..shape.len() {
        let inner: usize = shape[d + 1..].iter().product();
        if idx[d] >= shape[d] {
            return below + shape[d] * inner;
        }
        below += idx[d] * inner;
    }
    below
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values of a tensor of `shape` whose element at flat index `i` is `i`.
    fn iota(shape: &[usize]) -> Vec<f32> {
        (0..shape.iter().product::<usize>())
            .map(|i| i as f32)
            .collect()
    }

    /// The region's values read element by element from the whole tensor
    /// `whole` of shape `global` (NaN outside it): the reference.
    fn reference(r: &Region, whole: &[f32], global: &[usize]) -> Vec<f32> {
        (r.start..r.end)
            .map(|p| {
                let rel = r.unravel(p);
                let g: Vec<usize> = rel.iter().zip(&r.offsets).map(|(i, o)| i + o).collect();
                if g.iter().zip(global).any(|(i, n)| i >= n) {
                    return f32::NAN;
                }
                let flat = g.iter().zip(global).fold(0, |f, (i, n)| f * n + i);
                whole[flat]
            })
            .collect()
    }

    #[test]
    fn clipping_a_padded_block_keeps_a_range_of_the_clipped_box() {
        // A [3, 10] tensor whose dimension 1 (a vocabulary of 10) is padded to
        // 12 and split over 2 ranks: rank 1's box is columns 6..12.
        let global = [3, 10];
        let whole = iota(&global);
        for (start, end) in [(0, 18), (1, 17), (4, 8), (5, 6), (11, 13)] {
            let r = Region {
                offsets: vec![0, 6],
                shape: vec![3, 6],
                start,
                end,
            };
            let values = reference(&r, &whole, &global);
            let (c, kept) = r.clip(&global, &values);
            assert_eq!(c.shape, [3, 4]);
            assert_eq!(c.len(), kept.len(), "{start}..{end}");
            assert_eq!(kept, reference(&c, &whole, &global), "{start}..{end}");
            assert!(kept.iter().all(|v| !v.is_nan()));
            assert_eq!(r.inside(&global), kept.len());
        }
    }

    #[test]
    fn a_wanted_region_is_filled_from_the_stored_blocks_it_overlaps() {
        // Stored: a [4, 6] tensor as two column blocks (tp2), each in two
        // ZeRO ranges. Wanted: row blocks and ranges of another layout.
        let global = [4, 6];
        let whole = iota(&global);
        let mut stored = Vec::new();
        for (col, (a, b)) in [(0, (0, 5)), (0, (5, 12)), (3, (0, 7)), (3, (7, 12))] {
            let r = Region {
                offsets: vec![0, col],
                shape: vec![4, 3],
                start: a,
                end: b,
            };
            let v = reference(&r, &whole, &global);
            stored.push((r, v));
        }
        for want in [
            Region::whole(vec![0, 0], vec![4, 6]),
            Region::whole(vec![2, 0], vec![2, 6]),
            Region {
                offsets: vec![0, 0],
                shape: vec![4, 6],
                start: 7,
                end: 19,
            },
        ] {
            let mut got = vec![f32::NAN; want.len()];
            let mut copied = 0;
            for (r, v) in &stored {
                copied += want
                    .fill_from(&mut got, r, |pos, out: &mut [f32]| {
                        out.copy_from_slice(&v[pos..pos + out.len()]);
                        Ok::<(), ()>(())
                    })
                    .unwrap();
            }
            assert_eq!(copied, want.len());
            assert_eq!(got, reference(&want, &whole, &global), "{want:?}");
        }
    }

    #[test]
    fn a_region_lies_in_its_tensor_only_when_every_bound_holds() {
        let r = |offsets: Vec<usize>, shape: Vec<usize>, start, end| Region {
            offsets,
            shape,
            start,
            end,
        };
        assert!(r(vec![2, 0], vec![2, 3], 0, 6).lies_in(&[4, 3]));
        assert!(r(vec![0, 0], vec![4, 3], 5, 7).lies_in(&[4, 3]));
        for bad in [
            r(vec![2, 0], vec![2, 3], 4, 2),          // start after end
            r(vec![2, 0], vec![2, 3], 0, 7),          // past the box
            r(vec![3, 0], vec![2, 3], 0, 6),          // the box past the tensor
            r(vec![0], vec![4, 3], 0, 12),            // an offset missing
            r(vec![0, 0], vec![], 0, 0),              // no box
            r(vec![usize::MAX, 0], vec![2, 3], 0, 6), // overflowing
        ] {
            assert!(!bad.lies_in(&[4, 3]), "{bad:?}");
        }
    }
}
