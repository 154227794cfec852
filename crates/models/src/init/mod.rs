//! Deterministic host-side initialisation.
//!
//! Initial weights are drawn on the host from a seeded generator, so the same
//! seed gives the same model on every backend and on every rank.

use burn::module::Param;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A seeded source of initial parameter values.
pub struct Init<'d, B: Backend> {
    rng: StdRng,
    device: &'d B::Device,
}

impl<'d, B: Backend> Init<'d, B> {
    /// A generator seeded with `seed`, creating tensors on `device`.
    pub fn new(seed: u64, device: &'d B::Device) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            device,
        }
    }

    /// The device tensors are created on.
    pub fn device(&self) -> &'d B::Device {
        self.device
    }

    /// A parameter of the given shape drawn from `N(0, std^2)` (Box-Muller).
    pub fn normal<const D: usize>(&mut self, shape: [usize; D], std: f64) -> Param<Tensor<B, D>> {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n)
            .map(|_| {
                let u1: f64 = 1.0 - self.rng.random::<f64>();
                let u2: f64 = self.rng.random::<f64>();
                let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                (z * std) as f32
            })
            .collect();
        Param::from_data(TensorData::new(values, shape), self.device)
    }

    /// A parameter filled with `value`.
    pub fn constant<const D: usize>(&self, shape: [usize; D], value: f32) -> Param<Tensor<B, D>> {
        Param::from_tensor(Tensor::full(shape, value, self.device))
    }
}
