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

/// `local` summed over `group` (in `f32`, as the gradients are), or
/// `local` itself on one rank.
pub fn group_sum(local: f64, group: &dyn Communicator) -> Result<f64, CommError> {
    if group.world_size() == 1 {
        return Ok(local);
    }
    let mut buf = [local as f32];
    group.all_reduce_sum(&mut buf)?;
    Ok(f64::from(buf[0]))
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
}
