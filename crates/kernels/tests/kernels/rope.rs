//! RoPE kernels against a host reference in f32, f16 and bf16 storage, and
//! the reference's backward against central finite differences.

use crate::common;

use common::{
    assert_close, assert_close_f64, download_as, finite_diff, round_to, upload, upload_as, Rng,
};
use ferrotron_kernels::rope::{rope_backward_typed, rope_forward, rope_forward_typed, RopeShape};
use ferrotron_kernels::FloatDtype;

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

/// RoPE forward and backward with `dtype` storage (frequencies f32)
/// against the f64 reference on the same (rounded) inputs, within
/// [`common::tolerance`] of the f32 bound.
fn check_rope(dtype: FloatDtype) {
    let client = common::client();
    let tol = common::tolerance(dtype, 1e-5);
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
        let x = round_to(dtype, &rng.vec(n, -2.0, 2.0));
        // Odd cases: arbitrary frequencies (as a scaled RoPE gives), not
        // powers of theta, so the kernel cannot be recomputing them itself.
        let freqs = if index % 2 == 1 {
            rng.vec(shape.head_dim / 2, 0.0, 1.5)
        } else {
            default_freqs(theta, shape.head_dim)
        };
        let tag = format!(
            "rope {} {shape:?} offset {offset} theta {theta} freqs {freqs:?}",
            dtype.name()
        );
        let f = upload(&client, &freqs);

        let h = upload_as(&client, dtype, &x);
        rope_forward_typed(&client, dtype, &h, &f, shape, offset).unwrap();
        let expected = reference(&to_f64(&x), shape, offset, &to_f64(&freqs), 1.0);
        assert_close(
            &format!("{tag} forward"),
            &download_as(&client, dtype, &h),
            &to_f32(&expected),
            tol,
        );

        let h = upload_as(&client, dtype, &x);
        rope_backward_typed(&client, dtype, &h, &f, shape, offset).unwrap();
        let expected = reference(&to_f64(&x), shape, offset, &to_f64(&freqs), -1.0);
        assert_close(
            &format!("{tag} backward"),
            &download_as(&client, dtype, &h),
            &to_f32(&expected),
            tol,
        );
    }
}

#[test]
fn rope_forward_and_backward_match_reference() {
    check_rope(FloatDtype::F32);
}

#[test]
fn rope_f16_and_bf16_match_reference() {
    for dtype in common::low_precision_dtypes(&common::client()) {
        check_rope(dtype);
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
