//! NCCL's gradient reductions and ZeRO's parameter all-gathers on the
//! tensors themselves (`Trainer::sync_on_device`, what `--comm nccl` sets
//! up) on 2 ranks: DDP and ZeRO 1-3 over a DP group of two (all-reduces
//! for DDP and ZeRO-1, reduce-scatters for ZeRO-2 and 3; the gathers of
//! the updated chunks for ZeRO-1 and 2, ZeRO-3's unit gathers in forward,
//! recomputation and the step's end, prefetched under overlap), 3 steps
//! of llama-mini with gradient accumulation, weight decay and clipping,
//! each with and without overlap and with `--reduce-dtype` f32 and bf16,
//! must equal the
//! same run on the DP group's host path (MPI, not overlapped) bit for
//! bit: every step's loss and gradient norm and every final weight. The
//! device path runs `comm::nccl::device` with the NCCL test double on
//! host memory (the path a GPU takes, minus the device pointers).
//!
//! Why bit-identity holds: in f32 both paths sum the same two values.
//! In bf16 the host path sums two bf16 values in f32, halves and rounds
//! to bf16; the device path sends bf16, so the double rounds the sum to
//! bf16 and the trainer then halves it: halving is exact, so both give
//! the sum rounded once. (On more ranks NCCL's ring rounds after each
//! hop, and bf16 results may differ from the host path's.) Runs inside
//! the 2-rank launch of `gradients_parallel`, so it adds no `mpirun`
//! launch.

#[cfg(feature = "mpi")]
pub mod worker {
    use std::sync::Arc;

    use ferrotron_engine::precision::Precision;
    use ferrotron_job::World;
    use ferrotron_parallel::comm::nccl::NcclLibrary;
    use ferrotron_parallel::comm::Communicator;
    use ferrotron_parallel::groups::ProcessGroups;
    use ferrotron_parallel::zero::ZeroStage;

    use crate::gradients::job;
    use crate::offload_parallel::worker::{train, Setup};

    /// The runs of the module doc on the 2 ranks of `world`; a line per
    /// difference found on this rank.
    pub fn failures(world: &Arc<dyn Communicator>, launch: &World) -> Vec<String> {
        let lib = Arc::new(NcclLibrary::load().expect("FERROTRON_NCCL_LIBRARY names the double"));
        let mesh = *job("llama-mini", launch, |_| {}).mesh();
        let groups = ProcessGroups::new(world.clone(), mesh).unwrap();
        let rank = world.rank();
        let mut failures = Vec::new();
        for stage in [
            ZeroStage::Off,
            ZeroStage::One,
            ZeroStage::Two,
            ZeroStage::Three,
        ] {
            for reduce in [Precision::Fp32, Precision::Bf16] {
                // The host path, which overlapped or not gives the same bits
                // (`data_parallel`, `offload_parallel`).
                let mut host = Setup::new(stage, false, false);
                host.reduce = reduce;
                let want = train(launch, &groups, &host);
                for overlap in [true, false] {
                    let device = Setup {
                        overlap,
                        reduce,
                        nccl: Some(lib.clone()),
                        ..Setup::new(stage, false, false)
                    };
                    let got = train(launch, &groups, &device);
                    let label = format!("zero {stage} {reduce} overlap {overlap} rank {rank}");
                    if got.0 != want.0 {
                        failures.push(format!(
                            "{label}: (loss, grad norm) bits {:?} on device, {:?} on the host path",
                            got.0, want.0
                        ));
                    }
                    if got.1 != want.1 {
                        failures.push(format!("{label}: the final weights differ"));
                    }
                }
            }
        }
        if rank == 0 && failures.is_empty() {
            println!("DDP and ZeRO 1-3 on device collectives: bit-identical to the host path");
        }
        failures
    }
}
