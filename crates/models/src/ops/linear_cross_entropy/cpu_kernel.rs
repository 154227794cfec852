//! The chunked linear + cross-entropy (see `ops::linear_cross_entropy`)
//! on the flex backend's host buffers, in f32: per block of rows, one GEMM
//! writes the logits into a buffer reused by every block, one pass per row
//! turns them into the loss and, when training, the gradient of the logits
//! in place (`max`, `exp` summed, scaled: `ops::cpu::math::softmax_scaled`),
//! and two more GEMMs form that block's `d_x` rows and add its share to
//! `d_w` in place. Burn's tensor operations would allocate a fresh
//! `[block, vocab]` tensor for each of the softmax's five passes and a
//! fresh `d_w` per block (README's step profile: the zeroing of fresh pages
//! and the passes over memory were a third of the head's time).

use burn::backend::flex::FlexTensor;
use rayon::prelude::*;

use crate::ops::cpu::buffers::{positive_strides, tensor};
use crate::ops::cpu::gemm::{matmul, MatView, Threads};
use crate::ops::cpu::math::{log_sum_exp, softmax_scaled};

/// An f32 rank-2 flex tensor and the view of its elements in its buffer
/// (a copy first when its strides are not all positive).
fn matrix(t: FlexTensor) -> (FlexTensor, MatView) {
    let t = positive_strides(t);
    let layout = t.layout();
    let dims = layout.shape().dims::<2>();
    let strides = layout.strides();
    let view = MatView {
        rows: dims[0],
        cols: dims[1],
        row_stride: strides[0] as usize,
        col_stride: strides[1] as usize,
        offset: layout.start_offset(),
    };
    (t, view)
}

/// One row's negative log-likelihood `lse(row) - row[target]` (0 for a
/// negative, ignored, target); with `grads`, the row becomes
/// `(softmax(row) - onehot(target)) * per_kept` (all zeros when ignored).
fn row_loss(row: &mut [f32], target: i64, per_kept: f32, grads: bool) -> f64 {
    let Ok(t) = usize::try_from(target) else {
        if grads {
            row.fill(0.0);
        }
        return 0.0;
    };
    assert!(
        t < row.len(),
        "target token {t} outside the vocabulary of {}",
        row.len()
    );
    let picked = row[t];
    let lse = if grads {
        let lse = softmax_scaled(row, per_kept);
        row[t] -= per_kept;
        lse
    } else {
        log_sum_exp(row)
    };
    (lse - picked) as f64
}

/// The mean cross-entropy (nats per kept token, f32 `[1]`) of `x`
/// `[rows, hidden]` times `weight` `[hidden, vocab]` against `targets`
/// `[rows]` (negative: ignored), `block` rows at a time, and with `grads`
/// the gradients `d_x` `[rows, hidden]` and `d_w` `[hidden, vocab]` (laid
/// out as `weight` is: a transposed embedding's gradient comes back
/// transposed, no copy) for an upstream gradient of 1. Both inputs f32
/// (others are converted); the loss is summed in f64.
pub fn linear_cross_entropy_blocks(
    x: FlexTensor,
    weight: FlexTensor,
    targets: FlexTensor,
    block: usize,
    grads: bool,
) -> (FlexTensor, Option<(FlexTensor, FlexTensor)>) {
    let (x, x_view) = matrix(x);
    let (weight, w_view) = matrix(weight);
    let (rows, hidden, vocab) = (x_view.rows, x_view.cols, w_view.cols);
    assert_eq!(
        w_view.rows, hidden,
        "linear cross-entropy: x has {hidden} columns, the weight {} rows",
        w_view.rows
    );
    let targets: Vec<i64> = targets.into_data().iter::<i64>().collect();
    assert_eq!(
        targets.len(),
        rows,
        "linear cross-entropy: {rows} rows, {} targets",
        targets.len()
    );
    assert!(block > 0, "linear cross-entropy: blocks of 0 rows");
    let (xs, ws) = (x.storage::<f32>(), weight.storage::<f32>());
    let kept = targets.iter().filter(|&&t| t >= 0).count();
    let per_kept = 1.0 / kept.max(1) as f32;
    let mut logits = vec![0.0f32; block.min(rows) * vocab];
    let (mut d_x, mut d_w) = if grads {
        (vec![0.0f32; rows * hidden], vec![0.0f32; hidden * vocab])
    } else {
        (Vec::new(), Vec::new())
    };
    // `d_w` in the weight's own layout.
    let w_column_major = w_view.row_stride == 1 && w_view.col_stride != 1;
    let d_w_view = if w_column_major {
        MatView::row_major(vocab, hidden).t()
    } else {
        MatView::row_major(hidden, vocab)
    };
    let mut nll = 0.0f64;
    for start in (0..rows).step_by(block) {
        let len = block.min(rows - start);
        let x_block = x_view.rows_from(start, len);
        let block_view = MatView::row_major(len, vocab);
        let buf = &mut logits[..len * vocab];
        matmul(
            buf,
            block_view,
            false,
            (xs, x_block),
            (ws, w_view),
            Threads::All,
        );
        nll += buf
            .par_chunks_mut(vocab)
            .zip(&targets[start..start + len])
            .map(|(row, &t)| row_loss(row, t, per_kept, grads))
            .sum::<f64>();
        if grads {
            let d_x_block = MatView::row_major(rows, hidden).rows_from(start, len);
            matmul(
                &mut d_x,
                d_x_block,
                false,
                (buf, block_view),
                (ws, w_view.t()),
                Threads::All,
            );
            matmul(
                &mut d_w,
                d_w_view,
                start > 0,
                (xs, x_block.t()),
                (buf, block_view),
                Threads::All,
            );
        }
    }
    let loss = tensor(vec![(nll * per_kept as f64) as f32], [1].into());
    let grads = grads.then(|| {
        let d_w = if w_column_major {
            tensor(d_w, [vocab, hidden].into()).transpose(0, 1)
        } else {
            tensor(d_w, [hidden, vocab].into())
        };
        (tensor(d_x, [rows, hidden].into()), d_w)
    });
    (loss, grads)
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::{Int, Tensor, TensorData};

    use super::*;
    use crate::ops::linear_cross_entropy_reference;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7 + seed * 13) % 29) as f32 / 9.0 - 1.5)
            .collect()
    }

    fn tensor(v: Vec<f32>, shape: [usize; 2]) -> Tensor<Flex, 2> {
        Tensor::from_data(TensorData::new(v, shape), &Default::default())
    }

    fn read(t: FlexTensor) -> Vec<f32> {
        t.into_data().to_vec::<f32>().unwrap()
    }

    fn prim(t: Tensor<Flex, 2>) -> FlexTensor {
        t.into_primitive().tensor()
    }

    /// The reference's loss and gradients (Burn autodiff over the whole logits).
    fn reference(
        x: &Tensor<Flex, 2>,
        w: &Tensor<Flex, 2>,
        targets: &[i64],
    ) -> (f32, Vec<f32>, Vec<f32>) {
        type Ad = burn::backend::Autodiff<Flex>;
        let x = Tensor::<Ad, 2>::from_data(x.to_data(), &Default::default()).require_grad();
        let w = Tensor::<Ad, 2>::from_data(w.to_data(), &Default::default()).require_grad();
        let t = Tensor::<Ad, 1, Int>::from_data(
            TensorData::new(targets.to_vec(), [targets.len()]),
            &Default::default(),
        );
        let loss = linear_cross_entropy_reference(x.clone(), w.clone(), t);
        let g = loss.backward();
        let v = |t: Tensor<Flex, 2>| t.into_data().to_vec::<f32>().unwrap();
        (
            loss.into_scalar(),
            v(x.grad(&g).unwrap()),
            v(w.grad(&g).unwrap()),
        )
    }

    fn assert_close(got: &[f32], want: &[f32], what: &str) {
        let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * scale.max(1e-3),
                "{what}[{i}]: {g} vs {w}"
            );
        }
        assert_eq!(got.len(), want.len(), "{what}: length");
    }

    #[test]
    fn blocks_match_the_reference_with_ignored_targets_and_a_transposed_weight() {
        let (rows, hidden, vocab) = (11, 6, 37);
        let x = tensor(values(rows * hidden, 1), [rows, hidden]);
        let w = tensor(values(hidden * vocab, 2), [hidden, vocab]);
        // The same weight stored as a `[vocab, hidden]` embedding, read transposed.
        let w_t = tensor(values(hidden * vocab, 2), [hidden, vocab])
            .transpose()
            .into_data();
        let embedding = tensor(w_t.to_vec::<f32>().unwrap(), [vocab, hidden]).transpose();
        let targets: Vec<i64> = vec![3, -100, 36, 0, 5, -1, 17, 17, 2, 30, 9];
        let (loss, d_x, d_w) = reference(&x, &w, &targets);
        let ids = || {
            Tensor::<Flex, 1, Int>::from_data(
                TensorData::new(targets.clone(), [rows]),
                &Default::default(),
            )
            .into_primitive()
        };
        for (weight, how) in [(w.clone(), "row-major"), (embedding, "transposed")] {
            for block in [1, 4, 11, 64] {
                let what = format!("{how} weight, blocks of {block}");
                let (got, grads) = linear_cross_entropy_blocks(
                    prim(x.clone()),
                    prim(weight.clone()),
                    ids(),
                    block,
                    true,
                );
                let got = read(got)[0];
                assert!(
                    (got - loss).abs() < 1e-5 * loss.abs(),
                    "{what}: loss {got} vs {loss}"
                );
                let (g_x, g_w) = grads.unwrap();
                assert_close(&read(g_x), &d_x, &format!("{what}: d_x"));
                assert_eq!(
                    g_w.layout().strides()[0] == 1,
                    how == "transposed",
                    "{what}: d_w layout"
                );
                assert_close(&read(g_w), &d_w, &format!("{what}: d_w"));
                let (alone, none) = linear_cross_entropy_blocks(
                    prim(x.clone()),
                    prim(weight.clone()),
                    ids(),
                    block,
                    false,
                );
                assert!(none.is_none());
                assert!(
                    (read(alone)[0] - loss).abs() < 1e-5 * loss.abs(),
                    "{what}: forward alone"
                );
            }
        }
    }

    #[test]
    fn every_target_ignored_gives_zero_loss_and_gradients() {
        let x = tensor(values(4 * 3, 3), [4, 3]);
        let w = tensor(values(3 * 5, 4), [3, 5]);
        let ids = Tensor::<Flex, 1, Int>::from_data(
            TensorData::new(vec![-1i64; 4], [4]),
            &Default::default(),
        );
        let (loss, grads) =
            linear_cross_entropy_blocks(prim(x), prim(w), ids.into_primitive(), 2, true);
        assert_eq!(read(loss), vec![0.0]);
        let (g_x, g_w) = grads.unwrap();
        assert!(read(g_x).iter().chain(&read(g_w)).all(|&g| g == 0.0));
    }
}
