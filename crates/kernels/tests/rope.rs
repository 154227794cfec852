//! RoPE kernels against a host reference, and the reference's backward
//! against central finite differences.

mod common;

use common::{assert_close, assert_close_f64, download, finite_diff, upload, Rng};
use ferrotron_kernels::rope::{rope_backward, rope_forward, RopeShape};

/// Rotates `x: [batch, heads, seq, head_dim]` by RoPE (rotate_half pairs)
/// at angles `sign * pos * inv_freq[i]`.
fn reference(x: &[f64], shape: RopeShape, offset: usize, inv_freq: &[f64], sign: f64) -> Vec<f64> {
    let (d, half) = (shape.head_dim, shape.head_dim / 2);
    let mut out = x.to_vec();
    for (v, chunk) in out.chunks_mut(d).enumerate() {
        let pos = (offset + v % shape.seq) as f64;
        for i in 0..half {
            let angle = sign * pos * inv_freq[i];
            let (a, b) = (chunk[i], chunk[i + half]);
            chunk[i] = a * angle.cos() - b * angle.sin();
            chunk[i + half] = b * angle.cos() + a * angle.sin();
        }
    }
    out
}

/// Unscaled inverse frequencies `theta^(-2 i / head_dim)`, `head_dim / 2` of them.
fn default_freqs(theta: f64, head_dim: usize) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| theta.powf(-((2 * i) as f64) / head_dim as f64) as f32)
        .collect()
}

fn to_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

#[test]
fn rope_forward_and_backward_match_reference() {
    let client = common::client();
    let mut rng = Rng::new(17);
    let cases = [
        (
            RopeShape {
                batch: 1,
                heads: 1,
                seq: 1,
                head_dim: 2,
            },
            0,
            10_000.0,
        ),
        (
            RopeShape {
                batch: 2,
                heads: 3,
                seq: 5,
                head_dim: 6,
            },
            0,
            10_000.0,
        ),
        (
            RopeShape {
                batch: 1,
                heads: 2,
                seq: 13,
                head_dim: 64,
            },
            0,
            500_000.0,
        ),
        // Decoding with a KV cache: positions start at the cache length.
        (
            RopeShape {
                batch: 2,
                heads: 5,
                seq: 3,
                head_dim: 18,
            },
            29,
            10_000.0,
        ),
    ];
    for (index, (shape, offset, theta)) in cases.into_iter().enumerate() {
        let n = shape.batch * shape.heads * shape.seq * shape.head_dim;
        let x = rng.vec(n, -2.0, 2.0);
        // Odd cases: arbitrary frequencies (as a scaled RoPE gives), not
        // powers of theta, so the kernel cannot be recomputing them itself.
        let freqs = if index % 2 == 1 {
            rng.vec(shape.head_dim / 2, 0.0, 1.5)
        } else {
            default_freqs(theta, shape.head_dim)
        };
        let tag = format!("rope {shape:?} offset {offset} theta {theta} freqs {freqs:?}");
        let f = upload(&client, &freqs);

        let h = upload(&client, &x);
        rope_forward(&client, &h, &f, shape, offset).unwrap();
        let expected = reference(&to_f64(&x), shape, offset, &to_f64(&freqs), 1.0);
        assert_close(
            &format!("{tag} forward"),
            &download(&client, &h),
            &to_f32(&expected),
            1e-5,
        );

        let h = upload(&client, &x);
        rope_backward(&client, &h, &f, shape, offset).unwrap();
        let expected = reference(&to_f64(&x), shape, offset, &to_f64(&freqs), -1.0);
        assert_close(
            &format!("{tag} backward"),
            &download(&client, &h),
            &to_f32(&expected),
            1e-5,
        );
    }
}

#[test]
fn rope_rejects_odd_head_dim_and_wrong_buffer() {
    let client = common::client();
    let h = upload(&client, &[0.0; 12]);
    let f = upload(&client, &[1.0, 0.5]);
    let shape = RopeShape {
        batch: 1,
        heads: 1,
        seq: 4,
        head_dim: 3,
    };
    let err = rope_forward(&client, &h, &f, shape, 0).unwrap_err();
    assert!(err.to_string().contains("head_dim must be even"), "{err}");
    let shape = RopeShape {
        batch: 1,
        heads: 1,
        seq: 4,
        head_dim: 4,
    };
    let err = rope_forward(&client, &h, &f, shape, 0).unwrap_err();
    assert!(err.to_string().contains("x holds 48 bytes"), "{err}");
    let shape = RopeShape {
        batch: 1,
        heads: 1,
        seq: 2,
        head_dim: 6,
    };
    let err = rope_forward(&client, &h, &f, shape, 0).unwrap_err();
    assert!(err.to_string().contains("inv_freq holds 8 bytes"), "{err}");
}

#[test]
fn rope_reference_backward_matches_finite_differences() {
    let mut rng = Rng::new(19);
    let shape = RopeShape {
        batch: 1,
        heads: 2,
        seq: 3,
        head_dim: 4,
    };
    let x = to_f64(&rng.vec(24, -2.0, 2.0));
    let c = to_f64(&rng.vec(24, -1.0, 1.0));
    let freqs = to_f64(&default_freqs(10_000.0, 4));
    let loss = |x: &[f64]| -> f64 {
        reference(x, shape, 5, &freqs, 1.0)
            .iter()
            .zip(&c)
            .map(|(y, c)| y * c)
            .sum()
    };
    let grad = reference(&c, shape, 5, &freqs, -1.0);
    assert_close_f64("rope fd dx", &grad, &finite_diff(&x, loss), 1e-6);
}
