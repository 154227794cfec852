//! The ring on device tensors (Flex's, with the f64 block kernel run on
//! the host through [`OnHost`]) over in-process device collectives, one
//! thread per rank, against the host ring of the same kernel: outputs,
//! log-sum-exp and gradients of every rank.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};

use burn::backend::Flex;
use burn::tensor::{DType, Tensor};
use ferrotron_engine::precision::Precision;

use super::super::device::{host, tensor};
use super::super::simulate::rank_part;
use super::*;
use crate::comm::nccl::device::{Route, TensorCollectives};
use crate::comm::tensor::{from_host, host_f32};
use crate::comm::CommError;

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
/// collectives' point-to-point calls (the ring makes no other).
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
        let mut queued = self.boxes.queued.lock().unwrap();
        for (route, t) in sends {
            let key = (self.rank, route.peer, route.tag);
            queued.entry(key).or_default().push_back(host_f32(t));
        }
        self.boxes.posted.notify_all();
        let mut got = Vec::new();
        for &(route, n) in recvs {
            let key = (route.peer, self.rank, route.tag);
            let values = loop {
                if let Some(v) = queued.get_mut(&key).and_then(VecDeque::pop_front) {
                    break v;
                }
                queued = self.boxes.posted.wait(queued).unwrap();
            };
            assert_eq!(values.len(), n, "message {key:?}");
            got.push(from_host(values, device));
        }
        Ok(got)
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
                        let kept = Kept {
                            q: &q,
                            k: &k,
                            v: &v,
                            out: &out,
                            lse: &lse,
                        };
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
