//! Flex tensors as dense f32 host buffers: what the element-wise and norm
//! operations of this module read and write.

use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Shape, TensorData};
use rayon::prelude::*;

/// Elements one rayon task of an element-wise pass covers (64 KiB of f32).
pub const TASK_ELEMENTS: usize = 1 << 14;

/// Whether every tensor is f32 (what the CPU operations take; the callers
/// run the reference for other dtypes).
pub fn all_f32(tensors: &[&FlexTensor]) -> bool {
    tensors.iter().all(|t| t.dtype() == DType::F32)
}

/// `t` (f32) with its elements in row-major order filling its whole
/// buffer, so that `storage::<f32>()` is the tensor: `t` itself when it
/// already is, a contiguous copy when it is a strided or narrowed view.
///
/// Panics when `t` is not f32 (the callers check the dtype first).
pub fn dense(t: FlexTensor) -> FlexTensor {
    assert_eq!(
        t.dtype(),
        DType::F32,
        "the CPU fused operations take f32 tensors"
    );
    t.to_contiguous()
}

/// `t` (f32) as it lies when all its strides are positive (the GEMM reads
/// such views in place), else a contiguous copy.
///
/// Panics when `t` is not f32 (the callers check the dtype first).
pub fn positive_strides(t: FlexTensor) -> FlexTensor {
    assert_eq!(
        t.dtype(),
        DType::F32,
        "the CPU fused operations take f32 tensors"
    );
    if t.layout().has_positive_strides() {
        t
    } else {
        t.to_contiguous()
    }
}

/// A new row-major f32 tensor of `shape` holding `values`.
pub fn tensor(values: Vec<f32>, shape: Shape) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape))
}

/// The last dimension of `t` (1 for a scalar).
pub fn last_dim(t: &FlexTensor) -> usize {
    t.layout().shape().last().copied().unwrap_or(1)
}

/// The `[batch, heads, len, d]` tensor whose buffer `values` holds it in
/// sequence-major order, `[batch, len, heads, d]` (a transposed view): its
/// `swap_dims(1, 2)` is contiguous, so the decoder's head merge
/// (`[batch, len, heads * d]`) needs no copy.
pub fn seq_major_view(values: Vec<f32>, [batch, heads, len, d]: [usize; 4]) -> FlexTensor {
    tensor(values, [batch, len, heads, d].into()).transpose(1, 2)
}

/// [`seq_major_view`] of the head-major (row-major `[batch, heads, len,
/// d]`) `values`, rearranged one row of `d` at a time.
pub fn seq_major(values: &[f32], dims: [usize; 4]) -> FlexTensor {
    let [_, heads, len, d] = dims;
    let mut out = vec![0.0f32; values.len()];
    if !out.is_empty() {
        let position = heads * d;
        let per_task = (TASK_ELEMENTS / position).max(1);
        out.par_chunks_mut(per_task * position)
            .enumerate()
            .for_each(|(task, chunk)| {
                for (i, dst) in chunk.chunks_mut(position).enumerate() {
                    let flat = task * per_task + i;
                    let (b, p) = (flat / len, flat % len);
                    for (h, dst) in dst.chunks_mut(d).enumerate() {
                        let src = ((b * heads + h) * len + p) * d;
                        dst.copy_from_slice(&values[src..src + d]);
                    }
                }
            });
    }
    seq_major_view(out, dims)
}

/// Panics unless `a` and `b` have the same shape.
pub fn same_shape(a: &FlexTensor, b: &FlexTensor, what: &str) {
    assert_eq!(
        a.layout().shape(),
        b.layout().shape(),
        "{what}: operands of different shapes"
    );
}
