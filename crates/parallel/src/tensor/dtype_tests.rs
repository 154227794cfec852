//! The TP operators keep their input's dtype, forward and backward, and a
//! sum is rounded once to it: under bf16 compute the activations and their
//! gradients stay bf16 across the group (an operator that returned the
//! communicator's f32 would silently turn the rest of the model to f32).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use burn::backend::{Autodiff, Flex};
use burn::tensor::{bf16, DType, FloatDType, Tensor};
use ferrotron_engine::precision::Precision;

use super::{column_input, gather_from_tp, row_output, TpGroup};
use crate::comm::nccl::device::{Route, TensorCollectives};
use crate::comm::tensor::from_host;
use crate::comm::{CommError, Communicator, Incoming, Outgoing};

/// Rank 0 of a group of two whose other rank holds `peer` in every
/// element: a sum adds `peer`, a gather appends `peer`s, a
/// reduce-scatter keeps this rank's block plus `peer`. No point-to-point
/// calls.
struct Twin {
    peer: f32,
}

impl Communicator for Twin {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        2
    }
    fn split(&self, _: usize, _: usize) -> Result<Arc<dyn Communicator>, CommError> {
        unreachable!("the twin group is never split")
    }
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CommError> {
        buf.iter_mut().for_each(|x| *x += self.peer);
        Ok(())
    }
    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        recv[..send.len()].copy_from_slice(send);
        recv[send.len()..].fill(self.peer);
        Ok(())
    }
    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        for (r, s) in recv.iter_mut().zip(send) {
            *r = s + self.peer;
        }
        Ok(())
    }
    fn broadcast(&self, _: &mut [f32], _: usize) -> Result<(), CommError> {
        Ok(())
    }
    fn send(&self, _: &[f32], _: usize, _: i32) -> Result<(), CommError> {
        unreachable!("the TP operators make no point-to-point call")
    }
    fn recv(&self, _: &mut [f32], _: usize, _: i32) -> Result<(), CommError> {
        unreachable!("the TP operators make no point-to-point call")
    }
    fn exchange(&self, _: &[Outgoing<'_>], _: &mut [Incoming<'_>]) -> Result<(), CommError> {
        unreachable!("the TP operators make no point-to-point call")
    }
    fn barrier(&self) -> Result<(), CommError> {
        Ok(())
    }
    fn abort(&self, code: i32) -> ! {
        panic!("the twin group aborted with {code}")
    }
}

type B = Autodiff<Flex>;

/// A TP operator on `[batch, seq, hidden]` activations.
type Op = fn(Tensor<B, 3>, &TpGroup) -> Tensor<B, 3>;

/// The other rank's value: 2^-8, half of bf16's spacing at 1, so that
/// `1 + PEER` in f32 is a tie that bf16 rounds to 1 (even).
const PEER: f32 = 1.0 / 256.0;

/// A bf16 `[1, 2, 2]` of ones, tracked by autodiff.
fn ones_bf16() -> Tensor<B, 3> {
    Tensor::<B, 3>::ones([1, 2, 2], &Default::default())
        .cast(FloatDType::BF16)
        .require_grad()
}

/// The values of `t` as f32.
fn host(t: Tensor<B, 3>) -> Vec<f32> {
    t.cast(FloatDType::F32).into_data().to_vec().unwrap()
}

#[test]
fn tp_operators_keep_bf16_forward_and_backward() {
    for sp in [false, true] {
        let group = TpGroup::new(Arc::new(Twin { peer: PEER })).with_sequence_parallel(sp);
        let ops: [(&str, Op); 3] = [
            ("column_input", column_input),
            ("row_output", row_output),
            ("gather_from_tp", gather_from_tp),
        ];
        for (name, op) in ops {
            let x = ones_bf16();
            let y = op(x.clone(), &group);
            assert_eq!(y.dtype(), DType::BF16, "{name} (sp {sp}): forward");
            let g = x.grad(&y.sum().backward()).unwrap();
            assert_eq!(g.dtype(), DType::BF16, "{name} (sp {sp}): backward");
        }
    }
}

/// The f32 sum `1 + 2^-8` of the two ranks' values comes back as bf16's
/// rounding of it, 1 (an f32 result would keep 1.00390625); the values a
/// gather brings are bf16's already and stay exact.
#[test]
fn a_sum_over_the_group_is_rounded_once_to_bf16() {
    for sp in [false, true] {
        let group = TpGroup::new(Arc::new(Twin { peer: PEER })).with_sequence_parallel(sp);
        let sum = row_output(ones_bf16(), &group);
        assert!(host(sum).iter().all(|&v| v == 1.0), "sp {sp}");
    }
    let group = TpGroup::new(Arc::new(Twin { peer: PEER }));
    let gathered = host(gather_from_tp(ones_bf16(), &group));
    assert_eq!(gathered, [1.0, 1.0, PEER, PEER, 1.0, 1.0, PEER, PEER]);
    assert_eq!(bf16::from_f32(PEER).to_f32(), PEER);
}

/// Device collectives of the same twin group: the tensors' values and the
/// other rank's `peer`, sums rounded in the wire's precision as NCCL
/// rounds them; counts the calls.
struct TwinDevice {
    peer: f32,
    calls: AtomicUsize,
}

impl TwinDevice {
    fn values(&self, t: Tensor<Flex, 1>) -> Vec<f32> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        t.into_data().to_vec().unwrap()
    }
}

impl TensorCollectives<Flex> for TwinDevice {
    fn world_size(&self) -> usize {
        2
    }
    fn all_reduce_sum(
        &self,
        t: Tensor<Flex, 1>,
        reduce: Precision,
    ) -> Result<Tensor<Flex, 1>, CommError> {
        let device = t.device();
        let mut v: Vec<f32> = self.values(t).iter().map(|x| x + self.peer).collect();
        reduce.round_in_place(&mut v);
        Ok(from_host(v, &device))
    }
    fn all_gather(
        &self,
        t: Tensor<Flex, 1>,
        wire: Precision,
    ) -> Result<Tensor<Flex, 1>, CommError> {
        let device = t.device();
        let mut v = self.values(t);
        v.extend(vec![self.peer; v.len()]);
        wire.round_in_place(&mut v);
        Ok(from_host(v, &device))
    }
    fn reduce_scatter_sum(
        &self,
        t: Tensor<Flex, 1>,
        reduce: Precision,
    ) -> Result<Tensor<Flex, 1>, CommError> {
        let device = t.device();
        let v = self.values(t);
        let mut mine: Vec<f32> = v[..v.len() / 2].iter().map(|x| x + self.peer).collect();
        reduce.round_in_place(&mut mine);
        Ok(from_host(mine, &device))
    }
    fn exchange(
        &self,
        _sends: Vec<(Route, Tensor<Flex, 1>)>,
        _recvs: &[(Route, usize)],
        _wire: Precision,
        _device: &burn::tensor::Device<Flex>,
    ) -> Result<Vec<Tensor<Flex, 1>>, CommError> {
        Err(CommError::Transport(
            "the TP operators make no point-to-point calls".into(),
        ))
    }
}

/// With the group's collectives on device tensors (`TpGroup::with_device`)
/// every operator gives the host path's values and dtype, forward and
/// backward, in bf16 and f32, and the device collectives are the ones called.
#[test]
fn the_device_path_gives_the_host_path_values() {
    for dtype in [FloatDType::BF16, FloatDType::F32] {
        for sp in [false, true] {
            let host_group = TpGroup::new(Arc::new(Twin { peer: PEER })).with_sequence_parallel(sp);
            let twin = Arc::new(TwinDevice {
                peer: PEER,
                calls: AtomicUsize::new(0),
            });
            let device_group = TpGroup::new(Arc::new(Twin { peer: f32::NAN }))
                .with_sequence_parallel(sp)
                .with_device::<Flex>(twin.clone());
            let ops: [(&str, Op); 3] = [
                ("column_input", column_input),
                ("row_output", row_output),
                ("gather_from_tp", gather_from_tp),
            ];
            for (name, op) in ops {
                let run = |group: &TpGroup| {
                    let x = Tensor::<B, 3>::from_data(
                        [[[1.0, 0.5], [-2.0, 0.25]]],
                        &Default::default(),
                    )
                    .cast(dtype)
                    .require_grad();
                    let y = op(x.clone(), group);
                    let g = x.grad(&(y.clone() * y.clone()).sum().backward()).unwrap();
                    (
                        y.dtype(),
                        host(y),
                        g.dtype(),
                        g.cast(FloatDType::F32).into_data().to_vec::<f32>().unwrap(),
                    )
                };
                let before = twin.calls.load(Ordering::Relaxed);
                assert_eq!(
                    run(&device_group),
                    run(&host_group),
                    "{name} {dtype:?} (sp {sp})"
                );
                assert!(
                    twin.calls.load(Ordering::Relaxed) > before,
                    "{name} {dtype:?} (sp {sp}): not on the device"
                );
            }
        }
    }
}
