//! The `Communicator` contract, checked on one rank of a job under
//! `mpirun` for any implementation: every collective and point-to-point
//! call, groups split from the world (by parity; on 4 ranks the tp2 x dp2
//! process groups), and the tensor collectives. Shared by the MPI and
//! NCCL communicator tests.

use std::sync::Arc;

use burn::backend::Flex;
use burn::tensor::Tensor;
use ferrotron_parallel::comm::tensor::host_f32;
use ferrotron_parallel::comm::Communicator;
use ferrotron_parallel::groups::{Dim, ProcessGroups};
use ferrotron_parallel::mesh::Mesh;

/// Every check, on this rank of `world`.
pub fn check(world: Arc<dyn Communicator>) {
    point_to_point_and_collectives(&*world);
    groups(&world);
    tensors(&*world);
}

/// Ranks split by parity: each half sums its own ranks.
fn groups(world: &Arc<dyn Communicator>) {
    let (r, w) = (world.rank(), world.world_size());
    let half = world.split(r % 2, r).unwrap();
    let mine: Vec<usize> = (0..w).filter(|q| q % 2 == r % 2).collect();
    assert_eq!(half.world_size(), mine.len());
    assert_eq!(half.rank(), mine.iter().position(|&q| q == r).unwrap());
    let mut sum = [r as f32];
    half.all_reduce_sum(&mut sum).unwrap();
    assert_eq!(sum[0], mine.iter().sum::<usize>() as f32);
    half.barrier().unwrap();
    if w != 4 {
        return;
    }
    // tp 2 x dp 2: TP groups {0, 1}, {2, 3}; DP groups {0, 2}, {1, 3}.
    let mesh = Mesh {
        dp: 2,
        tp: 2,
        cp: 1,
        pp: 1,
    };
    let g = ProcessGroups::new(world.clone(), mesh).unwrap();
    let mut tp = [r as f32];
    g.group(Dim::Tp).all_reduce_sum(&mut tp).unwrap();
    assert_eq!(tp[0], [1.0, 1.0, 5.0, 5.0][r]);
    let mut dp = [r as f32];
    g.dp().all_reduce_sum(&mut dp).unwrap();
    assert_eq!(dp[0], [2.0, 4.0, 2.0, 4.0][r]);
    assert_eq!(g.dp().rank(), r / 2);
    assert_eq!(g.group(Dim::Pp).world_size(), 1);
    // A group of a group: split the DP group again, one rank each.
    let one = g.dp().split(g.dp().rank(), 0).unwrap();
    assert_eq!((one.rank(), one.world_size()), (0, 1));
    let mut x = [r as f32];
    one.all_reduce_sum(&mut x).unwrap();
    assert_eq!(x[0], r as f32);
}

/// The tensor collectives move Burn tensors through the communicator.
fn tensors(c: &dyn Communicator) {
    let (r, w) = (c.rank() as f32, c.world_size() as f32);
    let device = Default::default();
    let t = Tensor::<Flex, 2>::from_data([[r, 1.0], [2.0, -r]], &device);
    let tri = w * (w - 1.0) / 2.0;
    let sum = host_f32(c.all_reduce_sum_tensor(t.clone()).unwrap());
    assert_eq!(sum, [tri, w, 2.0 * w, -tri]);
    let avg = host_f32(c.all_reduce_avg_tensor(t).unwrap());
    assert_eq!(avg, [tri / w, 1.0, 2.0, -tri / w]);
    let mine = Tensor::<Flex, 1>::from_data([r, r], &device);
    let all = host_f32(c.all_gather_tensor(mine).unwrap());
    let want: Vec<f32> = (0..c.world_size()).flat_map(|k| [k as f32; 2]).collect();
    assert_eq!(all, want);
    let blocks: Vec<f32> = (0..c.world_size()).map(|k| k as f32 + r).collect();
    let n = blocks.len();
    let send = Tensor::<Flex, 1>::from_data(burn::tensor::TensorData::new(blocks, [n]), &device);
    let got = host_f32(c.reduce_scatter_sum_tensor(send).unwrap());
    assert_eq!(got, [w * r + tri]);
}

fn point_to_point_and_collectives(c: &dyn Communicator) {
    let (r, w) = (c.rank(), c.world_size());
    let rf = r as f32;
    let wf = w as f32;
    // Sum of ranks 0..w.
    let tri = wf * (wf - 1.0) / 2.0;

    let mut buf = vec![rf, 1.0, -2.0 * rf];
    c.all_reduce_sum(&mut buf).unwrap();
    assert_eq!(buf, [tri, wf, -2.0 * tri]);

    let mut buf = vec![rf; 4];
    c.all_reduce_avg(&mut buf).unwrap();
    assert_eq!(buf, vec![tri / wf; 4]);

    let mut all = vec![0.0; 2 * w];
    c.all_gather(&[rf, 10.0 + rf], &mut all).unwrap();
    let want: Vec<f32> = (0..w).flat_map(|k| [k as f32, 10.0 + k as f32]).collect();
    assert_eq!(all, want);

    // Block k of rank q's input is q + 100 k; block r of the sum is tri + 100 r w.
    let send: Vec<f32> = (0..w).flat_map(|k| [rf + 100.0 * k as f32; 2]).collect();
    let mut mine = vec![0.0; 2];
    c.reduce_scatter_sum(&send, &mut mine).unwrap();
    assert_eq!(mine, [tri + 100.0 * rf * wf; 2]);

    let mut b = if r == w - 1 {
        vec![7.0, 8.0]
    } else {
        vec![0.0; 2]
    };
    c.broadcast(&mut b, w - 1).unwrap();
    assert_eq!(b, [7.0, 8.0]);

    // A ring: send to the next rank, receive from the previous one.
    let (next, prev) = ((r + 1) % w, (r + w - 1) % w);
    if r % 2 == 0 {
        c.send(&[rf; 3], next, 5).unwrap();
    }
    let mut got = vec![0.0; 3];
    c.recv(&mut got, prev, 5).unwrap();
    if r % 2 == 1 {
        c.send(&[rf; 3], next, 5).unwrap();
    }
    assert_eq!(got, [prev as f32; 3]);

    assert!(c.broadcast(&mut b, w).is_err());
    assert!(c.all_gather(&[1.0], &mut [0.0; 1]).is_err() || w == 1);
    c.barrier().unwrap();
}
