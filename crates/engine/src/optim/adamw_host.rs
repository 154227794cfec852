//! AdamW's update of one f32 parameter on host buffers as one pass over
//! the parameter, its gradient and both moments, the parameter and the
//! moments written in place, where the tensor operations of
//! [`super::adamw`] make a dozen passes and as many fresh tensors. Every
//! element goes through the same f32 operations in the same order as
//! those tensor operations (the scalars rounded to f32 as flex rounds
//! them), so both give the same values. It serves flex's buffers
//! ([`update`]) and the optimizer state offloaded to host memory on every
//! backend ([`update_slices`], `--offload optimizer`).

#[cfg(feature = "flex")]
use std::any::{Any, TypeId};

#[cfg(feature = "flex")]
use burn::backend::flex::FlexTensor;
#[cfg(feature = "flex")]
use burn::backend::Flex;
#[cfg(feature = "flex")]
use burn::tensor::backend::Backend;
#[cfg(feature = "flex")]
use burn::tensor::{Tensor, TensorPrimitive};
use rayon::prelude::*;

/// Elements one rayon task updates (256 KiB of each of the four f32
/// buffers).
const TASK_ELEMENTS: usize = 1 << 16;

/// The scalars of one AdamW update of one parameter at step `t` (from 1),
/// in f64, as the tensor path applies them (each Burn scalar operation
/// rounds its scalar to the tensor's f32 once).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWCoefficients {
    /// `beta1`.
    pub beta1: f64,
    /// `beta2`.
    pub beta2: f64,
    /// `sqrt(1 - beta2^t)`.
    pub bias2_sqrt: f64,
    /// `eps`.
    pub eps: f64,
    /// `lr / (1 - beta1^t)`.
    pub step_size: f64,
    /// `1 - lr * weight_decay` where the parameter decays, else `None`.
    pub decay: Option<f64>,
}

/// Whether backend `B` is flex, whose f32 tensors the host update takes.
#[cfg(feature = "flex")]
pub(super) fn on_flex<B: Backend>() -> bool {
    TypeId::of::<B>() == TypeId::of::<Flex>()
}

/// `t` as the flex tensor it is, its buffer exactly its elements in order.
///
/// Panics unless `B` is flex (see [`on_flex`]).
#[cfg(feature = "flex")]
fn host<B: Backend>(t: Tensor<B, 1>) -> FlexTensor {
    let p: Box<dyn Any> = Box::new(t.into_primitive().tensor());
    p.downcast::<FlexTensor>()
        .expect("the host AdamW update runs on flex only")
        .to_contiguous()
}

/// The flex tensor `t` as a tensor of backend `B` (flex).
#[cfg(feature = "flex")]
fn back<B: Backend>(t: FlexTensor) -> Tensor<B, 1> {
    let p: Box<dyn Any> = Box::new(t);
    let p = p
        .downcast::<B::FloatTensorPrimitive>()
        .expect("the host AdamW update runs on flex only");
    Tensor::from_primitive(TensorPrimitive::Float(*p))
}

/// The update of one block of elements.
#[inline(always)]
fn update_block(c: &Block, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
    for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        *m = *m * c.beta1 + g * c.one_minus_beta1;
        *v = *v * c.beta2 + g * g * c.one_minus_beta2;
        let denom = v.sqrt() / c.bias2_sqrt + c.eps;
        let delta = *m / denom * c.step_size;
        let kept = match c.decay {
            Some(d) => *p * d,
            None => *p,
        };
        *p = kept - delta;
    }
}

/// [`AdamWCoefficients`] in f32, as flex's scalar operations take them.
struct Block {
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    bias2_sqrt: f32,
    eps: f32,
    step_size: f32,
    decay: Option<f32>,
}

impl From<AdamWCoefficients> for Block {
    fn from(c: AdamWCoefficients) -> Self {
        Self {
            beta1: c.beta1 as f32,
            one_minus_beta1: (1.0 - c.beta1) as f32,
            beta2: c.beta2 as f32,
            one_minus_beta2: (1.0 - c.beta2) as f32,
            bias2_sqrt: c.bias2_sqrt as f32,
            eps: c.eps as f32,
            step_size: c.step_size as f32,
            decay: c.decay.map(|d| d as f32),
        }
    }
}

/// One AdamW update of the f32 values `p` with gradient `g` and moments
/// `m`, `v`, all of the same length, in place (see [`update`] for the
/// formula), split over the CPU's threads.
///
/// Panics if the lengths differ.
pub(super) fn update_slices(
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    c: AdamWCoefficients,
) {
    let n = p.len();
    assert!(
        g.len() == n && m.len() == n && v.len() == n,
        "AdamW: parameter of {n} elements, gradient {}, moments {} and {}",
        g.len(),
        m.len(),
        v.len()
    );
    let block = Block::from(c);
    p.par_chunks_mut(TASK_ELEMENTS)
        .zip(g.par_chunks(TASK_ELEMENTS))
        .zip(m.par_chunks_mut(TASK_ELEMENTS))
        .zip(v.par_chunks_mut(TASK_ELEMENTS))
        .for_each(|(((p, g), m), v)| update_block(&block, p, g, m, v));
}

/// One AdamW update of the rank-1 f32 parameter `p` with gradient `g` and
/// moments `(m, v)` (zeros when `None`, the first update), all on flex
/// and the same length: returns the updated `(p, m, v)`, `p` and the
/// moments updated in their own buffers where nothing else shares them.
/// Per element: `m = beta1 m + (1 - beta1) g`, `v = beta2 v + (1 - beta2)
/// g^2`, `p = p (1 - lr wd) - lr / (1 - beta1^t) * m / (sqrt(v) /
/// sqrt(1 - beta2^t) + eps)`.
///
/// Panics unless `B` is flex ([`on_flex`]) and all four tensors are f32.
#[cfg(feature = "flex")]
pub(super) fn update<B: Backend>(
    p: Tensor<B, 1>,
    g: Tensor<B, 1>,
    moments: (Tensor<B, 1>, Tensor<B, 1>),
    c: AdamWCoefficients,
) -> [Tensor<B, 1>; 3] {
    let (mut p, g) = (host(p), host(g));
    let (mut m, mut v) = (host(moments.0), host(moments.1));
    update_slices(
        p.storage_mut::<f32>(),
        g.storage::<f32>(),
        m.storage_mut::<f32>(),
        v.storage_mut::<f32>(),
        c,
    );
    [back(p), back(m), back(v)]
}
