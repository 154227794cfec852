//! Global-norm gradient clipping, as `torch.nn.utils.clip_grad_norm_`.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};

/// Sums the squares of every parameter's gradient, as one tensor `[1]`.
struct SquaredNorm<'a, B: AutodiffBackend> {
    grads: &'a GradientsParams,
    sum: Option<Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for SquaredNorm<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            let sq = g.powf_scalar(2.0).sum();
            self.sum = Some(match self.sum.take() {
                Some(acc) => acc + sq,
                None => sq,
            });
        }
    }
}

/// The sum of the squares of all gradients of `module` in `grads` (0 if none).
pub fn grad_squares<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &GradientsParams,
) -> f64 {
    let mut v = SquaredNorm::<B> { grads, sum: None };
    module.visit(&mut v);
    v.sum.map(|s| s.into_scalar().elem::<f64>()).unwrap_or(0.0)
}

/// The L2 norm of all gradients of `module` taken together (0 if none).
pub fn global_grad_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &GradientsParams,
) -> f64 {
    grad_squares(module, grads).sqrt()
}

/// Multiplies every gradient of `module` in `grads` by `factor`.
pub fn scale_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut GradientsParams,
    factor: f64,
) {
    let mut v = Scale::<B> {
        grads,
        factor,
        _b: std::marker::PhantomData,
    };
    module.visit(&mut v);
}

/// Multiplies every gradient of `module` by `factor`.
struct Scale<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    factor: f64,
    _b: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            self.grads.register(param.id, g.mul_scalar(self.factor));
        }
    }
}

/// The factor that scales gradients of global L2 norm `norm` down to at
/// most `max_norm`, as PyTorch computes it (`max_norm / (norm + 1e-6)`);
/// `None` when no clipping is needed (the factor would be >= 1).
pub fn clip_factor(norm: f64, max_norm: f64) -> Option<f64> {
    let factor = max_norm / (norm + 1e-6);
    (factor < 1.0).then_some(factor)
}

/// Clips the gradients to a global L2 norm of at most `max_norm`.
///
/// Returns the norm before clipping. As in PyTorch, gradients are scaled by
/// `max_norm / (norm + 1e-6)` when that factor is below one.
pub fn clip_global_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut GradientsParams,
    max_norm: f64,
) -> f64 {
    let norm = global_grad_norm(module, grads);
    if let Some(factor) = clip_factor(norm, max_norm) {
        scale_grads(module, grads, factor);
    }
    norm
}
