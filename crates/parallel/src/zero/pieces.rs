//! ZeRO-3's parameter pieces: this rank's chunk of every parameter, the
//! only copy of the weights on the rank between steps, in f32. They live
//! on the device, or with the optimizer offloaded (`--offload optimizer`)
//! in host memory beside AdamW's host moments, where the CPU updates them:
//! the device then holds no f32 master weights at all, only the gathered
//! parameters a step computes with.

use std::collections::HashMap;

use burn::module::ParamId;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use ferrotron_engine::optim::AdamW;

use super::gathered::Values;
use crate::comm::tensor::{from_host, host_f32};

/// This rank's f32 pieces of the parameters, by parameter.
pub(super) enum Pieces<B: Backend> {
    /// Rank-1 tensors on the device.
    Device(HashMap<ParamId, Tensor<B, 1>>),
    /// Host vectors (the optimizer offloaded).
    Host(HashMap<ParamId, Vec<f32>>),
}

impl<B: Backend> Pieces<B> {
    /// Stores the piece `values` of parameter `id` (on `device` unless
    /// offloaded), replacing any before.
    pub fn insert(&mut self, id: ParamId, values: Vec<f32>, device: &B::Device) {
        match self {
            Self::Device(p) => {
                p.insert(id, from_host(values, device));
            }
            Self::Host(p) => {
                p.insert(id, values);
            }
        }
    }

    /// Stores the piece `t` (a tensor on the device) of parameter `id`.
    pub fn insert_tensor(&mut self, id: ParamId, t: Tensor<B, 1>) {
        match self {
            Self::Device(p) => {
                p.insert(id, t);
            }
            Self::Host(p) => {
                p.insert(id, host_f32(t));
            }
        }
    }

    /// The values of parameter `id`'s piece, copied to the host.
    ///
    /// # Panics
    /// If this rank holds no piece of `id` (a caller bug).
    pub fn values(&self, id: ParamId) -> Vec<f32> {
        match self {
            Self::Device(p) => host_f32(p[&id].clone()),
            Self::Host(p) => p[&id].clone(),
        }
    }

    /// Parameter `id`'s piece where it lives (a tensor on the device, or
    /// host values when offloaded), for an all-gather.
    ///
    /// # Panics
    /// If this rank holds no piece of `id` (a caller bug).
    pub fn get(&self, id: ParamId) -> Values<B> {
        match self {
            Self::Device(p) => Values::Device(p[&id].clone()),
            Self::Host(p) => Values::Host(p[&id].clone()),
        }
    }

    /// Bytes of the pieces on the device (none when offloaded).
    pub fn device_bytes(&self) -> usize {
        match self {
            Self::Device(p) => p.values().map(|t| t.shape().num_elements() * 4).sum(),
            Self::Host(_) => 0,
        }
    }

    /// Moves every piece to host memory (once, when the optimizer is
    /// offloaded); nothing if they are there.
    pub fn offload(&mut self) {
        if let Self::Device(p) = self {
            let host = std::mem::take(p)
                .into_iter()
                .map(|(id, t)| (id, host_f32(t)))
                .collect();
            *self = Self::Host(host);
        }
    }

    /// One AdamW step of parameter `id`'s piece with its gradient `grad`
    /// (`decay`: weight decay applies), where the piece lives: on the
    /// device with the optimizer's device state, or on the host with its
    /// host state (the gradient copied to the host).
    ///
    /// # Panics
    /// If this rank holds no piece of `id` (a caller bug).
    pub fn update(
        &mut self,
        id: ParamId,
        lr: f64,
        grad: Tensor<B, 1>,
        decay: bool,
        optimizer: &mut AdamW<B>,
    ) {
        match self {
            Self::Device(p) => {
                let param = p.remove(&id).expect("stage 3 holds every piece");
                p.insert(id, optimizer.update_flat(id, lr, param, grad, decay));
            }
            Self::Host(p) => {
                let param = p.get_mut(&id).expect("stage 3 holds every piece");
                optimizer.update_host(id, lr, param, &host_f32(grad), decay);
            }
        }
    }
}
