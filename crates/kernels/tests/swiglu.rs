//! SwiGLU kernels against a host reference, and the reference's backward
//! against central finite differences.

mod common;

use common::{assert_close, assert_close_f64, download, finite_diff, upload, zeros, Rng};
use ferrotron_kernels::swiglu::{swiglu_backward, swiglu_forward};

fn silu(g: f64) -> f64 {
    g / (1.0 + (-g).exp())
}

fn reference_forward(gate: &[f64], up: &[f64]) -> Vec<f64> {
    gate.iter().zip(up).map(|(&g, &u)| silu(g) * u).collect()
}

/// Returns `(d_gate, d_up)`.
fn reference_backward(gate: &[f64], up: &[f64], d_out: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let mut d_gate = Vec::with_capacity(gate.len());
    let mut d_up = Vec::with_capacity(gate.len());
    for i in 0..gate.len() {
        let s = 1.0 / (1.0 + (-gate[i]).exp());
        d_gate.push(d_out[i] * up[i] * s * (1.0 + gate[i] * (1.0 - s)));
        d_up.push(d_out[i] * silu(gate[i]));
    }
    (d_gate, d_up)
}

fn to_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

#[test]
fn swiglu_forward_and_backward_match_reference() {
    let client = common::client();
    let mut rng = Rng::new(7);
    // Lengths divisible by 4, by 2 only, and odd (vector widths 4, 2, 1),
    // and one spanning several cubes with a partial last cube.
    for len in [1usize, 6, 37, 256, 1027, 4100] {
        let gate = rng.vec(len, -8.0, 8.0);
        let up = rng.vec(len, -2.0, 2.0);
        let d_out = rng.vec(len, -1.0, 1.0);
        let (g, u, dy) = (
            upload(&client, &gate),
            upload(&client, &up),
            upload(&client, &d_out),
        );
        let out = zeros(&client, len);
        swiglu_forward(&client, &g, &u, &out, len).unwrap();
        let expected = reference_forward(&to_f64(&gate), &to_f64(&up));
        assert_close(
            &format!("swiglu forward len {len}"),
            &download(&client, &out),
            &to_f32(&expected),
            1e-5,
        );

        let (d_gate, d_up) = (zeros(&client, len), zeros(&client, len));
        swiglu_backward(&client, &g, &u, &dy, &d_gate, &d_up, len).unwrap();
        let (eg, eu) = reference_backward(&to_f64(&gate), &to_f64(&up), &to_f64(&d_out));
        assert_close(
            &format!("swiglu d_gate len {len}"),
            &download(&client, &d_gate),
            &to_f32(&eg),
            1e-5,
        );
        assert_close(
            &format!("swiglu d_up len {len}"),
            &download(&client, &d_up),
            &to_f32(&eu),
            1e-5,
        );
    }
}

#[test]
fn swiglu_rejects_mismatched_buffers() {
    let client = common::client();
    let (a, b, out) = (zeros(&client, 8), zeros(&client, 7), zeros(&client, 8));
    let err = swiglu_forward(&client, &a, &b, &out, 8).unwrap_err();
    assert!(err.to_string().contains("up holds 28 bytes"), "{err}");
}

#[test]
fn swiglu_reference_backward_matches_finite_differences() {
    let mut rng = Rng::new(11);
    let n = 5;
    let gate = to_f64(&rng.vec(n, -3.0, 3.0));
    let up = to_f64(&rng.vec(n, -2.0, 2.0));
    let w = to_f64(&rng.vec(n, -1.0, 1.0));
    let loss = |gate: &[f64], up: &[f64]| -> f64 {
        reference_forward(gate, up)
            .iter()
            .zip(&w)
            .map(|(y, w)| y * w)
            .sum()
    };
    let (d_gate, d_up) = reference_backward(&gate, &up, &w);
    assert_close_f64(
        "fd d_gate",
        &d_gate,
        &finite_diff(&gate, |g| loss(g, &up)),
        1e-6,
    );
    assert_close_f64(
        "fd d_up",
        &d_up,
        &finite_diff(&up, |u| loss(&gate, u)),
        1e-6,
    );
}
