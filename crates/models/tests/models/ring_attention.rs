//! Ring attention (`ferrotron_parallel::context`) with the CPU attention
//! core as its block kernel (`ops::HostBlockAttention`) against the
//! one-rank attention at 1024 positions: the output and the gradients
//! `dq`, `dk`, `dv` of the reference (`ops::attention_reference` and its
//! backward, one `[seq, seq]` softmax) and the log-sum-exp of f64 host
//! code, each within 1e-5 of its tensor's largest value; causal (so the
//! chunk pairing), grouped-query heads, with and without ALiBi.
//!
//! The simulated test runs rings of 1, 2, 4 and 8 ranks in one process
//! (each rank's steps in a loop, the blocks handed over by index); a
//! second runs rings of 2 and 4 with the fused CubeCL attention as
//! the block kernel (`ops::CubeBlockAttention`) on wgpu. The
//! MPI test re-runs this binary under `mpirun -np 4`, selecting the
//! ignored worker: a ring of 4 ranks (the world) and, on the same ranks,
//! two rings of 2 (cp 2 x dp 2, the CP groups of `ProcessGroups`, each
//! replica on its own data); a failing assertion on any rank makes
//! `mpirun` exit non-zero. Skipped (with a printed reason) without the
//! `mpi` feature; with it, a missing `mpirun` is a failure. A job still
//! running after `DEADLINE` is killed and fails the test.
#![cfg(feature = "flex")]

use std::time::Duration;

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use ferrotron_models::layers::position::alibi_slopes;
use ferrotron_models::ops::{
    attention_reference, attention_reference_backward, HostBlockAttention,
};
use ferrotron_parallel::context::simulate::simulate_ring;
use ferrotron_parallel::context::HeadBuf;

use ferrotron_test_support::mpirun;
use ferrotron_test_support::skip::skip;

/// When a job that never ends is killed (the job takes seconds).
const DEADLINE: Duration = Duration::from_secs(300);

/// Positions per sequence.
const SEQ: usize = 1024;

/// One attention shape.
#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    alibi: bool,
}

/// Grouped-query heads without ALiBi (Llama), and with ALiBi.
const CASES: [Case; 2] = [
    Case {
        batch: 1,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        alibi: false,
    },
    Case {
        batch: 2,
        heads: 4,
        kv_heads: 1,
        head_dim: 8,
        alibi: true,
    },
];

/// `[q, k, v, d_out]` of the whole sequences, deterministic in `seed`.
fn inputs(c: Case, seed: u64) -> [HeadBuf; 4] {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut values = |dims: [usize; 4]| {
        let n = dims.iter().product();
        let data = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 4001) as f32 / 2000.0 - 1.0
            })
            .collect();
        HeadBuf::new(dims, data)
    };
    let q = [c.batch, c.heads, SEQ, c.head_dim];
    let kv = [c.batch, c.kv_heads, SEQ, c.head_dim];
    [values(q), values(kv), values(kv), values(q)]
}

fn slopes(c: Case) -> Option<Vec<f32>> {
    c.alibi.then(|| alibi_slopes(c.heads))
}

/// The additive bias of the whole sequence `[1, heads or 1, seq, seq]`:
/// `-inf` above the diagonal, ALiBi's `slope_h * (j - i)` or 0 elsewhere.
fn whole_bias(c: Case) -> Vec<f32> {
    let slopes = slopes(c).unwrap_or(vec![0.0]);
    let mut bias = Vec::with_capacity(slopes.len() * SEQ * SEQ);
    for s in slopes {
        for i in 0..SEQ {
            for j in 0..SEQ {
                bias.push(if j > i {
                    f32::NEG_INFINITY
                } else {
                    s * (j as f32 - i as f32)
                });
            }
        }
    }
    bias
}

fn tensor(x: &HeadBuf) -> Tensor<Flex, 4> {
    Tensor::from_data(TensorData::new(x.data.clone(), x.dims), &Default::default())
}

fn buf(t: Tensor<Flex, 4>) -> HeadBuf {
    let dims = t.dims();
    HeadBuf::new(dims, t.into_data().into_vec::<f32>().unwrap())
}

/// The one-rank attention `[out, lse, dq, dk, dv]`: the reference's
/// output and gradients, the log-sum-exp in f64 from the inputs.
fn one_rank(c: Case, [q, k, v, d_out]: &[HeadBuf; 4]) -> [HeadBuf; 5] {
    let bias = whole_bias(c);
    let bias_heads = bias.len() / (SEQ * SEQ);
    let bias_t = tensor(&HeadBuf::new([1, bias_heads, SEQ, SEQ], bias.clone()));
    let out = attention_reference(tensor(q), tensor(k), tensor(v), &bias_t);
    let [dq, dk, dv] =
        attention_reference_backward(tensor(q), tensor(k), tensor(v), &bias_t, tensor(d_out));
    let d = c.head_dim;
    let mut lse = Vec::with_capacity(c.batch * c.heads * SEQ);
    for b in 0..c.batch {
        for h in 0..c.heads {
            let g = h / (c.heads / c.kv_heads);
            let bias_h = &bias[(h % bias_heads) * SEQ * SEQ..];
            for i in 0..SEQ {
                let qi = &q.data[((b * c.heads + h) * SEQ + i) * d..][..d];
                let row: Vec<f64> = (0..=i)
                    .map(|j| {
                        let kj = &k.data[((b * c.kv_heads + g) * SEQ + j) * d..][..d];
                        let dot: f64 = qi.iter().zip(kj).map(|(a, b)| *a as f64 * *b as f64).sum();
                        dot / (d as f64).sqrt() + bias_h[i * SEQ + j] as f64
                    })
                    .collect();
                let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                lse.push((max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln()) as f32);
            }
        }
    }
    let lse = HeadBuf::new([c.batch, c.heads, SEQ, 1], lse);
    [buf(out), lse, buf(dq), buf(dk), buf(dv)]
}

const NAMES: [&str; 5] = ["out", "lse", "dq", "dk", "dv"];

/// Within 1e-5 of the largest value of `want`.
fn assert_close(got: &HeadBuf, want: &HeadBuf, what: &str) {
    assert_eq!(got.dims, want.dims, "{what}: shape");
    let scale = want.data.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let worst = got
        .data
        .iter()
        .zip(&want.data)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst <= 1e-5 * scale,
        "{what}: off by {worst}, largest value {scale}"
    );
}

#[test]
fn simulated_rings_of_1_2_4_and_8_ranks_equal_the_one_rank_attention() {
    for (n, c) in CASES.into_iter().enumerate() {
        let whole = inputs(c, n as u64 + 1);
        let want = one_rank(c, &whole);
        let kernel = HostBlockAttention::new(slopes(c));
        for cp in [1, 2, 4, 8] {
            let got = simulate_ring(&kernel, cp, whole.each_ref()).unwrap();
            for ((g, w), name) in got.iter().zip(&want).zip(NAMES) {
                assert_close(g, w, &format!("{c:?} cp {cp}: {name}"));
            }
        }
    }
}

/// The GPU path: the fused CubeCL attention as the block kernel
/// (`ops::CubeBlockAttention`, wgpu over lavapipe, the kernels the device
/// gets by default), on the ALiBi case with grouped-query heads (ALiBi
/// makes every piece off the diagonal shift its log-sum-exp). Each
/// forward and backward kernel compiles once causal and once unmasked.
#[test]
fn simulated_rings_on_the_fused_kernels_equal_the_one_rank_attention() {
    use burn_wgpu::WgpuRuntime;
    use ferrotron_kernels::wgpu_setup::default_device;
    use ferrotron_models::ops::CubeBlockAttention;

    let c = CASES[1];
    let whole = inputs(c, 2);
    let want = one_rank(c, &whole);
    let kernel = CubeBlockAttention::<WgpuRuntime>::new(&default_device(), c.head_dim, slopes(c));
    // A ring of one is the kernel alone (the kernel tests' case).
    for cp in [2, 4] {
        let got = simulate_ring(&kernel, cp, whole.each_ref()).unwrap();
        for ((g, w), name) in got.iter().zip(&want).zip(NAMES) {
            assert_close(g, w, &format!("fused {c:?} cp {cp}: {name}"));
        }
    }
}

/// The same rings on the device's own tensors (`CubeBlockAttention` as a
/// block kernel of `Tensor<B, 4>`, what a ring on device collectives
/// runs): each piece sliced from the block on the device, the pieces
/// merged and their gradients summed by Burn operations, ALiBi's shift
/// added on the device; against the one-rank attention.
#[test]
fn simulated_rings_on_device_tensors_equal_the_one_rank_attention() {
    use burn_cubecl::CubeBackend;
    use burn_wgpu::WgpuRuntime;
    use ferrotron_kernels::wgpu_setup::default_device;
    use ferrotron_models::ops::CubeBlockAttention;
    use ferrotron_parallel::context::simulate_ring_on;

    type Gpu = CubeBackend<WgpuRuntime, f32, i32, u32>;
    let c = CASES[1];
    let whole = inputs(c, 2);
    let want = one_rank(c, &whole);
    let device = default_device();
    let kernel = CubeBlockAttention::<WgpuRuntime>::new(&device, c.head_dim, slopes(c));
    let load = |x: HeadBuf| Tensor::<Gpu, 4>::from_data(TensorData::new(x.data, x.dims), &device);
    let read = |t: Tensor<Gpu, 4>| {
        let dims = t.dims();
        HeadBuf::new(dims, t.into_data().into_vec::<f32>().unwrap())
    };
    for cp in [2, 4] {
        let got = simulate_ring_on(&kernel, cp, whole.each_ref(), load, read).unwrap();
        for ((g, w), name) in got.iter().zip(&want).zip(NAMES) {
            assert_close(g, w, &format!("fused on device {c:?} cp {cp}: {name}"));
        }
    }
}

#[test]
fn mpi_ring_attention_on_4_ranks_equals_the_one_rank_attention() {
    if !cfg!(feature = "mpi") {
        skip(
            "built without the `mpi` feature; run `cargo test -p ferrotron-models \
             --features mpi --test models ring_attention`",
        );
        return;
    }
    let (o, text) = mpirun::worker(4, &[], "ring_attention::ring_worker", DEADLINE);
    assert!(o.status.success(), "{text}");
    assert_eq!(text.matches("1 passed").count(), 4, "{text}");
}

/// One rank's rings; run only under mpirun by the test above.
#[test]
#[ignore = "runs under mpirun, started by mpi_ring_attention_on_4_ranks_equals_the_one_rank_attention"]
fn ring_worker() {
    #[cfg(feature = "mpi")]
    worker::run();
}

#[cfg(feature = "mpi")]
mod worker {
    use std::sync::Arc;

    use ferrotron_parallel::comm::{Communicator, MpiCommunicator};
    use ferrotron_parallel::context::simulate::rank_part;
    use ferrotron_parallel::context::{ring_backward, ring_forward, ChunkLayout, Kept};
    use ferrotron_parallel::groups::ProcessGroups;
    use ferrotron_parallel::mesh::Mesh;

    use super::*;

    pub fn run() {
        let world: Arc<dyn Communicator> = Arc::new(MpiCommunicator::init().unwrap());
        assert_eq!(world.world_size(), 4, "run with mpirun -np 4");
        // A ring of 4 (the world), then cp 2 x dp 2: two rings of 2.
        for (dp, cp) in [(1, 4), (2, 2)] {
            let mesh = Mesh::with_cp(Some(dp), 1, cp, 1, 4).unwrap();
            let groups = ProcessGroups::new(world.clone(), mesh).unwrap();
            let ring = groups.cp();
            let rank = ring.rank();
            assert_eq!((ring.world_size(), rank), (cp, groups.coord().cp));
            let layout = ChunkLayout::new(SEQ, cp).unwrap();
            for (n, c) in CASES.into_iter().enumerate() {
                // Each replica its own data.
                let whole = inputs(c, (n + 10 * groups.coord().dp) as u64 + 1);
                let want = one_rank(c, &whole);
                let [q, k, v, d_out] = whole.each_ref().map(|x| rank_part(layout, x, rank));
                let kernel = HostBlockAttention::new(slopes(c));
                let (out, lse) = ring_forward(ring.as_ref(), &kernel, layout, &q, &k, &v).unwrap();
                let kept = Kept::of([&q, &k, &v, &out, &lse]);
                let [dq, dk, dv] =
                    ring_backward(ring.as_ref(), &kernel, layout, kept, &d_out).unwrap();
                for ((g, w), name) in [out, lse, dq, dk, dv].iter().zip(&want).zip(NAMES) {
                    let what = format!("dp {dp} x cp {cp}, rank {rank}, {c:?}: {name}");
                    assert_close(g, &rank_part(layout, w, rank), &what);
                }
            }
        }
        world.barrier().unwrap();
    }
}
