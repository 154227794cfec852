//! The ring, with a plain f64 attention as its block kernel, against the
//! same attention over the whole sequence: outputs, log-sum-exp and
//! gradients, for rings of 1 to 4 ranks simulated in one process (the
//! ranks' steps in a loop, blocks handed over by index), and the
//! communicator drivers on one rank.

use super::*;
use crate::comm::SingleProcess;

mod device_ring;

/// Plain attention in f64: causal on global positions, grouped-query
/// heads, and ALiBi's `slope_h * (k_pos - q_pos)` when `slopes` is set.
struct Plain {
    slopes: Option<Vec<f64>>,
}

impl Plain {
    /// The visible keys of query `i` of head `h` (sequence `b`) and their
    /// biased, scaled scores.
    fn scores(&self, blk: &Block<'_>, b: usize, h: usize, i: usize) -> Vec<(usize, f64)> {
        let [_, heads, len_q, d] = blk.q.dims;
        let [_, kv_heads, len_k, _] = blk.k.dims;
        let g = h / (heads / kv_heads);
        let q = &blk.q.data[((b * heads + h) * len_q + i) * d..][..d];
        (0..len_k)
            .filter(|&j| blk.k_pos[j] <= blk.q_pos[i])
            .map(|j| {
                let k = &blk.k.data[((b * kv_heads + g) * len_k + j) * d..][..d];
                let dot: f64 = q.iter().zip(k).map(|(a, c)| *a as f64 * *c as f64).sum();
                let bias = self
                    .slopes
                    .as_ref()
                    .map_or(0.0, |s| s[h] * (blk.k_pos[j] as f64 - blk.q_pos[i] as f64));
                (j, dot / (d as f64).sqrt() + bias)
            })
            .collect()
    }
}

impl BlockAttention for Plain {
    fn forward(&self, blk: Block<'_>) -> (HeadBuf, HeadBuf) {
        let [batch, heads, len_q, d] = blk.q.dims;
        let [_, kv_heads, len_k, _] = blk.k.dims;
        let mut out = HeadBuf::filled(blk.q.dims, 0.0);
        let mut lse = HeadBuf::filled([batch, heads, len_q, 1], 0.0);
        for b in 0..batch {
            for h in 0..heads {
                let g = h / (heads / kv_heads);
                for i in 0..len_q {
                    let s = self.scores(&blk, b, h, i);
                    let l = s.iter().map(|(_, x)| x.exp()).sum::<f64>().ln();
                    let row = (b * heads + h) * len_q + i;
                    lse.data[row] = l as f32;
                    for (j, x) in s {
                        let v = &blk.v.data[((b * kv_heads + g) * len_k + j) * d..][..d];
                        for (o, y) in out.data[row * d..(row + 1) * d].iter_mut().zip(v) {
                            *o += ((x - l).exp() * *y as f64) as f32;
                        }
                    }
                }
            }
        }
        (out, lse)
    }

    fn backward(&self, blk: Block<'_>, whole: WholeRows<'_>) -> [HeadBuf; 3] {
        let [batch, heads, len_q, d] = blk.q.dims;
        let [_, kv_heads, len_k, _] = blk.k.dims;
        let scale = 1.0 / (d as f64).sqrt();
        let mut dq = vec![0.0f64; blk.q.data.len()];
        let mut dk = vec![0.0f64; blk.k.data.len()];
        let mut dv = vec![0.0f64; blk.v.data.len()];
        for b in 0..batch {
            for h in 0..heads {
                let g = h / (heads / kv_heads);
                for i in 0..len_q {
                    let row = (b * heads + h) * len_q + i;
                    let (l, delta) = (whole.lse.data[row] as f64, whole.delta.data[row] as f64);
                    let g_out = &whole.d_out.data[row * d..(row + 1) * d];
                    for (j, x) in self.scores(&blk, b, h, i) {
                        let kv = ((b * kv_heads + g) * len_k + j) * d;
                        let p = (x - l).exp();
                        let dp: f64 = (0..d)
                            .map(|e| g_out[e] as f64 * blk.v.data[kv + e] as f64)
                            .sum();
                        let ds = p * (dp - delta) * scale;
                        for e in 0..d {
                            dv[kv + e] += p * g_out[e] as f64;
                            dq[row * d + e] += ds * blk.k.data[kv + e] as f64;
                            dk[kv + e] += ds * blk.q.data[row * d + e] as f64;
                        }
                    }
                }
            }
        }
        let buf = |dims, v: Vec<f64>| HeadBuf::new(dims, v.into_iter().map(|x| x as f32).collect());
        [
            buf(blk.q.dims, dq),
            buf(blk.k.dims, dk),
            buf(blk.v.dims, dv),
        ]
    }
}

fn values(dims: [usize; 4], seed: u64) -> HeadBuf {
    let n: usize = dims.iter().product();
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let data = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 2001) as f32 / 1000.0 - 1.0
        })
        .collect();
    HeadBuf::new(dims, data)
}

/// The whole sequence's attention, gradients included, by the same kernel.
fn whole(kernel: &Plain, q: &HeadBuf, k: &HeadBuf, v: &HeadBuf, d_out: &HeadBuf) -> [HeadBuf; 5] {
    let pos: Vec<usize> = (0..q.dims[2]).collect();
    let blk = Block {
        q,
        k,
        v,
        q_pos: &pos,
        k_pos: &pos,
    };
    let (out, lse) = kernel.forward(blk);
    let mut state = RingBackward::new(
        kernel,
        ChunkLayout::new(q.dims[2], 1).unwrap(),
        0,
        Kept::of([q, k, v, &out, &lse]),
        d_out,
    );
    let [dk, dv] = state.step(0, k, v);
    let dq = state.finish();
    [out, lse, dq, dk, dv]
}

fn assert_close(got: &HeadBuf, want: &HeadBuf, what: &str) {
    assert_eq!(got.dims, want.dims, "{what}: shape");
    let scale = want.data.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    for (i, (g, w)) in got.data.iter().zip(&want.data).enumerate() {
        assert!((g - w).abs() <= 1e-5 * scale, "{what}[{i}]: {g} vs {w}");
    }
}

#[test]
fn simulated_rings_of_1_to_4_ranks_equal_the_whole_attention() {
    // (batch, heads, kv heads, seq, head dim, ALiBi)
    for (batch, heads, kv_heads, seq, d, alibi) in [
        (1, 2, 2, 8, 4, false),
        (2, 4, 2, 16, 3, true),
        (1, 3, 1, 24, 4, false),
    ] {
        let kernel = Plain {
            slopes: alibi.then(|| (0..heads).map(|h| 0.5f64.powi(h as i32 + 1)).collect()),
        };
        let q = values([batch, heads, seq, d], 1);
        let k = values([batch, kv_heads, seq, d], 2);
        let v = values([batch, kv_heads, seq, d], 3);
        let g = values([batch, heads, seq, d], 4);
        let want = whole(&kernel, &q, &k, &v, &g);
        for cp in (1..=4).filter(|cp| seq % (2 * cp) == 0) {
            let got = simulate_ring(&kernel, cp, [&q, &k, &v, &g]).unwrap();
            for ((g, w), name) in got.iter().zip(&want).zip(["out", "lse", "dq", "dk", "dv"]) {
                assert_close(
                    g,
                    w,
                    &format!("b{batch} h{heads} kv{kv_heads} seq{seq} cp{cp}: {name}"),
                );
            }
        }
    }
}

/// The communicator drivers on a ring of one rank: no transfer, the same
/// results as the steps.
#[test]
fn drivers_on_one_rank_equal_the_whole_attention() {
    let kernel = Plain { slopes: None };
    let q = values([1, 4, 12, 4], 5);
    let k = values([1, 2, 12, 4], 6);
    let v = values([1, 2, 12, 4], 7);
    let g = values([1, 4, 12, 4], 8);
    let want = whole(&kernel, &q, &k, &v, &g);
    let layout = ChunkLayout::new(12, 1).unwrap();
    let (out, lse) = ring_forward(&SingleProcess, &kernel, layout, &q, &k, &v).unwrap();
    let kept = Kept::of([&q, &k, &v, &out, &lse]);
    let [dq, dk, dv] = ring_backward(&SingleProcess, &kernel, layout, kept, &g).unwrap();
    for ((g, w), name) in [out, lse, dq, dk, dv]
        .iter()
        .zip(&want)
        .zip(["out", "lse", "dq", "dk", "dv"])
    {
        assert_close(g, w, name);
    }
}
