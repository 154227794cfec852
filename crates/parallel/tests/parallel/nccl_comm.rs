//! The NCCL communicator through the real binding, on the NCCL test double
//! (`crates/nccl-double`: NCCL's C API over MPI on host memory, loaded
//! through `FERROTRON_NCCL_LIBRARY`): the communicator contract
//! (`contract/mod.rs`) on 2 and 4 ranks, grouped sends and receives, the
//! device-buffer path (`comm::nccl::device`) in f32 and bf16 on host
//! memory, an
//! NCCL error code turned into a message, and the watchdog ending a job
//! whose rank never arrives. The launcher tests re-run this test binary
//! under `mpirun`, selecting an ignored worker test. Skipped (with a printed
//! reason) without the `mpi` feature; with it, a missing `mpirun` or double
//! is a failure. A job still running after its deadline is killed and fails
//! the test (a hang).

use std::process::Output;
use std::time::Duration;

use ferrotron_test_support::mpirun;
use ferrotron_test_support::nccl_double;
use ferrotron_test_support::skip::skip;

/// When a job that never ends is killed (one job takes seconds).
const DEADLINE: Duration = Duration::from_secs(300);

/// `false` (and a printed reason) without the `mpi` feature.
fn mpi_built() -> bool {
    if !cfg!(feature = "mpi") {
        skip("built without the `mpi` feature; run `cargo test -p ferrotron-parallel --features mpi`");
    }
    cfg!(feature = "mpi")
}

/// Runs the ignored test `worker` of this binary on `ranks` processes with
/// the double as the NCCL library, killed after `deadline`.
fn mpirun(ranks: usize, worker: &str, deadline: Duration) -> (Output, String) {
    let library = format!(
        "FERROTRON_NCCL_LIBRARY={}",
        nccl_double::library().display()
    );
    mpirun::worker(ranks, &["-x", &library], worker, deadline)
}

#[test]
fn nccl_communicator_meets_the_contract_on_2_and_4_ranks() {
    if !mpi_built() {
        return;
    }
    for ranks in [2, 4] {
        let (o, text) = mpirun(ranks, "nccl_comm::nccl_worker", DEADLINE);
        assert!(o.status.success(), "np {ranks}:\n{text}");
        assert!(
            text.matches("1 passed").count() >= ranks,
            "np {ranks}:\n{text}"
        );
    }
}

/// Rank 0 sleeps far past a 1 s timeout before its all-reduce: rank 1's
/// watchdog must name the operation and end the job (the deadline catches
/// a hang).
#[test]
fn an_nccl_operation_past_the_timeout_ends_the_job_naming_it() {
    if !mpi_built() {
        return;
    }
    let (o, text) = mpirun(
        2,
        "nccl_comm::nccl_late_rank_worker",
        Duration::from_secs(100),
    );
    assert!(!o.status.success(), "{text}");
    let want = "error (rank 1): all_reduce #1 did not complete within 1s on NCCL";
    assert!(text.contains(want), "missing `{want}` in:\n{text}");
}

/// One rank's checks; run only under mpirun by the tests above.
#[test]
#[ignore = "runs under mpirun, started by nccl_communicator_meets_the_contract_on_2_and_4_ranks"]
fn nccl_worker() {
    #[cfg(feature = "mpi")]
    worker::run();
}

/// Rank 0 arrives late; run only under mpirun.
#[test]
#[ignore = "runs under mpirun, started by an_nccl_operation_past_the_timeout_ends_the_job_naming_it"]
fn nccl_late_rank_worker() {
    #[cfg(feature = "mpi")]
    worker::late_rank();
}

#[cfg(feature = "mpi")]
mod worker {
    use std::ffi::c_void;
    use std::sync::Arc;
    use std::time::Duration;

    use burn::tensor::bf16;
    use ferrotron_engine::precision::Precision;
    use ferrotron_parallel::comm::nccl::device::{
        DeviceComm, HostStreams, Route, TensorCollectives,
    };
    use ferrotron_parallel::comm::nccl::{
        NcclComm, NcclCommunicator, NcclDataType, NcclLibrary, NcclReduceOp,
    };
    use ferrotron_parallel::comm::tensor::{from_host, host_f32};
    use ferrotron_parallel::comm::{Communicator, MpiCommunicator, DEFAULT_TIMEOUT};

    /// MPI's world and the library named by `FERROTRON_NCCL_LIBRARY`.
    fn start() -> (Arc<dyn Communicator>, Arc<NcclLibrary>) {
        let lib = NcclLibrary::load().expect("the test double loads");
        (Arc::new(MpiCommunicator::init().unwrap()), Arc::new(lib))
    }

    pub fn run() {
        let (mpi, lib) = start();
        assert_eq!(lib.version().unwrap(), 22_000, "the double's version");
        grouped_exchange_and_errors(&lib, &*mpi);
        device_buffers(&lib, &*mpi);
        device_exchange(&lib, &*mpi);
        contract_on_nccl(lib, mpi);
    }

    /// The device-buffer path ([`DeviceComm`] on host memory, its
    /// `HostStreams`) against sums and concatenations computed here: f32
    /// exactly; bf16 on the wire (`--reduce-dtype bf16`) as each rank's
    /// values rounded to bf16, summed, and the sum rounded to bf16.
    fn device_buffers(lib: &Arc<NcclLibrary>, host: &dyn Communicator) {
        let c = DeviceComm::init(lib.clone(), host, Box::new(HostStreams)).unwrap();
        let (r, w) = (c.rank(), c.world_size());
        // Multiples of 1/128 in [1, 2): exact in bf16, and their sums exact
        // in f32 in any order (MPI's), but not all in bf16.
        let value = |rank: usize, i: usize| 1.0 + (i + 7 * rank) as f32 / 128.0;
        let n = 6;
        let mine: Vec<f32> = (0..n * w).map(|i| value(r, i)).collect();
        let sum = |i: usize| (0..w).map(|q| value(q, i)).sum::<f32>();

        let mut f = mine.clone();
        c.host_all_reduce_sum(&mut f, NcclDataType::F32).unwrap();
        let want: Vec<f32> = (0..n * w).map(sum).collect();
        assert_eq!(f, want, "f32 all-reduce");

        let mut gathered = vec![0f32; n * w];
        c.host_all_gather(&mine[..n], &mut gathered, NcclDataType::F32)
            .unwrap();
        let want: Vec<f32> = (0..w)
            .flat_map(|q| (0..n).map(move |i| value(q, i)))
            .collect();
        assert_eq!(gathered, want, "f32 all-gather");

        let mut block = vec![0f32; n];
        c.host_reduce_scatter_sum(&mine, &mut block, NcclDataType::F32)
            .unwrap();
        let want: Vec<f32> = (r * n..(r + 1) * n).map(sum).collect();
        assert_eq!(block, want, "f32 reduce-scatter");

        // bf16 on the wire: 2 bytes a value.
        let to_bf16 = |x: f32| bf16::from_f32(x).to_bits();
        let from_bf16 = |b: u16| bf16::from_bits(b).to_f32();
        let wide_sum = |i: usize| {
            let mut s = [(0..w).map(|q| from_bf16(to_bf16(value(q, i)))).sum::<f32>()];
            Precision::Bf16.round_in_place(&mut s);
            s[0]
        };
        let mut b: Vec<u16> = mine.iter().map(|&x| to_bf16(x)).collect();
        c.host_all_reduce_sum(&mut b, NcclDataType::Bf16).unwrap();
        let got: Vec<f32> = b.iter().map(|&x| from_bf16(x)).collect();
        let want: Vec<f32> = (0..n * w).map(wide_sum).collect();
        assert_eq!(got, want, "bf16 all-reduce");
        assert!(
            (0..n * w).any(|i| wide_sum(i) != sum(i)),
            "the bf16 rounding shows in these values"
        );

        let send: Vec<u16> = mine.iter().map(|&x| to_bf16(x)).collect();
        let mut block = vec![0u16; n];
        c.host_reduce_scatter_sum(&send, &mut block, NcclDataType::Bf16)
            .unwrap();
        let got: Vec<f32> = block.iter().map(|&x| from_bf16(x)).collect();
        let want: Vec<f32> = (r * n..(r + 1) * n).map(wide_sum).collect();
        assert_eq!(got, want, "bf16 reduce-scatter");

        let mut gathered = vec![0u16; n * w];
        c.host_all_gather(&send[..n], &mut gathered, NcclDataType::Bf16)
            .unwrap();
        let want: Vec<u16> = (0..w)
            .flat_map(|q| (0..n).map(move |i| to_bf16(value(q, i))))
            .collect();
        assert_eq!(gathered, want, "bf16 all-gather");

        // A value of the wrong size for the wire type is refused.
        let err = c
            .host_all_reduce_sum(&mut [0f32; 2], NcclDataType::Bf16)
            .unwrap_err()
            .to_string();
        assert!(err.contains("4-byte values for Bf16"), "{err}");
    }

    /// [`TensorCollectives::exchange`] on [`DeviceComm`] (host memory):
    /// each rank sends two messages of different lengths to the next rank
    /// around the ring, posted against their tag order, and receives the
    /// previous rank's two, listed in the other order; each arrives whole
    /// in its place, in f32 and with bf16 on the wire (values exact in
    /// bf16 arrive as themselves; `1 + 2^-10` arrives as bf16's 1).
    fn device_exchange(lib: &Arc<NcclLibrary>, host: &dyn Communicator) {
        type B = burn::backend::Flex;
        let c = DeviceComm::init(lib.clone(), host, Box::new(HostStreams)).unwrap();
        let (r, w) = (c.rank(), c.world_size());
        let (next, prev) = ((r + 1) % w, (r + w - 1) % w);
        let device = Default::default();
        // Message `tag` of rank `rank`: `tag + 3` values, exact in bf16.
        let msg = |rank: usize, tag: i32| -> Vec<f32> {
            (0..tag as usize + 3)
                .map(|i| 1.0 + (i + 7 * rank + tag as usize) as f32 / 128.0)
                .collect()
        };
        let route = |peer, tag| Route { peer, tag };
        for wire in [Precision::Fp32, Precision::Bf16] {
            let sends = [5, 2]
                .map(|tag| (route(next, tag), from_host::<B>(msg(r, tag), &device)))
                .to_vec();
            let recvs = [2, 5].map(|tag| (route(prev, tag), msg(prev, tag).len()));
            let got = TensorCollectives::<B>::exchange(&c, sends, &recvs, wire, &device).unwrap();
            let got: Vec<Vec<f32>> = got.into_iter().map(host_f32).collect();
            assert_eq!(got, [msg(prev, 2), msg(prev, 5)], "{wire} exchange");
        }
        let odd = 1.0 + 2f32.powi(-10);
        let sends = vec![(route(next, 0), from_host::<B>(vec![odd], &device))];
        let got = TensorCollectives::<B>::exchange(
            &c,
            sends,
            &[(route(prev, 0), 1)],
            Precision::Bf16,
            &device,
        )
        .unwrap();
        assert_eq!(host_f32(got[0].clone()), [1.0], "bf16 on the wire rounds");
    }

    fn contract_on_nccl(lib: Arc<NcclLibrary>, mpi: Arc<dyn Communicator>) {
        let nccl = NcclCommunicator::new(lib, mpi, DEFAULT_TIMEOUT).unwrap();
        crate::contract::check(Arc::new(nccl));
    }

    /// Pairs of ranks send to each other at once inside a group (without
    /// the group, two synchronous sends would wait for each other forever);
    /// a data type the double lacks comes back as NCCL's error and text.
    fn grouped_exchange_and_errors(lib: &Arc<NcclLibrary>, host: &dyn Communicator) {
        let c = NcclComm::init(lib.clone(), host).unwrap();
        let (r, peer) = (c.rank(), c.rank() ^ 1);
        let send = [r as f32; 4];
        let mut recv = [0f32; 4];
        let null = std::ptr::null_mut::<c_void>();
        lib.group_start().unwrap();
        // SAFETY: host buffers the double reads and writes before group_end returns.
        unsafe {
            c.send(send.as_ptr().cast(), 4, NcclDataType::F32, peer, null)
                .unwrap();
            c.recv(recv.as_mut_ptr().cast(), 4, NcclDataType::F32, peer, null)
                .unwrap();
        }
        lib.group_end().unwrap();
        assert_eq!(recv, [peer as f32; 4]);

        let mut buf = [0f32; 2];
        let p = buf.as_mut_ptr().cast::<c_void>();
        // SAFETY: the double refuses the call before touching the buffer.
        let err = unsafe { c.all_reduce(p, p, 2, NcclDataType::F16, NcclReduceOp::Sum, null) }
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("ncclAllReduce: ncclInvalidArgument (4): invalid argument"),
            "{err}"
        );
    }

    pub fn late_rank() {
        let (mpi, lib) = start();
        let nccl = NcclCommunicator::new(lib, mpi, Duration::from_secs(1)).unwrap();
        if nccl.rank() == 0 {
            std::thread::sleep(Duration::from_secs(200));
        }
        let mut buf = [1.0f32];
        nccl.all_reduce_sum(&mut buf).unwrap();
        unreachable!("the all-reduce of rank {} returned", nccl.rank());
    }
}
