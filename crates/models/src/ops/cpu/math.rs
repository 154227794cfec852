//! Row-wise f32 math for the CPU fused operations, written so that the
//! compiler vectorises it: an `exp` by range reduction and a polynomial
//! (Cephes' `expf`, within 2 ulp of the true value for arguments in
//! `[-87.3, 88.3]`), and reductions over eight independent lanes. Each
//! public function runs an AVX2 + FMA build of its body where the CPU has
//! them (checked at run time; Burn's flex backend does the same for its
//! GEMM) and the portable build elsewhere.

/// Lanes of the reductions: one AVX2 register of f32.
const LANES: usize = 8;

/// `e^x` for f32 `x`: `2^n * p(r)` with `n = round(x / ln 2)` and
/// `r = x - n ln 2` (ln 2 split in two parts so that `r` is exact), `p` the
/// degree-7 Cephes polynomial, for `x` in `[-87.3, 88.3]` (where `2^n` is
/// a normal f32 number). Below that range the result is 0 (`e^-inf`, a
/// masked score, is exactly 0), above it `e^88.3` (about `2.1e38`).
#[inline(always)]
pub(super) fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x_in = x;
    let x = x.clamp(-87.3, 88.3);
    let shifted = x.mul_add(LOG2_E, ROUND);
    let n = shifted - ROUND;
    let n_int = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let mut p = 1.987_569_1e-4_f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let p = p.mul_add(r * r, r) + 1.0;
    let y = p * f32::from_bits(((n_int + 127) as u32) << 23);
    if x_in < -87.3 {
        0.0
    } else {
        y
    }
}

/// The logistic function `1 / (1 + e^-x)` through [`exp`]: within 4 ulp
/// of the true value where that is at least `1.2e-38` (`x >= -87.3`);
/// below, about `4.7e-39` instead of a smaller number (the clamp of
/// [`exp`]), so `x * sigmoid(x)` still tends to 0.
#[inline(always)]
pub(in crate::ops) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// The largest element of `v` (`-inf` for an empty slice).
#[inline(always)]
fn max_body(v: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = v.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = if x > *m { x } else { *m };
        }
    }
    tail.iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
}

/// Writes `e^(v[i] - shift)` over `v` and returns their sum.
#[inline(always)]
fn exp_shifted_body(v: &mut [f32], shift: f32) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let mut chunks = v.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for (s, x) in lanes.iter_mut().zip(c) {
            *x = exp(*x - shift);
            *s += *x;
        }
    }
    let mut sum: f32 = lanes.iter().sum();
    for x in chunks.into_remainder() {
        *x = exp(*x - shift);
        sum += *x;
    }
    sum
}

/// The sum of `e^(v[i] - shift)`, `v` untouched.
#[inline(always)]
fn exp_shifted_sum_body(v: &[f32], shift: f32) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let chunks = v.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (s, &x) in lanes.iter_mut().zip(c) {
            *s += exp(x - shift);
        }
    }
    lanes.iter().sum::<f32>() + tail.iter().map(|&x| exp(x - shift)).sum::<f32>()
}

/// Multiplies every element of `v` by `factor`.
#[inline(always)]
fn scale_body(v: &mut [f32], factor: f32) {
    for x in v {
        *x *= factor;
    }
}

/// Overwrites the row `v` with `factor * softmax(v)` and returns the
/// row's log-sum-exp `ln sum_i e^v[i]`, the softmax computed as
/// `e^(v[i] - max) / sum`.
#[inline(always)]
fn softmax_scaled_body(v: &mut [f32], factor: f32) -> f32 {
    let max = max_body(v);
    let sum = exp_shifted_body(v, max);
    scale_body(v, factor / sum);
    max + sum.ln()
}

/// The log-sum-exp `ln sum_i e^v[i]` of the row `v`.
#[inline(always)]
fn log_sum_exp_body(v: &[f32]) -> f32 {
    let max = max_body(v);
    max + exp_shifted_sum_body(v, max).ln()
}

/// `g[i] = p[i] (g[i] - sum_j p[j] g[j]) * scale`: the gradient of a
/// softmax row `p` for the upstream gradient `g`, times `scale`.
#[inline(always)]
fn softmax_backward_body(p: &[f32], g: &mut [f32], scale: f32) {
    let mut lanes = [0.0f32; LANES];
    let (p_chunks, g_chunks) = (p.chunks_exact(LANES), g.chunks_exact(LANES));
    let tail: f32 = p_chunks
        .remainder()
        .iter()
        .zip(g_chunks.remainder())
        .map(|(a, b)| a * b)
        .sum();
    for (pc, gc) in p_chunks.zip(g_chunks) {
        for ((s, a), b) in lanes.iter_mut().zip(pc).zip(gc) {
            *s += a * b;
        }
    }
    let dot = lanes.iter().sum::<f32>() + tail;
    for (x, &a) in g.iter_mut().zip(p) {
        *x = a * (*x - dot) * scale;
    }
}

/// Defines `fn $name(args)` that runs `$body(args)` compiled for AVX2 +
/// FMA where the CPU has them (checked at run time), the portable build
/// elsewhere. `$body` is an `#[inline(always)]` function, so each build
/// inlines (and vectorises) it for its own target features.
macro_rules! simd_dispatch {
    ($(#[$doc:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? => $body:path) => {
        $(#[$doc])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            if $crate::ops::cpu::math::has_avx2_fma() {
                /// The body compiled for AVX2 + FMA.
                ///
                /// # Safety
                /// The CPU must have AVX2 and FMA.
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                // SAFETY: the CPU has AVX2 and FMA (checked above).
                return unsafe { avx2($($arg),*) };
            }
            $body($($arg),*)
        }
    };
}
pub(in crate::ops) use simd_dispatch;

/// Whether this CPU runs the AVX2 + FMA builds.
#[cfg(target_arch = "x86_64")]
pub(in crate::ops) fn has_avx2_fma() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

simd_dispatch! {
    /// Overwrites the row `v` with `factor * softmax(v)` and returns its
    /// log-sum-exp `ln sum_i e^v[i]` (both in f32; the exponentials are
    /// shifted by the row's maximum, so no finite row overflows).
    pub fn softmax_scaled(v: &mut [f32], factor: f32) -> f32 => softmax_scaled_body
}

simd_dispatch! {
    /// The log-sum-exp `ln sum_i e^v[i]` of the row `v`, shifted by its
    /// maximum as [`softmax_scaled`].
    pub fn log_sum_exp(v: &[f32]) -> f32 => log_sum_exp_body
}

simd_dispatch! {
    /// [`softmax_backward_body`] on the CPU's best build.
    fn softmax_backward_rows(p: &[f32], g: &mut [f32], scale: f32) => softmax_backward_body
}

/// `g[i] = p[i] (g[i] - dot) * scale` with `dot` given: the softmax's
/// gradient when `p` is part of a longer row whose `sum_j p[j] g[j]` is
/// `dot`.
#[inline(always)]
fn softmax_backward_given_body(p: &[f32], g: &mut [f32], dot: f32, scale: f32) {
    for (x, &a) in g.iter_mut().zip(p) {
        *x = a * (*x - dot) * scale;
    }
}

simd_dispatch! {
    /// Overwrites the row `v` with `e^(v[i] - shift)` and returns their
    /// sum: with `shift` the log-sum-exp of a longer row that `v` is part
    /// of, `v`'s entries of that row's softmax.
    pub fn exp_shifted(v: &mut [f32], shift: f32) -> f32 => exp_shifted_body
}

simd_dispatch! {
    /// [`softmax_backward_given_body`] on the CPU's best build.
    fn softmax_backward_given_rows(p: &[f32], g: &mut [f32], dot: f32, scale: f32) => softmax_backward_given_body
}

/// Overwrites `g` with `p[i] (g[i] - dot) * scale`: the gradient of the
/// softmax's input for the part `p` of a softmax row whose whole
/// `sum_j p[j] g[j]` is `dot` (for attention, `rowsum(d_out * out)`).
pub fn softmax_backward_given(p: &[f32], g: &mut [f32], dot: f32, scale: f32) {
    assert_eq!(
        p.len(),
        g.len(),
        "softmax backward: rows of {} and {}",
        p.len(),
        g.len()
    );
    softmax_backward_given_rows(p, g, dot, scale)
}

/// Overwrites the softmax output row `p`'s upstream gradient `g` (same
/// length) with the gradient of the softmax's input, times `scale`:
/// `p[i] (g[i] - sum_j p[j] g[j]) * scale`.
pub fn softmax_backward(p: &[f32], g: &mut [f32], scale: f32) {
    assert_eq!(
        p.len(),
        g.len(),
        "softmax backward: rows of {} and {}",
        p.len(),
        g.len()
    );
    softmax_backward_rows(p, g, scale)
}

/// `row[i] = row[i] * scale + bias[i]` (the scores' scaling and additive
/// bias, one pass).
pub fn scale_add(row: &mut [f32], scale: f32, bias: &[f32]) {
    assert_eq!(
        row.len(),
        bias.len(),
        "scale_add: rows of {} and {}",
        row.len(),
        bias.len()
    );
    for (x, &b) in row.iter_mut().zip(bias) {
        *x = *x * scale + b;
    }
}

/// Test arguments over the activations' interesting range, -10 to 10:
/// 25 vectors of 8 lanes and a tail of 3, spread by `seed`.
#[cfg(test)]
pub(crate) fn test_arguments(seed: usize) -> Vec<f32> {
    (0..8 * 25 + 3)
        .map(|i| ((i * 7919 + seed * 31) % 2001) as f32 / 100.0 - 10.0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Arguments spread over the whole clamped range, with the edges.
    fn arguments() -> Vec<f32> {
        let mut v: Vec<f32> = (0..20_001)
            .map(|i| -87.3 + 175.6 * i as f32 / 20_000.0)
            .collect();
        v.extend([-87.3, 0.0, -0.0, 1e-8, -1e-8, 0.5, 88.3, -1.0, 1.0]);
        v
    }

    #[test]
    fn softmax_backward_matches_f64() {
        let p: Vec<f32> = (0..8 * 3 + 3)
            .map(|i| ((i * 37 % 11) as f32 + 1.0) / 200.0)
            .collect();
        let g: Vec<f32> = (0..p.len()).map(|i| ((i * 13 % 7) as f32) - 3.0).collect();
        let dot: f64 = p.iter().zip(&g).map(|(&a, &b)| a as f64 * b as f64).sum();
        for build in ["portable", "dispatched"] {
            let mut got = g.clone();
            match build {
                "portable" => softmax_backward_body(&p, &mut got, 0.25),
                _ => softmax_backward(&p, &mut got, 0.25),
            }
            for i in 0..p.len() {
                let want = p[i] as f64 * (g[i] as f64 - dot) * 0.25;
                assert!(
                    (got[i] as f64 - want).abs() < 1e-6,
                    "{build}: [{i}] {} vs {want}",
                    got[i]
                );
            }
        }
    }

    /// A row split in two: each part's exponentials shifted by the whole
    /// row's log-sum-exp, and its gradient with the whole row's dot,
    /// equal the whole row's softmax and gradient (f64).
    #[test]
    fn a_part_of_a_row_with_the_whole_rows_lse_and_dot_matches_f64() {
        let row: Vec<f32> = (0..8 * 3 + 5)
            .map(|i| ((i * 37 % 23) as f32) / 4.0 - 3.0)
            .collect();
        let g: Vec<f32> = (0..row.len())
            .map(|i| ((i * 13 % 7) as f32) - 3.0)
            .collect();
        let lse = row.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
        let p: Vec<f64> = row.iter().map(|&x| (x as f64 - lse).exp()).collect();
        let dot: f64 = p.iter().zip(&g).map(|(a, &b)| a * b as f64).sum();
        for part in [0..11, 11..row.len()] {
            let mut got = row[part.clone()].to_vec();
            exp_shifted(&mut got, lse as f32);
            let mut got_g = g[part.clone()].to_vec();
            softmax_backward_given(&got, &mut got_g, dot as f32, 0.5);
            for (n, i) in part.enumerate() {
                assert!(
                    (got[n] as f64 - p[i]).abs() <= 1e-6 * p[i] + 1e-12,
                    "p[{i}]"
                );
                let want = p[i] * (g[i] as f64 - dot) * 0.5;
                assert!(
                    (got_g[n] as f64 - want).abs() < 1e-5,
                    "g[{i}] {} vs {want}",
                    got_g[n]
                );
            }
        }
    }

    #[test]
    fn exp_below_its_range_is_zero() {
        for x in [-87.31, -100.0, -1e30, f32::NEG_INFINITY] {
            assert_eq!(exp(x), 0.0, "exp({x})");
        }
    }

    #[test]
    fn exp_is_within_two_ulp_of_f64_over_its_range() {
        for x in arguments() {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            let ulp = f32::EPSILON as f64 * want;
            assert!(
                (got - want).abs() <= 2.0 * ulp,
                "exp({x}) = {got}, f64 says {want}"
            );
        }
    }

    #[test]
    fn sigmoid_is_within_four_ulp_of_f64_and_tiny_past_the_clamp() {
        for x in arguments().into_iter().filter(|&x| x >= -87.0) {
            let want = 1.0 / (1.0 + (-(x as f64)).exp());
            let got = sigmoid(x) as f64;
            let ulp = f32::EPSILON as f64 * want;
            assert!(
                (got - want).abs() <= 4.0 * ulp,
                "sigmoid({x}) = {got}, f64 says {want}"
            );
        }
        for x in [-88.0f32, -100.0, -1e4, f32::MIN] {
            let got = sigmoid(x);
            assert!((0.0..1e-37).contains(&got), "sigmoid({x}) = {got}");
        }
        assert_eq!(sigmoid(100.0), 1.0);
    }

    #[test]
    fn softmax_and_log_sum_exp_match_f64_on_both_builds() {
        // 8 lanes plus a tail of 5, large spread of magnitudes.
        let row: Vec<f32> = (0..8 * 37 + 5)
            .map(|i| ((i * 7919 % 1000) as f32 / 10.0) - 50.0)
            .collect();
        let max = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
        let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
        let lse = max + sum.ln();
        let check = |soft: &[f32], got_lse: f32, how: &str| {
            assert!(
                (got_lse as f64 - lse).abs() < 1e-5 * lse.abs().max(1.0),
                "{how}: lse {got_lse} vs {lse}"
            );
            for (i, (&s, &x)) in soft.iter().zip(&row).enumerate() {
                let want = 0.5 * (x as f64 - max).exp() / sum;
                assert!(
                    (s as f64 - want).abs() <= 1e-6 * want + 1e-30,
                    "{how}: [{i}] {s} vs {want}"
                );
            }
        };
        let mut portable = row.clone();
        let lse_portable = softmax_scaled_body(&mut portable, 0.5);
        check(&portable, lse_portable, "portable");
        assert_eq!(log_sum_exp_body(&row), lse_portable);
        let mut dispatched = row.clone();
        let lse_dispatched = softmax_scaled(&mut dispatched, 0.5);
        check(&dispatched, lse_dispatched, "dispatched");
        assert!((log_sum_exp(&row) - lse_dispatched).abs() <= 1e-6 * lse_dispatched.abs());
    }
}
