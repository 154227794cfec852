//! GELU-tanh kernels against an f64 host reference written with `tanh` (the
//! kernel computes the identical `x * sigmoid(2 z)`) in f32, f16 and bf16
//! storage, and the reference's derivative against central finite
//! differences.

use crate::common;

use common::{
    assert_close, assert_close_f64, download_as, finite_diff, round_to, upload_as, zeros_as, Rng,
};
use ferrotron_kernels::gelu::{gelu_tanh_backward, gelu_tanh_forward};
use ferrotron_kernels::FloatDtype;

/// `sqrt(2 / pi)`.
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x.powi(3))).tanh())
}

/// `d gelu / dx` from the tanh form: `0.5 (1 + t) + 0.5 x (1 - t^2) z'`.
fn gelu_derivative(x: f64) -> f64 {
    let t = (SQRT_2_OVER_PI * (x + 0.044715 * x.powi(3))).tanh();
    let dz = SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x);
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dz
}

/// Error bound of the f32 kernels (an `exp` and a division in f32),
/// relative to the reference's largest magnitude.
const F32_TOL: f32 = 1e-5;

/// Runs forward and backward with `dtype` storage on seeded inputs of
/// several lengths (vector widths 4, 2 and 1, several cubes) and compares them with the f64
/// reference on the same rounded inputs, within [`common::tolerance`].
fn check_gelu(dtype: FloatDtype) {
    let client = common::client();
    let tol = common::tolerance(dtype, F32_TOL);
    let name = dtype.name();
    let mut rng = Rng::new(17);
    for len in [1usize, 6, 37, 256, 1027, 4100] {
        let x = round_to(dtype, &rng.vec(len, -6.0, 6.0));
        let d_y = round_to(dtype, &rng.vec(len, -1.0, 1.0));
        let (xs, dys) = (
            upload_as(&client, dtype, &x),
            upload_as(&client, dtype, &d_y),
        );
        let y = zeros_as(&client, dtype, len);
        gelu_tanh_forward(&client, dtype, &xs, &y, len).unwrap();
        let want: Vec<f32> = x.iter().map(|&v| gelu(v as f64) as f32).collect();
        assert_close(
            &format!("gelu {name} forward len {len}"),
            &download_as(&client, dtype, &y),
            &want,
            tol,
        );

        let d_x = zeros_as(&client, dtype, len);
        gelu_tanh_backward(&client, dtype, &xs, &dys, &d_x, len).unwrap();
        let want: Vec<f32> = x
            .iter()
            .zip(&d_y)
            .map(|(&v, &g)| (g as f64 * gelu_derivative(v as f64)) as f32)
            .collect();
        assert_close(
            &format!("gelu {name} backward len {len}"),
            &download_as(&client, dtype, &d_x),
            &want,
            tol,
        );
    }
}

#[test]
fn gelu_forward_and_backward_match_reference() {
    check_gelu(FloatDtype::F32);
}

#[test]
fn gelu_f16_and_bf16_match_reference() {
    for dtype in common::low_precision_dtypes(&common::client()) {
        check_gelu(dtype);
    }
}

/// Where the exponential overflows (`x` below about -10) or vanishes, the
/// gate is exactly 0 or 1: the output is `0` or `x` and the derivative `0`
/// or `1`, with no NaN from `inf * 0`.
#[test]
fn gelu_saturates_to_exact_values_without_nan() {
    let client = common::client();
    let x = [-60.0f32, -12.0, 12.0, 60.0];
    let d_y = [1.0f32; 4];
    let mut dtypes = vec![FloatDtype::F32];
    dtypes.extend(common::low_precision_dtypes(&client));
    for dtype in dtypes {
        let (xs, dys) = (
            upload_as(&client, dtype, &x),
            upload_as(&client, dtype, &d_y),
        );
        let (y, d_x) = (zeros_as(&client, dtype, 4), zeros_as(&client, dtype, 4));
        gelu_tanh_forward(&client, dtype, &xs, &y, 4).unwrap();
        gelu_tanh_backward(&client, dtype, &xs, &dys, &d_x, 4).unwrap();
        let name = dtype.name();
        assert_eq!(
            download_as(&client, dtype, &y),
            [0.0, 0.0, 12.0, 60.0],
            "{name}"
        );
        assert_eq!(
            download_as(&client, dtype, &d_x),
            [0.0, 0.0, 1.0, 1.0],
            "{name}"
        );
    }
}

#[test]
fn gelu_rejects_short_buffers() {
    let client = common::client();
    let dtype = FloatDtype::F16;
    let (x, y) = (zeros_as(&client, dtype, 8), zeros_as(&client, dtype, 7));
    let err = gelu_tanh_forward(&client, dtype, &x, &y, 8).unwrap_err();
    assert!(
        err.to_string()
            .contains("y holds 14 bytes, expected 8 elements of 2 bytes"),
        "{err}"
    );
}

#[test]
fn gelu_reference_derivative_matches_finite_differences() {
    let x: Vec<f64> = Rng::new(19)
        .vec(7, -4.0, 4.0)
        .iter()
        .map(|&v| v as f64)
        .collect();
    let w: Vec<f64> = Rng::new(23)
        .vec(7, -1.0, 1.0)
        .iter()
        .map(|&v| v as f64)
        .collect();
    let loss = |x: &[f64]| -> f64 { x.iter().zip(&w).map(|(&v, w)| gelu(v) * w).sum() };
    let grad: Vec<f64> = x
        .iter()
        .zip(&w)
        .map(|(&v, w)| w * gelu_derivative(v))
        .collect();
    assert_close_f64("fd gelu", &grad, &finite_diff(&x, loss), 1e-6);
}
