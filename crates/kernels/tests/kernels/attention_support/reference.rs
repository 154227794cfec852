//! Naive attention on the host in `f64`, the reference for the kernels:
//! the full score row of every query, softmax, weighted sum; and its analytic
//! backward. Conventions as in `ferrotron_kernels::attention`: query head `h`
//! uses key/value head `h / (n_heads / n_kv_heads)`; ALiBi adds
//! `slope[h] * (j - i)` to the score of query `i`, key `j`; causal masks
//! `j > i`.

use ferrotron_kernels::attention::AttentionShape;

/// One attention problem; tensors in the kernels' layouts, as `f64`.
pub struct Problem {
    /// Dimensions.
    pub shape: AttentionShape,
    /// Mask keys after the query.
    pub causal: bool,
    /// Softmax scale.
    pub scale: f64,
    /// ALiBi slopes `[n_heads]`, if any.
    pub slopes: Option<Vec<f64>>,
    /// `[batch, n_heads, seq, head_dim]`.
    pub q: Vec<f64>,
    /// `[batch, n_kv_heads, seq, head_dim]`.
    pub k: Vec<f64>,
    /// `[batch, n_kv_heads, seq, head_dim]`.
    pub v: Vec<f64>,
}

/// Reference forward outputs.
pub struct Forward {
    /// `[batch, n_heads, seq, head_dim]`.
    pub out: Vec<f64>,
    /// `[batch, n_heads, seq]`, natural log.
    pub lse: Vec<f64>,
}

/// Reference gradients.
pub struct Gradients {
    /// Like `q`.
    pub dq: Vec<f64>,
    /// Like `k`.
    pub dk: Vec<f64>,
    /// Like `v`.
    pub dv: Vec<f64>,
}

impl Problem {
    /// Start of row `i` of query head `h` in `q` (and `out`).
    fn q_row(&self, b: usize, h: usize, i: usize) -> usize {
        let s = &self.shape;
        ((b * s.n_heads + h) * s.seq + i) * s.head_dim
    }

    /// Start of row `j` of the key/value head that query head `h` uses.
    fn kv_row(&self, b: usize, h: usize, j: usize) -> usize {
        let s = &self.shape;
        let kv_head = h / (s.n_heads / s.n_kv_heads);
        ((b * s.n_kv_heads + kv_head) * s.seq + j) * s.head_dim
    }

    fn dot(&self, a: &[f64], a_start: usize, b: &[f64], b_start: usize) -> f64 {
        let d = self.shape.head_dim;
        a[a_start..a_start + d]
            .iter()
            .zip(&b[b_start..b_start + d])
            .map(|(x, y)| x * y)
            .sum()
    }

    /// Softmax probabilities of query `i` over all keys (0 where masked)
    /// and the log-sum-exp of its visible scores.
    fn probabilities(&self, b: usize, h: usize, i: usize) -> (Vec<f64>, f64) {
        let seq = self.shape.seq;
        let scores: Vec<Option<f64>> = (0..seq)
            .map(|j| {
                if self.causal && j > i {
                    return None;
                }
                let mut s = self.scale
                    * self.dot(&self.q, self.q_row(b, h, i), &self.k, self.kv_row(b, h, j));
                if let Some(slopes) = &self.slopes {
                    s += slopes[h] * (j as f64 - i as f64);
                }
                Some(s)
            })
            .collect();
        let max = scores
            .iter()
            .flatten()
            .cloned()
            .fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = scores.iter().flatten().map(|s| (s - max).exp()).sum();
        let probs = scores
            .iter()
            .map(|s| s.map_or(0.0, |s| (s - max).exp() / sum))
            .collect();
        (probs, max + sum.ln())
    }

    fn rows(&self) -> impl Iterator<Item = (usize, usize, usize)> {
        let s = self.shape;
        (0..s.batch)
            .flat_map(move |b| (0..s.n_heads).flat_map(move |h| (0..s.seq).map(move |i| (b, h, i))))
    }

    /// Output and log-sum-exp.
    pub fn forward(&self) -> Forward {
        let s = self.shape;
        let mut out = vec![0.0; s.q_elems()];
        let mut lse = vec![0.0; s.rows()];
        for (row, (b, h, i)) in self.rows().enumerate() {
            let (probs, row_lse) = self.probabilities(b, h, i);
            lse[row] = row_lse;
            let o = self.q_row(b, h, i);
            for (j, p) in probs.iter().enumerate() {
                let vj = self.kv_row(b, h, j);
                for d in 0..s.head_dim {
                    out[o + d] += p * self.v[vj + d];
                }
            }
        }
        Forward { out, lse }
    }

    /// Gradients of `sum(out * d_out)` with respect to `q`, `k`, `v`:
    /// `dP = dO v^T`, `dS = P * (dP - rowsum(P * dP))`, `dQ = scale dS k`,
    /// `dK = scale dS^T q`, `dV = P^T dO`.
    pub fn backward(&self, d_out: &[f64]) -> Gradients {
        self.backward_with_delta(d_out, None)
    }

    /// The FlashAttention-2 backward given the forward output `out` as the
    /// kernel receives it (for example rounded to 16 bits): as
    /// [`Problem::backward`] with `rowsum(P * dP)` replaced by
    /// `delta = rowsum(dO * out)`, which equals it when `out` is exact.
    pub fn backward_given_out(&self, d_out: &[f64], out: &[f64]) -> Gradients {
        self.backward_with_delta(d_out, Some(out))
    }

    fn backward_with_delta(&self, d_out: &[f64], out: Option<&[f64]>) -> Gradients {
        let s = self.shape;
        let mut dq = vec![0.0; s.q_elems()];
        let mut dk = vec![0.0; s.kv_elems()];
        let mut dv = vec![0.0; s.kv_elems()];
        for (b, h, i) in self.rows() {
            let (probs, _) = self.probabilities(b, h, i);
            let qi = self.q_row(b, h, i);
            let dp: Vec<f64> = (0..s.seq)
                .map(|j| self.dot(d_out, qi, &self.v, self.kv_row(b, h, j)))
                .collect();
            let weighted: f64 = match out {
                Some(out) => self.dot(d_out, qi, out, qi),
                None => probs.iter().zip(&dp).map(|(p, g)| p * g).sum(),
            };
            for j in 0..s.seq {
                let ds = probs[j] * (dp[j] - weighted);
                let kj = self.kv_row(b, h, j);
                for d in 0..s.head_dim {
                    dq[qi + d] += self.scale * ds * self.k[kj + d];
                    dk[kj + d] += self.scale * ds * self.q[qi + d];
                    dv[kj + d] += probs[j] * d_out[qi + d];
                }
            }
        }
        Gradients { dq, dk, dv }
    }
}
