//! The pipeline's messages and sequence parallelism's partial-gradient
//! sums on device collectives (`Trainer::pipeline_on_device`,
//! `Trainer::partial_grads_on`; what `--comm nccl` sets up) on 2 ranks
//! must equal the host path (MPI) bit for bit: every step's loss and
//! gradient norm, the evaluation loss and every final weight, after 3
//! steps with gradient accumulation.
//!
//! - pp2 (1F1B; interleaved with 2 chunks per stage) for the GPT mini
//!   (a tied embedding, summed over the first and last stage) and the
//!   Llama mini, in f32 and bf16 (the activations and their gradients
//!   travel as bf16 on the device path, as f32 holding bf16 values on
//!   the host path);
//! - tp2 with sequence parallelism (the norms' partial gradients summed
//!   over the TP group) for both minis in f32.
//!
//! The device path is `comm::nccl::device::DeviceComm` with the NCCL test
//! double on host memory (the path a GPU takes, minus the device
//! pointers), behind a wrapper that counts its calls: each run must have
//! made the calls it moved (point-to-point exchanges, the tied sum, the
//! partial sums). Why bit-identity holds: the messages carry values the
//! receiver casts back to the same dtype, and each sum adds two f32
//! values, which both paths do alike. Runs inside the 2-rank launch of
//! `gradients_parallel`, so it adds no `mpirun` launch.

#[cfg(feature = "mpi")]
pub mod worker {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{Device, Tensor};
    use ferrotron_engine::precision::Precision;
    use ferrotron_job::config::PpSchedule;
    use ferrotron_job::{parallelize_fresh, JobConfig, World};
    use ferrotron_parallel::comm::nccl::device::{
        DeviceComm, HostStreams, Route, SharedCollectives, TensorCollectives,
    };
    use ferrotron_parallel::comm::nccl::NcclLibrary;
    use ferrotron_parallel::comm::{CommError, Communicator};
    use ferrotron_parallel::groups::ProcessGroups;
    use ferrotron_parallel::tensor::TpGroup;

    use crate::gradients::{global_batch, job};
    use crate::offload_parallel::worker::weight_bits;

    type B = Autodiff<Flex>;
    type Inner = Flex;

    /// Steps of each run.
    const STEPS: usize = 3;

    /// A [`DeviceComm`] that counts its calls by kind.
    struct Counted {
        comm: DeviceComm,
        sums: AtomicUsize,
        exchanges: AtomicUsize,
    }

    impl TensorCollectives<Inner> for Counted {
        fn world_size(&self) -> usize {
            self.comm.world_size()
        }
        fn all_reduce_sum(
            &self,
            t: Tensor<Inner, 1>,
            reduce: Precision,
        ) -> Result<Tensor<Inner, 1>, CommError> {
            self.sums.fetch_add(1, Ordering::Relaxed);
            TensorCollectives::<Inner>::all_reduce_sum(&self.comm, t, reduce)
        }
        fn all_gather(
            &self,
            t: Tensor<Inner, 1>,
            wire: Precision,
        ) -> Result<Tensor<Inner, 1>, CommError> {
            TensorCollectives::<Inner>::all_gather(&self.comm, t, wire)
        }
        fn reduce_scatter_sum(
            &self,
            t: Tensor<Inner, 1>,
            reduce: Precision,
        ) -> Result<Tensor<Inner, 1>, CommError> {
            TensorCollectives::<Inner>::reduce_scatter_sum(&self.comm, t, reduce)
        }
        fn exchange(
            &self,
            sends: Vec<(Route, Tensor<Inner, 1>)>,
            recvs: &[(Route, usize)],
            wire: Precision,
            device: &Device<Inner>,
        ) -> Result<Vec<Tensor<Inner, 1>>, CommError> {
            self.exchanges.fetch_add(1, Ordering::Relaxed);
            TensorCollectives::<Inner>::exchange(&self.comm, sends, recvs, wire, device)
        }
    }

    /// Every step's `(loss, grad_norm)` bits, the evaluation loss's bits
    /// and the final weights' bits by name.
    type Run = (Vec<(u64, u64)>, u64, Vec<(String, Vec<u32>)>);

    /// What a run moves onto the device collectives.
    #[derive(Clone, Copy, PartialEq)]
    enum Moved {
        Nothing,
        Pipeline,
        PartialGrads,
    }

    /// Trains [`STEPS`] steps of `model` under `layout` on `groups`, with
    /// `moved` on collectives that `open` creates; returns the run and
    /// every opened wrapper.
    fn train(
        model: &str,
        launch: &World,
        groups: &ProcessGroups,
        layout: &dyn Fn(&mut JobConfig),
        moved: Moved,
        open: &dyn Fn(&dyn Communicator) -> Arc<Counted>,
    ) -> (Run, Vec<Arc<Counted>>) {
        let job = job(model, launch, layout);
        let device = Default::default();
        let mut trainer = parallelize_fresh::<B>(groups.clone(), &job, &device).unwrap();
        let opened = std::sync::Mutex::new(Vec::new());
        let shared = |group: &dyn Communicator| -> Result<SharedCollectives<Inner>, CommError> {
            let c = open(group);
            opened.lock().unwrap().push(c.clone());
            Ok(c)
        };
        match moved {
            Moved::Nothing => {}
            Moved::Pipeline => assert!(trainer.pipeline_on_device(&shared).unwrap()),
            Moved::PartialGrads => {
                let tp = TpGroup::new(groups.tp().clone());
                trainer.partial_grads_on(tp.with_device::<Inner>(shared(&**groups.tp()).unwrap()));
            }
        }
        let batches = global_batch();
        let steps = (0..STEPS)
            .map(|_| {
                let out = trainer.step(&batches).unwrap();
                (out.loss.to_bits(), out.grad_norm.to_bits())
            })
            .collect();
        let eval = trainer.evaluate(&batches[..1]).unwrap().to_bits();
        let weights = weight_bits(&trainer);
        ((steps, eval, weights), opened.into_inner().unwrap())
    }

    /// A layout of the module doc, named.
    type Case = (&'static str, Moved, Precision, fn(&mut JobConfig));

    fn cases() -> [Case; 5] {
        [
            ("pp2", Moved::Pipeline, Precision::Fp32, |c| {
                c.parallelism.pp = 2
            }),
            ("pp2", Moved::Pipeline, Precision::Bf16, |c| {
                c.parallelism.pp = 2
            }),
            ("pp2-interleaved", Moved::Pipeline, Precision::Fp32, |c| {
                c.parallelism.pp = 2;
                c.parallelism.pp_schedule = PpSchedule::Interleaved;
                c.parallelism.pp_virtual = 2;
            }),
            ("tp2-sp", Moved::PartialGrads, Precision::Fp32, |c| {
                c.parallelism.tp = 2;
                c.parallelism.sp = true;
            }),
            ("tp2-sp", Moved::PartialGrads, Precision::Bf16, |c| {
                c.parallelism.tp = 2;
                c.parallelism.sp = true;
            }),
        ]
    }

    /// The runs of the module doc on the 2 ranks of `world`; a line per
    /// difference found on this rank.
    pub fn failures(world: &Arc<dyn Communicator>, launch: &World) -> Vec<String> {
        let lib = Arc::new(NcclLibrary::load().expect("FERROTRON_NCCL_LIBRARY names the double"));
        let open = |group: &dyn Communicator| {
            Arc::new(Counted {
                comm: DeviceComm::init(lib.clone(), group, Box::new(HostStreams)).unwrap(),
                sums: AtomicUsize::new(0),
                exchanges: AtomicUsize::new(0),
            })
        };
        let rank = world.rank();
        let mut failures = Vec::new();
        for model in ["gpt-mini", "llama-mini"] {
            for (name, moved, precision, set) in cases() {
                let layout = |c: &mut JobConfig| {
                    set(c);
                    c.precision.compute = Some(precision);
                };
                let mesh = *job(model, launch, layout).mesh();
                let groups = ProcessGroups::new(world.clone(), mesh).unwrap();
                let label = format!("{model} {name} {precision} rank {rank}");
                let (want, _) = train(model, launch, &groups, &layout, Moved::Nothing, &open);
                let (got, opened) = train(model, launch, &groups, &layout, moved, &open);
                if got.0 != want.0 || got.1 != want.1 {
                    failures.push(format!(
                        "{label}: (loss, grad norm) bits {:?} and evaluation {} on device, \
                         {:?} and {} on the host path",
                        got.0, got.1, want.0, want.1
                    ));
                }
                if got.2 != want.2 {
                    failures.push(format!("{label}: the final weights differ"));
                }
                let count = |f: fn(&Counted) -> usize| opened.iter().map(|c| f(c)).sum::<usize>();
                let exchanges = count(|c| c.exchanges.load(Ordering::Relaxed));
                let sums = count(|c| c.sums.load(Ordering::Relaxed));
                let (want_exchanges, want_sums) = match moved {
                    Moved::Pipeline => (true, model == "gpt-mini"),
                    _ => (false, true),
                };
                if (exchanges > 0, sums > 0) != (want_exchanges, want_sums) {
                    failures.push(format!(
                        "{label}: {exchanges} exchanges and {sums} sums on the device \
                         collectives, expected some: {want_exchanges} and {want_sums}"
                    ));
                }
                if rank == 0 {
                    println!("{label}: {exchanges} exchanges, {sums} sums on device");
                }
            }
        }
        failures
    }
}
