//! f32 matrix products over strided views of host slices, through the
//! `gemm` crate (the GEMM Burn's flex backend runs; AVX2/AVX-512/NEON
//! chosen at run time, rows split over rayon's threads), with
//! accumulation into the destination, which Burn's `matmul` cannot do.

/// Where an f32 matrix of `rows x cols` lies in a slice: element `(r, c)`
/// at `offset + r * row_stride + c * col_stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatView {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Elements between one row and the next.
    pub row_stride: usize,
    /// Elements between one column and the next.
    pub col_stride: usize,
    /// Index of element `(0, 0)`.
    pub offset: usize,
}

impl MatView {
    /// A dense row-major `rows x cols` matrix at the start of its slice.
    pub fn row_major(rows: usize, cols: usize) -> Self {
        Self {
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
            offset: 0,
        }
    }

    /// The transposed view of the same elements.
    pub fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            offset: self.offset,
        }
    }

    /// Rows `start..start + len` of this view.
    pub fn rows_from(self, start: usize, len: usize) -> Self {
        assert!(
            start + len <= self.rows,
            "rows {start}..{} of {}",
            start + len,
            self.rows
        );
        Self {
            rows: len,
            offset: self.offset + start * self.row_stride,
            ..self
        }
    }

    /// One past the largest index the view touches (0 when empty).
    fn end(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            return 0;
        }
        self.offset + (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride + 1
    }
}

/// The threads one product runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Threads {
    /// Rayon's pool (a large product).
    All,
    /// The calling thread (a product inside a task of a parallel loop).
    One,
}

/// `dst = lhs x rhs`, or `dst += lhs x rhs` with `accumulate`, for views
/// `lhs` `[m, k]`, `rhs` `[k, n]` and `dst` `[m, n]` of the given slices
/// (each operand: its slice and its view).
/// The destination is row-major (column stride 1) or column-major (row
/// stride 1), so no two of its elements share an index.
///
/// Panics on mismatched shapes, or a view reaching past its slice.
pub fn matmul(
    dst: &mut [f32],
    dst_view: MatView,
    accumulate: bool,
    (lhs, lhs_view): (&[f32], MatView),
    (rhs, rhs_view): (&[f32], MatView),
    threads: Threads,
) {
    let (m, k, n) = (lhs_view.rows, lhs_view.cols, rhs_view.cols);
    assert_eq!(
        rhs_view.rows, k,
        "matmul: inner dimensions {k} and {}",
        rhs_view.rows
    );
    assert_eq!(
        (dst_view.rows, dst_view.cols),
        (m, n),
        "matmul: destination shape"
    );
    assert!(
        dst_view.end() <= dst.len(),
        "matmul: destination view past its slice"
    );
    assert!(
        lhs_view.end() <= lhs.len(),
        "matmul: left view past its slice"
    );
    assert!(
        rhs_view.end() <= rhs.len(),
        "matmul: right view past its slice"
    );
    let row_major = dst_view.col_stride == 1 && dst_view.row_stride >= n;
    let col_major = dst_view.row_stride == 1 && dst_view.col_stride >= m;
    assert!(
        row_major || col_major,
        "matmul: the destination must be row- or column-major"
    );
    if m == 0 || n == 0 {
        return;
    }
    let s = |v: usize| v as isize;
    // SAFETY: every index the three views reach is inside its slice
    // (checked above), the destination's elements are distinct (it is row-
    // or column-major, checked above) and `dst` is borrowed mutably, so nothing else reads or
    // writes it meanwhile; `gemm` accepts any strides.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr().add(dst_view.offset),
            s(dst_view.col_stride),
            s(dst_view.row_stride),
            accumulate,
            lhs.as_ptr().add(lhs_view.offset),
            s(lhs_view.col_stride),
            s(lhs_view.row_stride),
            rhs.as_ptr().add(rhs_view.offset),
            s(rhs_view.col_stride),
            s(rhs_view.row_stride),
            1.0,
            1.0,
            false,
            false,
            false,
            match threads {
                Threads::All => gemm::Parallelism::Rayon(0),
                Threads::One => gemm::Parallelism::None,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `a` `[m, k]` times `b` `[k, n]`, plainly, row-major.
    fn plain(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 31 + seed * 17) % 23) as f32 / 11.0 - 1.0)
            .collect()
    }

    #[test]
    fn strided_views_and_accumulation_match_the_plain_product() {
        let (m, k, n) = (5, 7, 3);
        let a = values(m * k, 1);
        let b = values(k * n, 2);
        let want = plain(&a, &b, m, k, n);
        // `b` stored transposed ([n, k] row-major) and read through `t()`.
        let b_t: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let mut c = vec![0.0; m * n];
        let dst = MatView::row_major(m, n);
        matmul(
            &mut c,
            dst,
            false,
            (&a, MatView::row_major(m, k)),
            (&b_t, MatView::row_major(n, k).t()),
            Threads::All,
        );
        for (g, w) in c.iter().zip(&want) {
            assert!((g - w).abs() < 1e-5, "{g} vs {w}");
        }
        // Accumulating the product of rows 2..5 into a column-major destination.
        let mut c_t = vec![1.0; n * m];
        let dst_t = MatView::row_major(n, m).t();
        let rows = MatView::row_major(m, k).rows_from(2, 3);
        matmul(
            &mut c_t,
            dst_t.rows_from(2, 3),
            true,
            (&a, rows),
            (&b, MatView::row_major(k, n)),
            Threads::One,
        );
        for i in 0..m {
            for j in 0..n {
                let w = if i >= 2 { 1.0 + want[i * n + j] } else { 1.0 };
                assert!((c_t[j * m + i] - w).abs() < 1e-5, "({i}, {j})");
            }
        }
    }

    #[test]
    #[should_panic(expected = "past its slice")]
    fn a_view_past_its_slice_is_refused() {
        let a = vec![0.0; 6];
        let mut c = vec![0.0; 4];
        matmul(
            &mut c,
            MatView::row_major(2, 2),
            false,
            (&a, MatView::row_major(2, 4)),
            (&a, MatView::row_major(4, 2)),
            Threads::All,
        );
    }
}
