//! The global L2 norm of gradients spread over the ranks of a job.
//!
//! Each rank adds up the squares of the gradient values it holds, each
//! parameter weighted by its [`NormShares`] (a replicated parameter's
//! gradient is held identically by several ranks and must count once);
//! the sums are added over the DP group (ZeRO-2/3: each rank's chunks)
//! and then over the TP group (each rank's blocks).

use std::collections::HashMap;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};
use ferrotron_engine::optim::grad_squares;

use crate::comm::{CommError, Communicator};

/// The weight of each parameter's squared gradient in this rank's sum:
/// `1 / n` for a parameter held whole by the `n` ranks of a model-parallel
/// group, 1 for one this rank alone holds (absent parameters weigh 1).
pub type NormShares = HashMap<ParamId, f64>;

/// `local` summed over `group` in `f64`, the same on every rank (`local`
/// itself on one rank). The transport carries `f32`, so each rank's value
/// travels as two `f32` (its rounding and the remainder, 48 bits
/// together), all-gathered and added in rank order, where a sum in `f32`
/// would round the global norm and the clipping factor to 1e-7 relative.
pub fn group_sum(local: f64, group: &dyn Communicator) -> Result<f64, CommError> {
    if group.world_size() == 1 {
        return Ok(local);
    }
    let mut all = vec![0.0; 2 * group.world_size()];
    group.all_gather(&f32_pair(local), &mut all)?;
    Ok(all
        .chunks(2)
        .map(|p| f64::from(p[0]) + f64::from(p[1]))
        .sum())
}

/// `x` as `[hi, lo]`: `hi` its `f32` rounding, `lo` the remainder, so
/// that `hi + lo` (in `f64`) holds `x` to 48 bits.
fn f32_pair(x: f64) -> [f32; 2] {
    let hi = x as f32;
    [hi, (x - f64::from(hi)) as f32]
}

/// The L2 norm of gradients of which this rank's part has (weighted)
/// squares summing to `local_squares`, the other parts being held by the
/// other ranks of `group`.
pub fn global_norm(local_squares: f64, group: &dyn Communicator) -> Result<f64, CommError> {
    Ok(group_sum(local_squares, group)?.sqrt())
}

/// The sum over the parameters of `model` of the squares of their
/// gradients in `grads`, each weighted by its share.
pub fn weighted_squares<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &GradientsParams,
    shares: &NormShares,
) -> f64 {
    if shares.is_empty() {
        return grad_squares(model, grads);
    }
    let mut v = Weighted::<B> {
        grads,
        shares,
        sum: 0.0,
        _b: std::marker::PhantomData,
    };
    model.visit(&mut v);
    v.sum
}

struct Weighted<'a, B: AutodiffBackend> {
    grads: &'a GradientsParams,
    shares: &'a NormShares,
    sum: f64,
    _b: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Weighted<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            let squares = g.powf_scalar(2.0).sum().into_scalar().elem::<f64>();
            self.sum += squares * self.shares.get(&param.id).copied().unwrap_or(1.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::SingleProcess;

    #[test]
    fn one_rank_norm_is_the_square_root_in_f64() {
        let n = global_norm(2.0, &SingleProcess).unwrap();
        assert_eq!(n, 2f64.sqrt());
    }

    #[test]
    fn a_pair_of_f32_holds_an_f64_to_48_bits() {
        for x in [1.0 / 3.0, 12_345.678_901_234_5, 1e-9 * std::f64::consts::PI] {
            let [hi, lo] = f32_pair(x);
            let back = f64::from(hi) + f64::from(lo);
            assert!((back - x).abs() <= x * 2f64.powi(-47), "{x} -> {back}");
            // One f32 alone is 1e-8 off.
            assert!((f64::from(hi) - x).abs() > x * 2f64.powi(-40), "{x}");
        }
    }
}
