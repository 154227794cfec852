//! The measurement of `bench comm`: each operation on both paths, checked
//! equal and timed.
//!
//! It runs only on a backend with a device path: cuda, rocm, or flex with
//! `mpi` (the host-memory library). A build with none of those features
//! compiles only the refusal in [`on_backend`], so the measurement's items
//! are unused there.
#![cfg_attr(
    not(any(
        feature = "cuda",
        feature = "rocm",
        all(feature = "flex", feature = "mpi")
    )),
    allow(dead_code, unused_variables, unused_imports)
)]

use std::sync::Arc;
use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use ferrotron_engine::backend::BackendKind;
use ferrotron_engine::precision::Precision;
use ferrotron_parallel::comm::nccl::device::wire::wire_bytes;
use ferrotron_parallel::comm::nccl::device::{Route, TensorCollectives};
use ferrotron_parallel::comm::nccl::NcclLibrary;
use ferrotron_parallel::comm::tensor::{from_host, host_f32};
use ferrotron_parallel::comm::{CommError, Communicator, SingleProcess};
use serde::Serialize;

use super::CommBenchArgs;
use crate::error::usage;

/// One operation's result.
#[derive(Serialize)]
pub struct Row {
    /// `all_reduce`, `all_gather`, `reduce_scatter` or `send_recv`.
    pub op: &'static str,
    /// The dtype on the wire (`fp32`, `bf16`).
    pub wire: &'static str,
    /// Bytes one rank sends into the collective.
    pub wire_bytes: usize,
    /// Median seconds of the device path.
    pub device_s: f64,
    /// Median seconds of the host copy path.
    pub host_copy_s: f64,
    /// Whether both paths gave the same values, bit for bit.
    pub equal: bool,
}

/// The operations measured: (name, reduction or wire precision).
const OPS: [(&str, Precision); 7] = [
    ("all_reduce", Precision::Fp32),
    ("all_reduce", Precision::Bf16),
    ("all_gather", Precision::Fp32),
    ("reduce_scatter", Precision::Fp32),
    ("reduce_scatter", Precision::Bf16),
    ("send_recv", Precision::Fp32),
    ("send_recv", Precision::Bf16),
];

/// The rows of `a` on backend `kind`, with the library `lib`.
pub fn on_backend(
    kind: BackendKind,
    lib: Arc<NcclLibrary>,
    a: &CommBenchArgs,
) -> anyhow::Result<Vec<Row>> {
    match kind {
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            use ferrotron_parallel::comm::nccl::device::cube::CudaComm;
            let device = Default::default();
            let comm = CudaComm::init(lib, &SingleProcess, &device)?;
            measure::<ferrotron_models::ops::Cuda>(&comm, &device, a)
        }
        #[cfg(feature = "rocm")]
        BackendKind::Rocm => {
            use ferrotron_parallel::comm::nccl::device::cube::HipComm;
            let device = Default::default();
            let comm = HipComm::init(lib, &SingleProcess, &device)?;
            measure::<ferrotron_models::ops::Rocm>(&comm, &device, a)
        }
        #[cfg(all(feature = "flex", feature = "mpi"))]
        BackendKind::Flex => {
            use ferrotron_parallel::comm::nccl::device::{DeviceComm, HostStreams};
            // The double runs over MPI's world: one process of its own.
            let world = ferrotron_parallel::comm::MpiCommunicator::init()?;
            if world.world_size() != 1 {
                return Err(usage(
                    "bench comm runs on one rank; start it without mpirun",
                ));
            }
            let comm = DeviceComm::init(lib, &world, Box::new(HostStreams))?;
            measure::<burn::backend::Flex>(&comm, &Default::default(), a)
        }
        other => Err(usage(format!(
            "bench comm on {other} needs {}",
            if other == BackendKind::Flex {
                "the `mpi` cargo feature (the host-memory library runs over MPI)"
            } else {
                "its cargo feature"
            }
        ))),
    }
}

/// The host copy path of `op` on `t`, as the trainer runs it: the values
/// to the host, rounded to `reduce` before and after the collective on
/// host `f32` (here one rank's, [`SingleProcess`]), and back. One rank's
/// `send_recv` to itself is the copies and the rounding alone.
fn host_path<B: Backend>(
    op: &str,
    reduce: Precision,
    t: Tensor<B, 1>,
) -> Result<Tensor<B, 1>, CommError> {
    let device = t.device();
    let mut values = host_f32(t);
    reduce.round_in_place(&mut values);
    let host = SingleProcess;
    let mut out = vec![0.0; values.len()];
    match op {
        "all_reduce" => {
            host.all_reduce_sum(&mut values)?;
            out = values;
        }
        "all_gather" => host.all_gather(&values, &mut out)?,
        "send_recv" => out = values,
        _ => host.reduce_scatter_sum(&values, &mut out)?,
    }
    reduce.round_in_place(&mut out);
    Ok(from_host(out, &device))
}

/// The device path of `op` on `t` through `c`.
fn device_path<B: Backend>(
    c: &dyn TensorCollectives<B>,
    op: &str,
    reduce: Precision,
    t: Tensor<B, 1>,
) -> Result<Tensor<B, 1>, CommError> {
    match op {
        "all_reduce" => c.all_reduce_sum(t, reduce),
        "all_gather" => c.all_gather(t, reduce),
        "send_recv" => send_recv_to_self(c, reduce, t),
        _ => c.reduce_scatter_sum(t, reduce),
    }
}

/// `t` `[n]` sent by this rank to itself as two messages in one
/// [`TensorCollectives::exchange`] (the first third, tag 0, and the rest,
/// tag 1, both posted against tag order) with `wire` on the wire, and put
/// back together.
fn send_recv_to_self<B: Backend>(
    c: &dyn TensorCollectives<B>,
    wire: Precision,
    t: Tensor<B, 1>,
) -> Result<Tensor<B, 1>, CommError> {
    let device = t.device();
    let n = t.dims()[0];
    let third = n / 3;
    let (first, rest) = (Route { peer: 0, tag: 0 }, Route { peer: 0, tag: 1 });
    let sends = vec![
        (rest, t.clone().slice(third..n)),
        (first, t.slice(0..third)),
    ];
    let got = c.exchange(sends, &[(rest, n - third), (first, third)], wire, &device)?;
    let [rest, first]: [Tensor<B, 1>; 2] =
        got.try_into().map_err(|got: Vec<_>| CommError::BadLength {
            op: "send_recv",
            detail: format!("{} messages came back, not 2", got.len()),
        })?;
    Ok(Tensor::cat(vec![first, rest], 0))
}

/// Median seconds of `reps` runs of `f` after `warmup` untimed ones, each
/// ended by a sync of `device`.
fn timed<B: Backend>(
    device: &B::Device,
    warmup: usize,
    reps: usize,
    mut f: impl FnMut() -> Result<Tensor<B, 1>, CommError>,
) -> anyhow::Result<f64> {
    let mut times = Vec::with_capacity(reps);
    for k in 0..warmup + reps {
        let start = Instant::now();
        let out = f()?;
        B::sync(device).map_err(|e| anyhow::anyhow!("device sync: {e:?}"))?;
        drop(out);
        if k >= warmup {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Every operation of [`OPS`] on `a.elems` random values on `device`.
fn measure<B: Backend>(
    c: &dyn TensorCollectives<B>,
    device: &B::Device,
    a: &CommBenchArgs,
) -> anyhow::Result<Vec<Row>> {
    anyhow::ensure!(c.world_size() == 1, "bench comm runs on one rank");
    let x = Tensor::<B, 1>::random([a.elems], Distribution::Normal(0.0, 1.0), device);
    let mut rows = Vec::new();
    for (op, reduce) in OPS {
        let on_device = host_f32(device_path(c, op, reduce, x.clone())?);
        let on_host = host_f32(host_path(op, reduce, x.clone())?);
        let equal = on_device.len() == on_host.len()
            && on_device
                .iter()
                .zip(&on_host)
                .all(|(d, h)| d.to_bits() == h.to_bits());
        let device_s = timed(device, a.warmup, a.reps, || {
            device_path(c, op, reduce, x.clone())
        })?;
        let host_copy_s = timed(device, a.warmup, a.reps, || {
            host_path(op, reduce, x.clone())
        })?;
        let wire = if op == "all_gather" {
            Precision::Fp32
        } else {
            reduce
        };
        rows.push(Row {
            op,
            wire: wire.name(),
            wire_bytes: wire_bytes(a.elems, wire),
            device_s,
            host_copy_s,
            equal,
        });
    }
    Ok(rows)
}
