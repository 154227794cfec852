//! RMSNorm and LayerNorm kernels against host references in f32, f16 and
//! bf16 storage, and the references' backward against central finite
//! differences.

use crate::common;

use common::{
    assert_close, assert_close_f64, download, download_as, finite_diff, round_to, upload_as, zeros,
    zeros_as, Rng,
};
use ferrotron_kernels::norm::layer::{layer_norm_backward_typed, layer_norm_forward_typed};
use ferrotron_kernels::norm::rms::{
    rms_norm_backward_typed, rms_norm_forward, rms_norm_forward_typed,
};
use ferrotron_kernels::FloatDtype;

const EPS: f64 = 1e-5;

/// Row shapes: hidden below, at and above the 32 units per row and the 256
/// units of a cube, odd sizes; row counts below and not a multiple of the 8
/// rows per cube. The last two cut the parameter gradients' rows into
/// several chunks (at least 64 rows each): `[203, 45]` into 3 chunks of 68
/// rows (the last 67) over 2 column tiles of 32 (the second ragged),
/// `[300, 97]` into 4 chunks of 75 rows over 4 tiles.
/// (At hidden = 1, RMSNorm is `sign(x) * weight`; at hidden = 2, LayerNorm
/// is `±weight + bias`: their true `dx` is of order `eps` and comes out of f32
/// cancellation, so the smallest row is 3.)
const SHAPES: [(usize, usize); 7] = [
    (1, 3),
    (3, 7),
    (5, 256),
    (4, 300),
    (17, 1031),
    (203, 45),
    (300, 97),
];

fn to_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// Returns `(y, rstd)`.
fn rms_forward(x: &[f64], w: &[f64], hidden: usize) -> (Vec<f64>, Vec<f64>) {
    let mut y = Vec::new();
    let mut rstd = Vec::new();
    for row in x.chunks(hidden) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / hidden as f64;
        let r = 1.0 / (ms + EPS).sqrt();
        y.extend(row.iter().zip(w).map(|(v, w)| v * r * w));
        rstd.push(r);
    }
    (y, rstd)
}

/// Returns `(dx, d_weight)`.
fn rms_backward(x: &[f64], w: &[f64], dy: &[f64], hidden: usize) -> (Vec<f64>, Vec<f64>) {
    let (_, rstd) = rms_forward(x, w, hidden);
    let mut dx = Vec::new();
    let mut dw = vec![0.0; hidden];
    for (r_i, (row, g)) in x.chunks(hidden).zip(dy.chunks(hidden)).enumerate() {
        let r = rstd[r_i];
        let dot: f64 = (0..hidden).map(|j| g[j] * w[j] * row[j]).sum();
        for j in 0..hidden {
            dx.push(r * g[j] * w[j] - r * r * r / hidden as f64 * row[j] * dot);
            dw[j] += g[j] * row[j] * r;
        }
    }
    (dx, dw)
}

/// Returns `(y, mean, rstd)`.
fn layer_forward(x: &[f64], w: &[f64], b: &[f64], hidden: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut y, mut mean, mut rstd) = (Vec::new(), Vec::new(), Vec::new());
    for row in x.chunks(hidden) {
        let mu = row.iter().sum::<f64>() / hidden as f64;
        let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / hidden as f64;
        let r = 1.0 / (var + EPS).sqrt();
        y.extend((0..hidden).map(|j| (row[j] - mu) * r * w[j] + b[j]));
        mean.push(mu);
        rstd.push(r);
    }
    (y, mean, rstd)
}

/// Returns `(dx, d_weight, d_bias)`.
fn layer_backward(
    x: &[f64],
    w: &[f64],
    dy: &[f64],
    hidden: usize,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let zeros = vec![0.0; hidden];
    let (_, mean, rstd) = layer_forward(x, w, &zeros, hidden);
    let n = hidden as f64;
    let (mut dx, mut dw, mut db) = (Vec::new(), vec![0.0; hidden], vec![0.0; hidden]);
    for (r_i, (row, g)) in x.chunks(hidden).zip(dy.chunks(hidden)).enumerate() {
        let (mu, r) = (mean[r_i], rstd[r_i]);
        let xhat: Vec<f64> = row.iter().map(|v| (v - mu) * r).collect();
        let gw: Vec<f64> = (0..hidden).map(|j| g[j] * w[j]).collect();
        let mean_g = gw.iter().sum::<f64>() / n;
        let mean_gx = (0..hidden).map(|j| gw[j] * xhat[j]).sum::<f64>() / n;
        for j in 0..hidden {
            dx.push(r * (gw[j] - mean_g - xhat[j] * mean_gx));
            dw[j] += g[j] * xhat[j];
            db[j] += g[j];
        }
    }
    (dx, dw, db)
}

/// Asserts that a second run gave the same bits as the first (the
/// parameter gradients are summed in an order fixed by the shapes).
fn assert_same_bits(what: &str, first: &[f32], again: &[f32]) {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(first), bits(again), "{what}: a second run differs");
}

/// RMSNorm forward and backward with `dtype` storage against the f64
/// reference on the same (rounded) inputs. Outputs of `dtype` within
/// [`common::tolerance`] of the f32 bounds; the f32 statistics within the
/// f32 bounds. The backward runs twice and must give the same bits.
fn check_rms_norm(dtype: FloatDtype) {
    let client = common::client();
    let tol = |f32_tol: f32| common::tolerance(dtype, f32_tol);
    let mut rng = Rng::new(3);
    for (rows, hidden) in SHAPES {
        let n = rows * hidden;
        let (x, w, dy) = (
            round_to(dtype, &rng.vec(n, -2.0, 2.0)),
            round_to(dtype, &rng.vec(hidden, 0.5, 1.5)),
            round_to(dtype, &rng.vec(n, -1.0, 1.0)),
        );
        let (xh, wh, dyh) = (
            upload_as(&client, dtype, &x),
            upload_as(&client, dtype, &w),
            upload_as(&client, dtype, &dy),
        );
        let (y, rstd) = (zeros_as(&client, dtype, n), zeros(&client, rows));
        rms_norm_forward_typed(
            &client, dtype, &xh, &wh, &y, &rstd, rows, hidden, EPS as f32,
        )
        .unwrap();
        let (ey, er) = rms_forward(&to_f64(&x), &to_f64(&w), hidden);
        let tag = format!("rms {} [{rows}, {hidden}]", dtype.name());
        assert_close(
            &format!("{tag} y"),
            &download_as(&client, dtype, &y),
            &to_f32(&ey),
            tol(1e-5),
        );
        assert_close(
            &format!("{tag} rstd"),
            &download(&client, &rstd),
            &to_f32(&er),
            1e-5,
        );

        let (dx, dw) = (
            zeros_as(&client, dtype, n),
            zeros_as(&client, dtype, hidden),
        );
        rms_norm_backward_typed(
            &client, dtype, &xh, &wh, &rstd, &dyh, &dx, &dw, rows, hidden,
        )
        .unwrap();
        let (edx, edw) = rms_backward(&to_f64(&x), &to_f64(&w), &to_f64(&dy), hidden);
        assert_close(
            &format!("{tag} dx"),
            &download_as(&client, dtype, &dx),
            &to_f32(&edx),
            tol(1e-4),
        );
        let dw_first = download_as(&client, dtype, &dw);
        assert_close(
            &format!("{tag} d_weight"),
            &dw_first,
            &to_f32(&edw),
            tol(1e-5),
        );

        let dw_again = zeros_as(&client, dtype, hidden);
        rms_norm_backward_typed(
            &client, dtype, &xh, &wh, &rstd, &dyh, &dx, &dw_again, rows, hidden,
        )
        .unwrap();
        let dw_again = download_as(&client, dtype, &dw_again);
        assert_same_bits(&format!("{tag} d_weight"), &dw_first, &dw_again);
    }
}

/// LayerNorm forward and backward with `dtype` storage, as
/// [`check_rms_norm`] (the backward twice too).
fn check_layer_norm(dtype: FloatDtype) {
    let client = common::client();
    let tol = |f32_tol: f32| common::tolerance(dtype, f32_tol);
    let mut rng = Rng::new(5);
    for (rows, hidden) in SHAPES {
        let n = rows * hidden;
        // An offset mean checks the two-pass variance.
        let x = round_to(dtype, &rng.vec(n, 1.0, 5.0));
        let (w, b, dy) = (
            round_to(dtype, &rng.vec(hidden, 0.5, 1.5)),
            round_to(dtype, &rng.vec(hidden, -1.0, 1.0)),
            round_to(dtype, &rng.vec(n, -1.0, 1.0)),
        );
        let (xh, wh, bh, dyh) = (
            upload_as(&client, dtype, &x),
            upload_as(&client, dtype, &w),
            upload_as(&client, dtype, &b),
            upload_as(&client, dtype, &dy),
        );
        let (y, mean, rstd) = (
            zeros_as(&client, dtype, n),
            zeros(&client, rows),
            zeros(&client, rows),
        );
        layer_norm_forward_typed(
            &client, dtype, &xh, &wh, &bh, &y, &mean, &rstd, rows, hidden, EPS as f32,
        )
        .unwrap();
        let (ey, em, er) = layer_forward(&to_f64(&x), &to_f64(&w), &to_f64(&b), hidden);
        let tag = format!("layer {} [{rows}, {hidden}]", dtype.name());
        assert_close(
            &format!("{tag} y"),
            &download_as(&client, dtype, &y),
            &to_f32(&ey),
            tol(1e-4),
        );
        assert_close(
            &format!("{tag} mean"),
            &download(&client, &mean),
            &to_f32(&em),
            1e-5,
        );
        assert_close(
            &format!("{tag} rstd"),
            &download(&client, &rstd),
            &to_f32(&er),
            1e-4,
        );

        let (dx, dw, db) = (
            zeros_as(&client, dtype, n),
            zeros_as(&client, dtype, hidden),
            zeros_as(&client, dtype, hidden),
        );
        layer_norm_backward_typed(
            &client, dtype, &xh, &wh, &mean, &rstd, &dyh, &dx, &dw, &db, rows, hidden,
        )
        .unwrap();
        let (edx, edw, edb) = layer_backward(&to_f64(&x), &to_f64(&w), &to_f64(&dy), hidden);
        assert_close(
            &format!("{tag} dx"),
            &download_as(&client, dtype, &dx),
            &to_f32(&edx),
            tol(1e-4),
        );
        let (dw_first, db_first) = (
            download_as(&client, dtype, &dw),
            download_as(&client, dtype, &db),
        );
        assert_close(
            &format!("{tag} d_weight"),
            &dw_first,
            &to_f32(&edw),
            tol(1e-4),
        );
        assert_close(
            &format!("{tag} d_bias"),
            &db_first,
            &to_f32(&edb),
            tol(1e-5),
        );

        let (dw_again, db_again) = (
            zeros_as(&client, dtype, hidden),
            zeros_as(&client, dtype, hidden),
        );
        layer_norm_backward_typed(
            &client, dtype, &xh, &wh, &mean, &rstd, &dyh, &dx, &dw_again, &db_again, rows, hidden,
        )
        .unwrap();
        let (dw_again, db_again) = (
            download_as(&client, dtype, &dw_again),
            download_as(&client, dtype, &db_again),
        );
        assert_same_bits(&format!("{tag} d_weight"), &dw_first, &dw_again);
        assert_same_bits(&format!("{tag} d_bias"), &db_first, &db_again);
    }
}

#[test]
fn rms_norm_forward_and_backward_match_reference() {
    check_rms_norm(FloatDtype::F32);
}

#[test]
fn rms_norm_f16_and_bf16_match_reference() {
    for dtype in common::low_precision_dtypes(&common::client()) {
        check_rms_norm(dtype);
    }
}

#[test]
fn layer_norm_forward_and_backward_match_reference() {
    check_layer_norm(FloatDtype::F32);
}

#[test]
fn layer_norm_f16_and_bf16_match_reference() {
    for dtype in common::low_precision_dtypes(&common::client()) {
        check_layer_norm(dtype);
    }
}

#[test]
fn norm_launchers_reject_mismatched_buffers() {
    let client = common::client();
    let (x, w, y, r) = (
        zeros(&client, 12),
        zeros(&client, 3),
        zeros(&client, 12),
        zeros(&client, 3),
    );
    let err = rms_norm_forward(&client, &x, &w, &y, &r, 3, 4, 1e-5).unwrap_err();
    assert!(err.to_string().contains("weight holds 12 bytes"), "{err}");
    let err = rms_norm_forward(&client, &x, &w, &y, &r, 0, 4, 1e-5).unwrap_err();
    assert!(err.to_string().contains("rows must be at least 1"), "{err}");
}

#[test]
fn norm_reference_backwards_match_finite_differences() {
    let mut rng = Rng::new(13);
    let (rows, hidden) = (2, 5);
    let x = to_f64(&rng.vec(rows * hidden, -2.0, 2.0));
    let w = to_f64(&rng.vec(hidden, 0.5, 1.5));
    let b = to_f64(&rng.vec(hidden, -1.0, 1.0));
    let c = to_f64(&rng.vec(rows * hidden, -1.0, 1.0));
    let dot = |y: &[f64]| -> f64 { y.iter().zip(&c).map(|(y, c)| y * c).sum() };

    let (dx, dw) = rms_backward(&x, &w, &c, hidden);
    let fd_x = finite_diff(&x, |x| dot(&rms_forward(x, &w, hidden).0));
    let fd_w = finite_diff(&w, |w| dot(&rms_forward(&x, w, hidden).0));
    assert_close_f64("rms fd dx", &dx, &fd_x, 1e-6);
    assert_close_f64("rms fd d_weight", &dw, &fd_w, 1e-6);

    let (dx, dw, db) = layer_backward(&x, &w, &c, hidden);
    let fd_x = finite_diff(&x, |x| dot(&layer_forward(x, &w, &b, hidden).0));
    let fd_w = finite_diff(&w, |w| dot(&layer_forward(&x, w, &b, hidden).0));
    let fd_b = finite_diff(&b, |b| dot(&layer_forward(&x, &w, b, hidden).0));
    assert_close_f64("layer fd dx", &dx, &fd_x, 1e-6);
    assert_close_f64("layer fd d_weight", &dw, &fd_w, 1e-6);
    assert_close_f64("layer fd d_bias", &db, &fd_b, 1e-6);
}
