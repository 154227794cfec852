//! A unit's parameters on their way through ZeRO's all-gather: this
//! rank's pieces, on the host or on the device ([`Values`]), joined into
//! its chunk and gathered on the communication thread, through the
//! communicator's host path or on device collectives ([`start_gather`]);
//! the result is the unit's whole flat vector, `chunk * dp` values.

use std::collections::HashMap;

use burn::module::ParamId;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use ferrotron_engine::precision::Precision;

use super::exchange::{chunk_from_pieces, chunk_tensor};
use crate::comm::nccl::device::SharedCollectives;
use crate::comm::tensor::{from_host, host_f32};
use crate::comm::{CommError, CommThread, Started};
use crate::flat::{Piece, Unit};

/// The `f32` values of a piece of a parameter.
pub(super) enum Values<B: Backend> {
    /// In host memory (an offloaded optimizer's update, offloaded pieces).
    Host(Vec<f32>),
    /// A rank-1 tensor on the device.
    Device(Tensor<B, 1>),
}

impl<B: Backend> Values<B> {
    /// The values on the host (copied there from the device).
    fn into_host(self) -> Vec<f32> {
        match self {
            Self::Host(v) => v,
            Self::Device(t) => host_f32(t),
        }
    }

    /// The values as a tensor on `device` (copied there from the host).
    fn into_device(self, device: &B::Device) -> Tensor<B, 1> {
        match self {
            Self::Host(v) => from_host(v, device),
            Self::Device(t) => t,
        }
    }
}

/// A unit's all-gather in flight: on the host path its flat vector comes
/// back as host values, on device collectives as a device tensor.
pub(super) type Gather<B> = Started<Tensor<B, 1>>;

/// Starts all-gathering `unit`'s chunk made of this rank's `pieces` with
/// their `values`, on `thread`: on `collectives` (device buffers, the
/// values moved to `device` if they are not there) when given, else
/// through the thread's communicator's host path (the values moved to
/// the host). The same chunk either way, so the same gathered values.
pub(super) fn start_gather<B: Backend>(
    thread: &CommThread,
    collectives: Option<&SharedCollectives<B>>,
    unit: &Unit,
    pieces: &[Piece],
    values: HashMap<ParamId, Values<B>>,
    device: &B::Device,
) -> Gather<B> {
    match collectives {
        Some(collectives) => {
            let tensors = values
                .into_iter()
                .map(|(id, v)| (id, v.into_device(device)))
                .collect();
            let chunk = chunk_tensor(unit, pieces, tensors, device);
            let collectives = collectives.clone();
            // f32 master weights, gathered as themselves.
            Started::Own(thread.start_own(move || collectives.all_gather(chunk, Precision::Fp32)))
        }
        None => {
            let host = values
                .into_iter()
                .map(|(id, v)| (id, v.into_host()))
                .collect();
            Started::Host(thread.start_all_gather(chunk_from_pieces(unit, pieces, &host)))
        }
    }
}

/// Waits for `gather` and drops its result (a prefetch never used).
pub(super) fn wait_unused<B: Backend>(gather: Gather<B>) -> Result<(), CommError> {
    match gather {
        Started::Host(p) => p.wait().map(drop),
        Started::Own(p) => p.wait().map(drop),
    }
}
