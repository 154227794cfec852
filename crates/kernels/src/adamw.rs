//! AdamW's update of one f32 parameter in one pass: each unit reads the
//! parameter `p`, its gradient `g` and both moments `m`, `v` at its
//! elements and writes `p`, `m` and `v` back in place, where the same
//! update as Burn tensor operations is about a dozen element-wise kernels,
//! each a launch and a full pass over f32 buffers. Every element goes
//! through the same f32 operations in the same order as those tensor
//! operations (`AdamW::update_tensors` in ferrotron-engine), with the
//! step's scalars rounded to f32 as Burn rounds a scalar operand
//! ([`AdamWScalars::from_f64`]). Loads and stores are vectorized by 4 or 2
//! elements when the length allows.
//!
//! So the results are Burn's bit for bit where the device compiler keeps
//! every multiply and add apart (lavapipe does); NVRTC and HIP's compiler
//! contract `a * b + c` into one FMA by default, which rounds once where
//! Burn's separate kernels round twice, so there the moments and the
//! parameter may differ from Burn's in their last bits.

use crate::check::{self, ShapeError};
use crate::elementwise::geometry;
use cubecl::prelude::*;
use cubecl::server::Handle;

/// The scalars of one AdamW step at step `t` (from 1) with learning rate
/// `lr`, in f32 as the kernel takes them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWScalars {
    /// `beta1`, the first moment's decay.
    pub beta1: f32,
    /// `1 - beta1`.
    pub one_minus_beta1: f32,
    /// `beta2`, the second moment's decay.
    pub beta2: f32,
    /// `1 - beta2`.
    pub one_minus_beta2: f32,
    /// `sqrt(1 - beta2^t)`.
    pub bias2_sqrt: f32,
    /// `eps`, added to the denominator.
    pub eps: f32,
    /// `lr / (1 - beta1^t)`.
    pub step_size: f32,
    /// `1 - lr * weight_decay` where the parameter decays, else `None`.
    pub decay: Option<f32>,
}

impl AdamWScalars {
    /// The scalars from their f64 values, each rounded once to the nearest
    /// f32, `1 - beta1` and `1 - beta2` formed in f64 first: what Burn's
    /// scalar operations (`mul_scalar(1.0 - beta1)` and the like) pass to
    /// their kernels, so the kernel computes with the same operands.
    pub fn from_f64(
        beta1: f64,
        beta2: f64,
        bias2_sqrt: f64,
        eps: f64,
        step_size: f64,
        decay: Option<f64>,
    ) -> Self {
        Self {
            beta1: beta1 as f32,
            one_minus_beta1: (1.0 - beta1) as f32,
            beta2: beta2 as f32,
            one_minus_beta2: (1.0 - beta2) as f32,
            bias2_sqrt: bias2_sqrt as f32,
            eps: eps as f32,
            step_size: step_size as f32,
            decay: decay.map(|d| d as f32),
        }
    }
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn adamw_kernel<N: Size>(
    p: &mut Array<Vector<f32, N>>,
    g: &Array<Vector<f32, N>>,
    m: &mut Array<Vector<f32, N>>,
    v: &mut Array<Vector<f32, N>>,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    bias2_sqrt: f32,
    eps: f32,
    step_size: f32,
    decay: f32,
    #[comptime] decays: bool,
) {
    if ABSOLUTE_POS < p.len() {
        let i = ABSOLUTE_POS;
        let grad = g[i];
        // The order of `update_tensors`: m b1 + g (1 - b1); v b2 + (g g)
        // (1 - b2); sqrt(v) / sqrt(1 - b2^t) + eps; m / denom * step_size;
        // p (1 - lr wd) - delta.
        let m_new = m[i] * Vector::new(beta1) + grad * Vector::new(one_minus_beta1);
        let v_new = v[i] * Vector::new(beta2) + grad * grad * Vector::new(one_minus_beta2);
        let denom = Vector::sqrt(v_new) / Vector::new(bias2_sqrt) + Vector::new(eps);
        let delta = m_new / denom * Vector::new(step_size);
        let mut kept = p[i];
        if decays {
            kept *= Vector::new(decay);
        }
        p[i] = kept - delta;
        m[i] = m_new;
        v[i] = v_new;
    }
}

/// One AdamW step of the f32 parameter `p` with gradient `g` and moments
/// `m`, `v`, in place, for `i < len`:
/// `m = beta1 m + (1 - beta1) g`, `v = beta2 v + (1 - beta2) g^2`,
/// `p = p (1 - lr wd) - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 -
/// beta2^t) + eps)` (the decay factor only where `c.decay` is given).
///
/// The four buffers hold `len` f32 values each (a rank-1 parameter or a
/// contiguous shard of one); `p`, `m` and `v` are overwritten and must not
/// alias each other or `g`, nor be read by anything else until the update
/// is done (the launch is ordered on the client's stream like any other).
pub fn adamw_update<R: Runtime>(
    client: &ComputeClient<R>,
    p: &Handle,
    g: &Handle,
    m: &Handle,
    v: &Handle,
    len: usize,
    c: AdamWScalars,
) -> Result<(), ShapeError> {
    const OP: &str = "adamw_update";
    check::nonzero(OP, "len", len)?;
    check::elems_4b(OP, "p", p, len)?;
    check::elems_4b(OP, "g", g, len)?;
    check::elems_4b(OP, "m", m, len)?;
    check::elems_4b(OP, "v", v, len)?;
    let at = geometry(client, len);
    // SAFETY: the four buffers hold `len` f32 values (checked above); the
    // array lengths are given in scalars, so the kernel sees `len /
    // vector` vectors and guards its index against that.
    unsafe {
        adamw_kernel::launch_unchecked::<R>(
            client,
            at.cube_count,
            at.cube_dim,
            at.vector,
            ArrayArg::from_raw_parts(p.clone(), len),
            ArrayArg::from_raw_parts(g.clone(), len),
            ArrayArg::from_raw_parts(m.clone(), len),
            ArrayArg::from_raw_parts(v.clone(), len),
            c.beta1,
            c.one_minus_beta1,
            c.beta2,
            c.one_minus_beta2,
            c.bias2_sqrt,
            c.eps,
            c.step_size,
            c.decay.unwrap_or(1.0),
            c.decay.is_some(),
        );
    }
    Ok(())
}
