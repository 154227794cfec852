//! Optimizer offload (`--offload optimizer`) on 2 ranks: ZeRO-1, 2 and 3
//! over a DP group of two, 3 steps of llama-mini with gradient
//! accumulation (2 micro-batches per rank), weight decay and clipping at
//! a norm the steps exceed, trained with the optimizer offloaded must
//! equal the same 2-rank run with the optimizer on the device and
//! nothing overlapped: every step's loss and gradient norm and every
//! final weight, bit for bit. The offloaded run goes once with
//! `overlap_grad_reduce` (reductions during backward, the host update of
//! a unit while the previous unit's updated chunks are all-gathered) and
//! once without. Both must run the same collectives on the communication
//! thread (`grad_comm.ops`: the reductions and the parameter all-gathers),
//! several in flight at once with overlap and one at a time without
//! (`grad_comm.max_in_flight`), so the overlapped schedule is the one
//! compared.
//!
//! The reference is the device update, which on flex runs the host
//! AdamW's f32 operations per element ([`ferrotron_engine::optim::AdamW`]):
//! bit-identity is the expected result, not a tolerance. Library-level
//! (`Trainer::parallel`): the job refuses offload on flex, whose device
//! memory is host memory. Runs inside the 2-rank launch of
//! `gradients_parallel`, so it adds no `mpirun` launch.

#[cfg(feature = "mpi")]
pub mod worker {
    use std::sync::Arc;

    use burn::backend::{Autodiff, Flex};
    use ferrotron_engine::optim::{AdamWConfig, LrSchedule};
    use ferrotron_engine::precision::Precision;
    use ferrotron_job::World;
    use ferrotron_models::Decoder;
    use ferrotron_parallel::comm::nccl::device::{DeviceComm, HostStreams};
    use ferrotron_parallel::comm::nccl::NcclLibrary;
    use ferrotron_parallel::comm::Communicator;
    use ferrotron_parallel::groups::ProcessGroups;
    use ferrotron_parallel::train::{ParallelConfig, StepConfig, Trainer};
    use ferrotron_parallel::zero::ZeroStage;

    use crate::gradients::{global_batch, job};

    type B = Autodiff<Flex>;

    /// Steps of each run.
    const STEPS: usize = 3;
    /// The clipping threshold: below step 1's gradient norm, so clipping
    /// scales the gradients the update sees.
    const CLIP: f64 = 0.05;

    /// Every step's `(loss, grad_norm)` as bits, the final weights as
    /// bits by name, and the collectives run on the communication thread
    /// in all steps with the most of them in flight at once.
    pub type Run = (Vec<(u64, u64)>, Vec<(String, Vec<u32>)>, (u64, u64));

    /// How one run of [`train`] reduces and updates.
    pub struct Setup {
        pub stage: ZeroStage,
        pub offload: bool,
        pub overlap: bool,
        /// `--reduce-dtype`.
        pub reduce: Precision,
        /// NCCL's gradient all-reduces on the gradients' own tensors
        /// ([`Trainer::sync_on_device`]), this library's (the test
        /// double, on host memory); `None`: the DP group's host path.
        pub nccl: Option<Arc<NcclLibrary>>,
    }

    impl Setup {
        /// `stage`, offloaded or not, overlapped or not, reduced in f32 on
        /// the host path.
        pub fn new(stage: ZeroStage, offload: bool, overlap: bool) -> Self {
            Self {
                stage,
                offload,
                overlap,
                reduce: Precision::Fp32,
                nccl: None,
            }
        }
    }

    /// Trains [`STEPS`] steps of the job's llama-mini on `groups` (DP 2)
    /// as `setup` says; each rank takes its half of [`global_batch`].
    pub fn train(launch: &World, groups: &ProcessGroups, setup: &Setup) -> Run {
        let Setup {
            stage,
            offload,
            overlap,
            reduce,
            ..
        } = *setup;
        let job = job("llama-mini", launch, |_| {});
        let device = Default::default();
        let model = Decoder::<B>::new(job.model(), job.config().schedule.seed, &device).unwrap();
        let step = StepConfig {
            adamw: AdamWConfig::default(),
            schedule: LrSchedule {
                max_lr: 3e-3,
                min_lr: 3e-4,
                warmup_steps: 1,
                total_steps: STEPS,
            },
            grad_clip: CLIP,
        };
        let parallel = ParallelConfig {
            zero: stage,
            // Small units: stages 1 and 2 cut the model into many.
            bucket_mb: 0.1,
            overlap_grad_reduce: overlap,
            offload_optimizer: offload,
            reduce,
            ..ParallelConfig::default()
        };
        let mut trainer = Trainer::parallel(model, step, device, groups.clone(), parallel).unwrap();
        if let Some(lib) = &setup.nccl {
            let on_device = trainer
                .sync_on_device(|group| {
                    let comm = DeviceComm::init(lib.clone(), group, Box::new(HostStreams))?;
                    Ok(Arc::new(comm))
                })
                .unwrap();
            assert!(
                on_device,
                "zero {stage}: the reductions stay on the host path"
            );
            assert!(trainer.syncs_on_device());
        }
        let batches = global_batch();
        let share = batches.len() / 2;
        let rank = groups.coord().dp;
        let mine = &batches[rank * share..(rank + 1) * share];
        let (mut ops, mut in_flight) = (0, 0);
        let outs: Vec<(u64, u64)> = (0..STEPS)
            .map(|_| {
                let out = trainer.step(mine).unwrap();
                assert!(!out.skipped, "zero {stage}: a step was skipped: {out:?}");
                let comm = out.grad_comm.expect("2 DP ranks record grad_comm");
                ops += comm.ops;
                in_flight = in_flight.max(comm.max_in_flight);
                (out.loss.to_bits(), out.grad_norm.to_bits())
            })
            .collect();
        assert!(
            f64::from_bits(outs[0].1) > CLIP,
            "zero {stage}: step 1's norm does not reach the clipping threshold {CLIP}"
        );
        (outs, weight_bits(&trainer), (ops, in_flight))
    }

    /// The trainer's whole parameters' bits, by name.
    pub fn weight_bits(trainer: &Trainer<B, Decoder<B>>) -> Vec<(String, Vec<u32>)> {
        trainer
            .whole_parameters()
            .unwrap()
            .into_iter()
            .map(|(name, data)| {
                let bits = data.to_vec::<f32>().unwrap().into_iter().map(f32::to_bits);
                (name, bits.collect())
            })
            .collect()
    }

    /// The runs of the module doc on the 2 ranks of `world`; a line per
    /// difference found on this rank.
    pub fn failures(world: &Arc<dyn Communicator>, launch: &World) -> Vec<String> {
        let mesh = *job("llama-mini", launch, |_| {}).mesh();
        assert_eq!(mesh.dp, 2, "offload runs on a DP group of two");
        let groups = ProcessGroups::new(world.clone(), mesh).unwrap();
        let rank = world.rank();
        let mut failures = Vec::new();
        for stage in [ZeroStage::One, ZeroStage::Two, ZeroStage::Three] {
            let before = failures.len();
            let (want_steps, want_weights, _) =
                train(launch, &groups, &Setup::new(stage, false, false));
            let mut comm = Vec::new();
            for overlap in [true, false] {
                let (steps, weights, n) = train(launch, &groups, &Setup::new(stage, true, overlap));
                comm.push(n);
                let label = format!("zero {stage} offloaded, overlap {overlap}, rank {rank}");
                if steps != want_steps {
                    failures.push(format!(
                        "{label}: (loss, grad norm) bits {steps:?}, without offload {want_steps:?}"
                    ));
                }
                if weights != want_weights {
                    failures.push(format!("{label}: the final weights differ"));
                }
            }
            let ((ops_on, most_on), (ops_off, most_off)) = (comm[0], comm[1]);
            if ops_on != ops_off || most_on < 2 || most_off != 1 {
                failures.push(format!(
                    "zero {stage} offloaded, rank {rank}: {ops_on} collectives on the communication \
                     thread with overlap, at most {most_on} in flight; {ops_off} without, at most \
                     {most_off}: the same collectives must run, overlapped only with overlap"
                ));
            }
            if rank == 0 && failures.len() == before {
                println!("zero {stage}: offloaded, with and without overlap, bit-identical");
            }
        }
        failures
    }
}
