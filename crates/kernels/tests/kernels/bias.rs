//! The bias kernels against f64 host references: the forward add in f32,
//! f16 and bf16 storage, and the bias gradient (column sums into f32) over
//! shapes that cut the rows into one or several chunks.

use crate::common;

use common::{assert_close, download, download_as, round_to, upload, upload_as, zeros, Rng};
use ferrotron_kernels::bias::{bias_add, bias_grad};
use ferrotron_kernels::FloatDtype;

/// Error bound of the f32 column sums (hundreds of terms summed in f32 in
/// another order), relative to the largest magnitude of the reference.
const F32_TOL: f32 = 1e-5;

/// `[rows, cols]`: vector widths 4, 2 and 1, one chunk of rows and
/// several (the rule of `column_sums::ParamChunks`), a ragged column tile.
const SHAPES: [(usize, usize); 5] = [(1, 1), (5, 6), (130, 3), (700, 40), (300, 100)];

fn check_bias(dtype: FloatDtype) {
    let client = common::client();
    let name = dtype.name();
    let mut rng = Rng::new(29);
    for (rows, cols) in SHAPES {
        let y = round_to(dtype, &rng.vec(rows * cols, -2.0, 2.0));
        let bias = rng.vec(cols, -1.0, 1.0);
        let ys = upload_as(&client, dtype, &y);
        bias_add(&client, dtype, &ys, &upload(&client, &bias), rows, cols).unwrap();
        let want: Vec<f32> = y
            .iter()
            .enumerate()
            .map(|(i, &v)| (v as f64 + bias[i % cols] as f64) as f32)
            .collect();
        assert_close(
            &format!("bias add {name} [{rows}, {cols}]"),
            &download_as(&client, dtype, &ys),
            &want,
            common::tolerance(dtype, 1e-7),
        );

        let d_y = round_to(dtype, &rng.vec(rows * cols, -1.0, 1.0));
        let d_bias = zeros(&client, cols);
        bias_grad(
            &client,
            dtype,
            &upload_as(&client, dtype, &d_y),
            &d_bias,
            rows,
            cols,
        )
        .unwrap();
        let want: Vec<f32> = (0..cols)
            .map(|c| (0..rows).map(|r| d_y[r * cols + c] as f64).sum::<f64>() as f32)
            .collect();
        // The inputs are exact in every dtype and the sum is f32 in all.
        assert_close(
            &format!("bias grad {name} [{rows}, {cols}]"),
            &download(&client, &d_bias),
            &want,
            F32_TOL,
        );
    }
}

#[test]
fn bias_add_and_grad_match_reference() {
    check_bias(FloatDtype::F32);
}

#[test]
fn bias_f16_and_bf16_match_reference() {
    for dtype in common::low_precision_dtypes(&common::client()) {
        check_bias(dtype);
    }
}

#[test]
fn bias_grad_gives_the_same_bits_every_run() {
    let client = common::client();
    let (rows, cols) = (700, 40);
    let d_y = upload(&client, &Rng::new(31).vec(rows * cols, -1.0, 1.0));
    let sums = || {
        let d_bias = zeros(&client, cols);
        bias_grad(&client, FloatDtype::F32, &d_y, &d_bias, rows, cols).unwrap();
        download(&client, &d_bias)
    };
    let first = sums();
    assert_eq!(first, sums());
}

#[test]
fn bias_kernels_name_the_short_buffer() {
    let client = common::client();
    let (y, bias) = (zeros(&client, 12), zeros(&client, 3));
    let err = bias_add(&client, FloatDtype::F32, &y, &bias, 3, 4).unwrap_err();
    assert!(err.to_string().contains("bias holds 12 bytes"), "{err}");
    let err = bias_grad(&client, FloatDtype::F32, &bias, &y, 3, 4).unwrap_err();
    assert!(err.to_string().contains("d_y holds 12 bytes"), "{err}");
}
