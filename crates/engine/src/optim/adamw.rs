//! AdamW with decoupled weight decay, following `torch.optim.AdamW` exactly.

use std::collections::HashMap;

use burn::module::{AutodiffModule, ModuleMapper, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

use super::adamw_host::AdamWCoefficients;

/// AdamW hyper-parameters (the learning rate comes per step from the schedule).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    /// Exponential decay of the first moment.
    pub beta1: f64,
    /// Exponential decay of the second moment.
    pub beta2: f64,
    /// Added to the denominator for numerical stability.
    pub eps: f64,
    /// Decoupled weight decay, applied to matrices and embeddings only
    /// (parameters of rank >= 2); norm gains and biases are not decayed.
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        }
    }
}

/// First and second moments of one parameter, flattened to rank 1.
struct Moments<B: Backend> {
    m: Tensor<B, 1>,
    v: Tensor<B, 1>,
}

/// First and second moments of one parameter in host memory (the
/// optimizer state offloaded, `--offload optimizer`).
struct HostMoments {
    m: Vec<f32>,
    v: Vec<f32>,
}

/// A backend's one-pass AdamW update (a fused kernel): given the rank-1
/// f32 parameter `p`, its gradient `g` and moments `m`, `v` (all of one
/// length) and the step's scalars, returns the updated `[p, m, v]`
/// through the f32 operations of [`AdamW::update_flat`]'s tensor
/// operations in their order (the same bits where the device compiler
/// fuses no multiply-add into an FMA, as on lavapipe; CUDA's may). It
/// may write the buffers of `p`, `m` and `v` in place where nothing else
/// holds them. Installed with [`AdamW::use_fused`]; the CubeCL backends
/// supply theirs (`ferrotron_models::ops::KernelBackend::fused_adamw`).
pub type FusedAdamW<B> = fn(
    p: Tensor<B, 1>,
    g: Tensor<B, 1>,
    m: Tensor<B, 1>,
    v: Tensor<B, 1>,
    coefficients: AdamWCoefficients,
) -> [Tensor<B, 1>; 3];

/// AdamW optimizer state: the step count and the moments of every parameter.
///
/// `B` is the inner (non-autodiff) backend the moments live on; the
/// moments of the parameters updated by [`AdamW::update_host`] live in
/// host memory instead.
pub struct AdamW<B: Backend> {
    config: AdamWConfig,
    step: u64,
    moments: HashMap<ParamId, Moments<B>>,
    /// Moments of the parameters updated on the host.
    host: HashMap<ParamId, HostMoments>,
    /// The backend's one-pass update, where installed.
    fused: Option<FusedAdamW<B>>,
    /// Parameter updates that ran `fused`.
    fused_updates: u64,
}

impl<B: Backend> AdamW<B> {
    /// A fresh optimizer with no state.
    pub fn new(config: AdamWConfig) -> Self {
        Self {
            config,
            step: 0,
            moments: HashMap::new(),
            host: HashMap::new(),
            fused: None,
            fused_updates: 0,
        }
    }

    /// Runs [`AdamW::update_flat`] through `update` (a backend's fused
    /// kernel, see [`FusedAdamW`]) for f32 parameters and moments; `None`
    /// restores the default (flex's host pass in f32, Burn's tensor
    /// operations elsewhere).
    pub fn use_fused(&mut self, update: Option<FusedAdamW<B>>) {
        self.fused = update;
    }

    /// Parameter updates (whole parameters or shards) that ran the fused
    /// update of [`AdamW::use_fused`] so far: a trainer can show that its
    /// steps take that path.
    pub fn fused_updates(&self) -> u64 {
        self.fused_updates
    }

    /// Optimizer steps taken so far.
    pub fn steps_taken(&self) -> u64 {
        self.step
    }

    /// Sets the number of steps taken (the bias corrections use it), for a
    /// run resumed from a checkpoint.
    pub fn set_steps_taken(&mut self, steps: u64) {
        self.step = steps;
    }

    /// The moments `(m, v)` of parameter `id`, rank 1 over the range
    /// [`AdamW::update_flat`] sees (the whole parameter, or a shard of it);
    /// `None` before its first update.
    pub fn moments(&self, id: ParamId) -> Option<(Tensor<B, 1>, Tensor<B, 1>)> {
        self.moments.get(&id).map(|s| (s.m.clone(), s.v.clone()))
    }

    /// Sets the moments of parameter `id`, in the form [`AdamW::moments`]
    /// returns them (for a run resumed from a checkpoint).
    pub fn set_moments(&mut self, id: ParamId, m: Tensor<B, 1>, v: Tensor<B, 1>) {
        self.moments.insert(id, Moments { m, v });
    }

    /// The host moments `(m, v)` of parameter `id`, over the range
    /// [`AdamW::update_host`] sees; `None` before its first host update.
    pub fn host_moments(&self, id: ParamId) -> Option<(&[f32], &[f32])> {
        self.host.get(&id).map(|s| (&s.m[..], &s.v[..]))
    }

    /// Sets the host moments of parameter `id`, in the form
    /// [`AdamW::host_moments`] returns them (for a run resumed from a
    /// checkpoint).
    pub fn set_host_moments(&mut self, id: ParamId, m: Vec<f32>, v: Vec<f32>) {
        self.host.insert(id, HostMoments { m, v });
    }

    /// Bytes of optimizer state on the backend's device (both moments of
    /// every parameter updated there).
    pub fn state_bytes(&self) -> usize {
        self.moments
            .values()
            .map(|s| 2 * s.m.shape().num_elements() * s.m.dtype().size())
            .sum()
    }

    /// Bytes of optimizer state in host memory (both f32 moments of every
    /// parameter updated by [`AdamW::update_host`]).
    pub fn host_state_bytes(&self) -> usize {
        self.host.values().map(|s| 8 * s.m.len()).sum()
    }

    /// The scalars of this step's update with learning rate `lr`, with
    /// weight decay if `decay`.
    fn coefficients(&self, lr: f64, decay: bool) -> AdamWCoefficients {
        let (c, t) = (self.config, self.step as i32);
        AdamWCoefficients {
            beta1: c.beta1,
            beta2: c.beta2,
            bias2_sqrt: (1.0 - c.beta2.powi(t)).sqrt(),
            eps: c.eps,
            step_size: lr / (1.0 - c.beta1.powi(t)),
            decay: (decay && c.weight_decay != 0.0).then_some(1.0 - lr * c.weight_decay),
        }
    }

    /// [`AdamW::update_flat`] on the host: updates the f32 values `p` of
    /// parameter `id` (the whole parameter or a contiguous shard of it,
    /// always the same range for the same `id`) in place, given their
    /// gradient `grad` of the same length; the moments live in host memory
    /// (zeros before the first update). One pass per element through the
    /// same f32 operations as the flex update, on the CPU's threads.
    pub fn update_host(&mut self, id: ParamId, lr: f64, p: &mut [f32], grad: &[f32], decay: bool) {
        let coefficients = self.coefficients(lr, decay);
        let state = self.host.entry(id).or_insert_with(|| HostMoments {
            m: vec![0.0; grad.len()],
            v: vec![0.0; grad.len()],
        });
        super::adamw_host::update_slices(p, grad, &mut state.m, &mut state.v, coefficients);
    }

    /// Applies one AdamW update with learning rate `lr` to every parameter
    /// of `module` that has a gradient in `grads`, and returns the module.
    pub fn step<AB, M>(&mut self, lr: f64, module: M, grads: GradientsParams) -> M
    where
        AB: AutodiffBackend<InnerBackend = B>,
        M: AutodiffModule<AB>,
    {
        self.begin_step();
        let mut mapper = Update::<AB> {
            opt: self,
            grads,
            lr,
        };
        module.map(&mut mapper)
    }

    /// Counts one more optimizer step (the bias corrections use the count).
    /// Call once per step before [`AdamW::update_flat`]; [`AdamW::step`]
    /// does it itself.
    pub fn begin_step(&mut self) {
        self.step += 1;
    }

    /// The updated value of `p`, a rank-1 view of parameter `id` (the whole
    /// parameter or a contiguous shard of it, always the same range for the
    /// same `id`), given its gradient `grad` of the same length. `decay`
    /// says whether weight decay applies (matrices and embeddings).
    ///
    /// Runs the fused update of [`AdamW::use_fused`] where one is
    /// installed and all four tensors are f32, else flex's host pass in
    /// f32, else Burn's tensor operations; all three run the same f32
    /// operations per element.
    pub fn update_flat(
        &mut self,
        id: ParamId,
        lr: f64,
        p: Tensor<B, 1>,
        grad: Tensor<B, 1>,
        decay: bool,
    ) -> Tensor<B, 1> {
        let g = grad;
        let state = self.moments.remove(&id).unwrap_or_else(|| Moments {
            m: g.zeros_like(),
            v: g.zeros_like(),
        });
        let f32s = [&p, &g, &state.m, &state.v]
            .iter()
            .all(|t| t.dtype() == burn::tensor::DType::F32);
        if let Some(fused) = self.fused.filter(|_| f32s) {
            let [p, m, v] = fused(p, g, state.m, state.v, self.coefficients(lr, decay));
            self.moments.insert(id, Moments { m, v });
            self.fused_updates += 1;
            return p;
        }
        #[cfg(feature = "flex")]
        if f32s && super::adamw_host::on_flex::<B>() {
            let coefficients = self.coefficients(lr, decay);
            let [p, m, v] = super::adamw_host::update(p, g, (state.m, state.v), coefficients);
            self.moments.insert(id, Moments { m, v });
            return p;
        }
        self.update_tensors(id, lr, p, g, state, decay)
    }

    /// [`AdamW::update_flat`] as Burn tensor operations (every backend but
    /// flex in f32, which runs `adamw_host`'s one pass, and a backend with
    /// a fused update installed), given the parameter's moments before the
    /// update.
    fn update_tensors(
        &mut self,
        id: ParamId,
        lr: f64,
        p: Tensor<B, 1>,
        g: Tensor<B, 1>,
        state: Moments<B>,
        decay: bool,
    ) -> Tensor<B, 1> {
        let c = self.config;
        let m = state.m.mul_scalar(c.beta1) + g.clone().mul_scalar(1.0 - c.beta1);
        let v = state.v.mul_scalar(c.beta2) + g.powf_scalar(2.0).mul_scalar(1.0 - c.beta2);
        let t = self.step as i32;
        let bias1 = 1.0 - c.beta1.powi(t);
        let bias2 = 1.0 - c.beta2.powi(t);
        // torch: denom = sqrt(v) / sqrt(bias2) + eps; p -= lr / bias1 * m / denom
        let denom = v.clone().sqrt().div_scalar(bias2.sqrt()).add_scalar(c.eps);
        let delta = m.clone().div(denom).mul_scalar(lr / bias1);
        let mut flat = p;
        if decay && c.weight_decay != 0.0 {
            flat = flat.mul_scalar(1.0 - lr * c.weight_decay);
        }
        self.moments.insert(id, Moments { m, v });
        flat - delta
    }

    /// The updated value of one parameter `p` (any shape) given its gradient.
    fn update<const D: usize>(
        &mut self,
        id: ParamId,
        lr: f64,
        p: Tensor<B, D>,
        grad: Tensor<B, D>,
    ) -> Tensor<B, D> {
        let shape = p.shape();
        let n = shape.num_elements();
        self.update_flat(id, lr, p.reshape([n]), grad.reshape([n]), D >= 2)
            .reshape(shape)
    }
}

/// Walks a module and replaces each parameter by its updated value.
struct Update<'a, AB: AutodiffBackend> {
    opt: &'a mut AdamW<AB::InnerBackend>,
    grads: GradientsParams,
    lr: f64,
}

impl<AB: AutodiffBackend> ModuleMapper<AB> for Update<'_, AB> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<AB, D>>) -> Param<Tensor<AB, D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(grad) = self.grads.remove::<AB::InnerBackend, D>(id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let updated = self.opt.update(id, self.lr, tensor.inner(), grad);
        Param::from_mapped_value(id, Tensor::from_inner(updated).require_grad(), mapper)
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use burn::module::Module;
    use burn::tensor::TensorData;

    type B = Autodiff<Flex>;

    #[derive(Module, Debug)]
    struct Two<B: Backend> {
        w: Param<Tensor<B, 2>>,
        b: Param<Tensor<B, 1>>,
    }

    /// Plain scalar AdamW on one value, written from the PyTorch docs.
    fn reference(p0: f64, grads: &[f64], lr: f64, c: AdamWConfig, decay: bool) -> f64 {
        let (mut p, mut m, mut v) = (p0, 0.0, 0.0);
        for (i, g) in grads.iter().enumerate() {
            let t = (i + 1) as i32;
            if decay {
                p *= 1.0 - lr * c.weight_decay;
            }
            m = c.beta1 * m + (1.0 - c.beta1) * g;
            v = c.beta2 * v + (1.0 - c.beta2) * g * g;
            let mhat = m / (1.0 - c.beta1.powi(t));
            let vhat = v / (1.0 - c.beta2.powi(t));
            p -= lr * mhat / (vhat.sqrt() + c.eps);
        }
        p
    }

    #[test]
    fn matches_scalar_reference_and_skips_decay_on_rank_one_params() {
        let dev = Default::default();
        let c = AdamWConfig {
            beta1: 0.8,
            beta2: 0.9,
            eps: 1e-8,
            weight_decay: 0.5,
        };
        let mut model = Two::<B> {
            w: Param::from_data(TensorData::new(vec![1.0f32, -2.0], [1, 2]), &dev),
            b: Param::from_data(TensorData::new(vec![3.0f32], [1]), &dev),
        };
        let mut opt = AdamW::new(c);
        // loss = sum(w * k) + b * k  => grad = k, varying per step.
        let ks = [0.5f64, -1.5, 2.0];
        for k in ks {
            let loss = model.w.val().mul_scalar(k).sum() + model.b.val().mul_scalar(k).sum();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = opt.step(0.1, model, grads);
        }
        let w: Vec<f32> = model.w.val().into_data().to_vec().unwrap();
        let b: Vec<f32> = model.b.val().into_data().to_vec().unwrap();
        assert!((w[0] as f64 - reference(1.0, &ks, 0.1, c, true)).abs() < 1e-6);
        assert!((w[1] as f64 - reference(-2.0, &ks, 0.1, c, true)).abs() < 1e-6);
        assert!((b[0] as f64 - reference(3.0, &ks, 0.1, c, false)).abs() < 1e-6);
        assert_eq!(opt.steps_taken(), 3);
        assert_eq!(opt.state_bytes(), 2 * 3 * 4);
    }

    /// The one-pass host update (flex, f32) against the tensor operations
    /// it replaces, over several steps, with and without decay, on a length
    /// that fills no whole task nor vector; the parameter shares its
    /// buffer with another tensor, which must keep its old values.
    #[test]
    fn host_update_matches_the_tensor_operations() {
        let dev = Default::default();
        let c = AdamWConfig {
            beta1: 0.85,
            beta2: 0.97,
            eps: 1e-6,
            weight_decay: 0.3,
        };
        let n = 70_001;
        let values = |seed: usize| -> Tensor<Flex, 1> {
            let v: Vec<f32> = (0..n)
                .map(|i| ((i * 37 + seed * 11) % 101) as f32 / 50.0 - 1.0)
                .collect();
            Tensor::from_data(TensorData::new(v, [n]), &dev)
        };
        for decay in [true, false] {
            let (mut host, mut tensors) = (AdamW::<Flex>::new(c), AdamW::<Flex>::new(c));
            let id = ParamId::new();
            let (mut p_host, mut p_tensors) = (values(0), values(0));
            let first = p_host.clone();
            for step in 1..=3 {
                let g = values(step);
                host.begin_step();
                tensors.begin_step();
                p_host = host.update_flat(id, 0.01, p_host, g.clone(), decay);
                let state = tensors.moments.remove(&id).unwrap_or_else(|| Moments {
                    m: g.zeros_like(),
                    v: g.zeros_like(),
                });
                p_tensors = tensors.update_tensors(id, 0.01, p_tensors, g, state, decay);
                let (m_host, v_host) = host.moments(id).unwrap();
                let (m_tensors, v_tensors) = tensors.moments(id).unwrap();
                for (what, got, want) in [
                    ("p", &p_host, &p_tensors),
                    ("m", &m_host, &m_tensors),
                    ("v", &v_host, &v_tensors),
                ] {
                    let got: Vec<f32> = got.clone().into_data().to_vec().unwrap();
                    let want: Vec<f32> = want.clone().into_data().to_vec().unwrap();
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (g - w).abs() <= 1e-6 * w.abs().max(1e-3),
                            "decay {decay}, step {step}, {what}[{i}]: {g} vs {w}"
                        );
                    }
                }
            }
            let first: Vec<f32> = first.into_data().to_vec().unwrap();
            let initial: Vec<f32> = values(0).into_data().to_vec().unwrap();
            assert_eq!(
                first, initial,
                "a tensor sharing the parameter's buffer changed"
            );
        }
    }

    /// The optimizer state offloaded to host memory ([`AdamW::update_host`]
    /// on plain `Vec`s) against the state on flex ([`AdamW::update_flat`]):
    /// the same values bit for bit, parameter and both moments, over
    /// several steps with and without decay, and the moments counted as
    /// host bytes, not device bytes.
    #[test]
    fn host_state_updates_bit_identically_to_the_device_state() {
        let dev = Default::default();
        let c = AdamWConfig {
            beta1: 0.85,
            beta2: 0.97,
            eps: 1e-6,
            weight_decay: 0.3,
        };
        let n = 70_001;
        let values = |seed: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 37 + seed * 11) % 101) as f32 / 50.0 - 1.0)
                .collect()
        };
        let tensor = |v: Vec<f32>| Tensor::<Flex, 1>::from_data(TensorData::new(v, [n]), &dev);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for decay in [true, false] {
            let (mut device, mut host) = (AdamW::<Flex>::new(c), AdamW::<Flex>::new(c));
            let id = ParamId::new();
            let mut p_device = tensor(values(0));
            let mut p_host = values(0);
            for step in 1..=3 {
                let g = values(step);
                device.begin_step();
                host.begin_step();
                p_device = device.update_flat(id, 0.01, p_device, tensor(g.clone()), decay);
                host.update_host(id, 0.01, &mut p_host, &g, decay);
                let (m, v) = device.moments(id).unwrap();
                let (hm, hv) = host.host_moments(id).unwrap();
                for (what, got, want) in [
                    ("p", p_host.clone(), p_device.clone()),
                    ("m", hm.to_vec(), m),
                    ("v", hv.to_vec(), v),
                ] {
                    let want: Vec<f32> = want.into_data().to_vec().unwrap();
                    assert!(
                        bits(&got) == bits(&want),
                        "decay {decay}, step {step}: {what} differs"
                    );
                }
            }
            assert_eq!(host.host_state_bytes(), 8 * n);
            assert_eq!(host.state_bytes(), 0);
            assert_eq!(device.host_state_bytes(), 0);
        }
    }
}
