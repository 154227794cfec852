//! A job on a CubeCL backend (wgpu; lavapipe in CI) updates its
//! parameters with the one-kernel AdamW (`KernelBackend::fused_adamw`,
//! installed by `parallelize`), under DDP and under ZeRO (whose shard
//! updates go through the same `AdamW::update_flat`): after one step of
//! llama-mini, the trainer counts one fused update per parameter. That
//! the kernel's values equal Burn's tensor operations is
//! crates/models/tests/models/fused_adamw.rs; that training on wgpu follows
//! the CPU run is crates/cli/tests/cli/wgpu_training.rs.

#[cfg(not(feature = "wgpu"))]
use ferrotron_test_support::skip::skip;

#[test]
fn a_job_on_wgpu_updates_every_parameter_with_the_adamw_kernel() {
    #[cfg(feature = "wgpu")]
    on_wgpu::one_step_per_layout();
    #[cfg(not(feature = "wgpu"))]
    skip("ferrotron-job was built without the `wgpu` feature (scripts/test --mpi builds it)");
}

#[cfg(feature = "wgpu")]
mod on_wgpu {
    use burn::backend::Autodiff;
    use ferrotron_job::{parallelize, World};
    use ferrotron_models::Decoder;
    use ferrotron_parallel::groups::ProcessGroups;
    use ferrotron_parallel::zero::ZeroStage;

    use crate::gradients::{global_batch, job};

    type Gpu = Autodiff<ferrotron_models::ops::Wgpu>;

    /// One step under DDP and under ZeRO-2 on one rank: as many fused
    /// updates as the model has parameters.
    pub fn one_step_per_layout() {
        let device = ferrotron_kernels::wgpu_setup::default_device();
        for zero in [ZeroStage::Off, ZeroStage::Two] {
            let job = job("llama-mini", &World::SINGLE, |c| c.parallelism.zero = zero);
            let seed = job.config().schedule.seed;
            let model = Decoder::<Gpu>::new(job.model(), seed, &device).unwrap();
            let mut trainer = parallelize(model, ProcessGroups::single(), &job, &device).unwrap();
            assert_eq!(trainer.fused_adamw_updates(), 0);
            let out = trainer.step(&global_batch()).unwrap();
            assert!(!out.skipped, "zero {zero:?}: the step was not applied");
            let params = trainer.whole_parameters().unwrap().len() as u64;
            assert_eq!(
                trainer.fused_adamw_updates(),
                params,
                "zero {zero:?}: fused AdamW updates after one step of {params} parameters"
            );
        }
    }
}
