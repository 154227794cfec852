//! The ring on device tensors (Flex's, with the f64 block kernel run on
//! the host through [`OnHost`]) over in-process device collectives, one
//! thread per rank, against the host ring of the same kernel: outputs,
//! log-sum-exp and gradients of every rank.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use burn::backend::{Autodiff, Flex};
use burn::tensor::{DType, Tensor};
use ferrotron_engine::precision::Precision;

use super::super::device::{host, tensor};
use super::super::simulate::rank_part;
use super::*;
use crate::comm::nccl::device::{AnyCollectives, Route, TensorCollectives};
use crate::comm::tensor::{from_host, host_f32};
use crate::comm::{CommError, Communicator, Incoming, Outgoing};

/// The messages from one rank to another with one tag, oldest first.
type Queue = VecDeque<Vec<f32>>;

/// Messages in flight between the threads of one process, by `(from, to,
/// tag)`, first in first out (as NCCL and MPI match them).
#[derive(Default)]
struct Mailboxes {
    queued: Mutex<HashMap<(usize, usize, i32), Queue>>,
    posted: Condvar,
}

/// Rank `rank` of `size` threads exchanging through `boxes`: the device
/// collectives' and the communicator's point-to-point calls (the ring
/// makes no other).
struct Local {
    rank: usize,
    size: usize,
    boxes: Arc<Mailboxes>,
}

impl TensorCollectives<Flex> for Local {
    fn world_size(&self) -> usize {
        self.size
    }

    fn all_reduce_sum(
        &self,
        _: Tensor<Flex, 1>,
        _: Precision,
    ) -> Result<Tensor<Flex, 1>, CommError> {
        unreachable!("the ring only exchanges")
    }

    fn all_gather(&self, _: Tensor<Flex, 1>, _: Precision) -> Result<Tensor<Flex, 1>, CommError> {
        unreachable!("the ring only exchanges")
    }

    fn reduce_scatter_sum(
        &self,
        _: Tensor<Flex, 1>,
        _: Precision,
    ) -> Result<Tensor<Flex, 1>, CommError> {
        unreachable!("the ring only exchanges")
    }

    fn exchange(
        &self,
        sends: Vec<(Route, Tensor<Flex, 1>)>,
        recvs: &[(Route, usize)],
        wire: Precision,
        device: &burn::tensor::Device<Flex>,
    ) -> Result<Vec<Tensor<Flex, 1>>, CommError> {
        assert_eq!(wire, Precision::Fp32, "the ring's blocks travel in f32");
        for (route, t) in sends {
            self.post(route.peer, route.tag, host_f32(t));
        }
        Ok(recvs
            .iter()
            .map(|&(route, n)| from_host(self.take(route.peer, route.tag, n), device))
            .collect())
    }
}

/// The same mailboxes as a host communicator (the ring's host path):
/// point-to-point only.
impl Communicator for Local {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.size
    }
    fn split(&self, _: usize, _: usize) -> Result<Arc<dyn Communicator>, CommError> {
        unreachable!("the ring only exchanges")
    }
    fn all_reduce_sum(&self, _: &mut [f32]) -> Result<(), CommError> {
        unreachable!("the ring only exchanges")
    }
    fn all_gather(&self, _: &[f32], _: &mut [f32]) -> Result<(), CommError> {
        unreachable!("the ring only exchanges")
    }
    fn reduce_scatter_sum(&self, _: &[f32], _: &mut [f32]) -> Result<(), CommError> {
        unreachable!("the ring only exchanges")
    }
    fn broadcast(&self, _: &mut [f32], _: usize) -> Result<(), CommError> {
        unreachable!("the ring only exchanges")
    }
    fn send(&self, _: &[f32], _: usize, _: i32) -> Result<(), CommError> {
        unreachable!("the ring only exchanges")
    }
    fn recv(&self, _: &mut [f32], _: usize, _: i32) -> Result<(), CommError> {
        unreachable!("the ring only exchanges")
    }
    fn exchange(
        &self,
        sends: &[Outgoing<'_>],
        recvs: &mut [Incoming<'_>],
    ) -> Result<(), CommError> {
        for s in sends {
            self.post(s.to, s.tag, s.values.to_vec());
        }
        for r in recvs {
            let n = r.values.len();
            r.values.copy_from_slice(&self.take(r.from, r.tag, n));
        }
        Ok(())
    }
    fn barrier(&self) -> Result<(), CommError> {
        unreachable!("the ring only exchanges")
    }
    fn abort(&self, code: i32) -> ! {
        panic!("rank {} of {} aborted with {code}", self.rank, self.size)
    }
}

impl Local {
    /// Queues `values` for rank `to` under `tag`.
    fn post(&self, to: usize, tag: i32, values: Vec<f32>) {
        let mut queued = self.boxes.queued.lock().unwrap();
        queued
            .entry((self.rank, to, tag))
            .or_default()
            .push_back(values);
        self.boxes.posted.notify_all();
    }

    /// The oldest message from rank `from` under `tag`, once posted, of
    /// `n` values.
    fn take(&self, from: usize, tag: i32, n: usize) -> Vec<f32> {
        let key = (from, self.rank, tag);
        let mut queued = self.boxes.queued.lock().unwrap();
        let values = loop {
            if let Some(v) = queued.get_mut(&key).and_then(VecDeque::pop_front) {
                break v;
            }
            queued = self.boxes.posted.wait(queued).unwrap();
        };
        assert_eq!(values.len(), n, "message {key:?}");
        values
    }
}

/// Rings of 2, 3 and 4 ranks on Flex tensors equal the host ring (the
/// simulated one, itself checked against the whole attention above)
/// within `1e-5` of each result's largest magnitude: both merge in f32 by
/// the same formula, the device one through Flex's `exp`, `log` and
/// summation order (for `delta`), a few ulps per step.
#[test]
fn device_rings_equal_the_host_ring() {
    let kernel = Plain {
        slopes: Some(vec![0.5, 0.25, 0.125, 0.0625]),
    };
    let (seq, d) = (24, 4);
    let q = values([2, 4, seq, d], 11);
    let k = values([2, 2, seq, d], 12);
    let v = values([2, 2, seq, d], 13);
    let g = values([2, 4, seq, d], 14);
    for cp in [2, 3, 4] {
        let want = simulate_ring(&kernel, cp, [&q, &k, &v, &g]).unwrap();
        let layout = ChunkLayout::new(seq, cp).unwrap();
        let boxes = Arc::new(Mailboxes::default());
        let got: Vec<[HeadBuf; 5]> = std::thread::scope(|s| {
            let ranks: Vec<_> = (0..cp)
                .map(|rank| {
                    let local = Local {
                        rank,
                        size: cp,
                        boxes: boxes.clone(),
                    };
                    let (kernel, [q, k, v, g]) = (&kernel, [&q, &k, &v, &g]);
                    s.spawn(move || {
                        let device = Default::default();
                        let [q, k, v, g] = [q, k, v, g].map(|x| {
                            tensor::<Flex>(rank_part(layout, x, rank), &device, DType::F32)
                        });
                        let ring = DeviceRing::new(&local, rank);
                        let kernel = OnHost(kernel);
                        let (out, lse) = ring_forward(&ring, &kernel, layout, &q, &k, &v).unwrap();
                        let kept = Kept::of([&q, &k, &v, &out, &lse]);
                        let [dq, dk, dv] = ring_backward(&ring, &kernel, layout, kept, &g).unwrap();
                        [out, lse, dq, dk, dv].map(host)
                    })
                })
                .collect();
            ranks.into_iter().map(|r| r.join().unwrap()).collect()
        });
        for (rank, results) in got.iter().enumerate() {
            for ((g, w), name) in results
                .iter()
                .zip(&want)
                .zip(["out", "lse", "dq", "dk", "dv"])
            {
                assert_close(
                    g,
                    &rank_part(layout, w, rank),
                    &format!("cp {cp}, rank {rank}: {name}"),
                );
            }
        }
    }
}

/// `CpOps::ring_attention` on `Autodiff<Flex>` with device collectives
/// (`RingAttention::with_device`) equals its host path over the same ring
/// (the mailboxes as a communicator), output and `q`, `k`, `v` gradients,
/// for rings of 2 and 4 ranks, within `1e-5` of each result's largest
/// magnitude, as above; and so does the device path with a device block
/// kernel (`RingAttention::with_device_kernel`), which computes every
/// block of both passes. Each rank runs the host path, then the device
/// paths, each on its own mailboxes.
#[test]
fn ring_attention_on_device_collectives_equals_its_host_path() {
    let (seq, d) = (16, 4);
    let q = values([1, 4, seq, d], 21);
    let k = values([1, 2, seq, d], 22);
    let v = values([1, 2, seq, d], 23);
    let g = values([1, 4, seq, d], 24);
    for cp in [2, 4] {
        let layout = ChunkLayout::new(seq, cp).unwrap();
        let boxes = [(); 3].map(|()| Arc::new(Mailboxes::default()));
        let got: Vec<([[HeadBuf; 4]; 3], [usize; 2])> = std::thread::scope(|s| {
            let ranks: Vec<_> = (0..cp)
                .map(|rank| {
                    let (boxes, whole) = (&boxes, [&q, &k, &v, &g]);
                    s.spawn(move || {
                        let parts = whole.map(|x| rank_part(layout, x, rank));
                        let counted = Arc::new(Counted::default());
                        let paths = [0, 1, 2].map(|path| {
                            let local = Arc::new(Local {
                                rank,
                                size: cp,
                                boxes: boxes[path].clone(),
                            });
                            let kernel = Arc::new(Plain { slopes: None });
                            let ring = RingAttention::new(local.clone(), layout, kernel);
                            let ring = match path {
                                0 => ring,
                                _ => ring.with_device(AnyCollectives::new::<Flex>(local)),
                            };
                            let ring = match path {
                                2 => ring.with_device_kernel(AnyBlockKernel::new::<Flex>(
                                    counted.clone(),
                                )),
                                _ => ring,
                            };
                            attend(&ring, &parts)
                        });
                        (paths, counted.calls())
                    })
                })
                .collect();
            ranks.into_iter().map(|r| r.join().unwrap()).collect()
        });
        for (rank, ([host_path, device_paths @ ..], calls)) in got.iter().enumerate() {
            // One block per ring step, forward and backward.
            assert_eq!(
                *calls,
                [cp, cp],
                "cp {cp}, rank {rank}: device kernel calls"
            );
            for (path, device_path) in ["device", "device kernel"].iter().zip(device_paths) {
                for ((got, want), name) in device_path
                    .iter()
                    .zip(host_path)
                    .zip(["out", "dq", "dk", "dv"])
                {
                    assert_close(got, want, &format!("cp {cp}, rank {rank}, {path}: {name}"));
                }
            }
        }
    }
}

/// A device block kernel on Flex's tensors: the test's kernel through
/// [`OnHost`], counting its forward and backward calls.
#[derive(Default)]
struct Counted {
    forward: AtomicUsize,
    backward: AtomicUsize,
}

impl Counted {
    /// `[forward, backward]` calls so far.
    fn calls(&self) -> [usize; 2] {
        [&self.forward, &self.backward].map(|n| n.load(Ordering::SeqCst))
    }
}

impl BlockAttention<Tensor<Flex, 4>> for Counted {
    fn forward(&self, block: Block<'_, Tensor<Flex, 4>>) -> (Tensor<Flex, 4>, Tensor<Flex, 4>) {
        self.forward.fetch_add(1, Ordering::SeqCst);
        OnHost(&Plain { slopes: None }).forward(block)
    }

    fn backward(
        &self,
        block: Block<'_, Tensor<Flex, 4>>,
        whole: WholeRows<'_, Tensor<Flex, 4>>,
    ) -> [Tensor<Flex, 4>; 3] {
        self.backward.fetch_add(1, Ordering::SeqCst);
        OnHost(&Plain { slopes: None }).backward(block, whole)
    }
}

/// This rank's `[out, dq, dk, dv]` of `CpOps::ring_attention` over `ring`
/// for its parts `[q, k, v, d_out]`, the gradients of `sum(out * d_out)`.
fn attend(ring: &RingAttention, [q, k, v, g]: &[HeadBuf; 4]) -> [HeadBuf; 4] {
    type A = Autodiff<Flex>;
    let device = Default::default();
    let [q, k, v] = [q, k, v].map(|x| tensor::<A>(x.clone(), &device, DType::F32).require_grad());
    let out = A::ring_attention(q.clone(), k.clone(), v.clone(), ring);
    let grads = (out.clone() * tensor::<A>(g.clone(), &device, DType::F32))
        .sum()
        .backward();
    let [dq, dk, dv] = [q, k, v].map(|x| host(x.grad(&grads).expect("a gradient")));
    [host(out), dq, dk, dv]
}
