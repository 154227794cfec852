//! AdamW's one-kernel update on Burn's CubeCL backend (wgpu runtime;
//! lavapipe in CI): `AdamW::update_flat` with the backend's fused update
//! installed (`KernelBackend::fused_adamw`) against the same optimizer
//! without it, whose update is Burn's tensor operations on the same
//! device: the parameters and both moments bit for bit, over several
//! steps, with and without weight decay.

use burn::module::ParamId;
use burn::tensor::{Tensor, TensorData};
use burn_wgpu::{CubeBackend, WgpuRuntime};
use ferrotron_engine::optim::{AdamW, AdamWConfig};
use ferrotron_kernels::wgpu_setup::default_device;
use ferrotron_models::ops::KernelBackend;

type Gpu = CubeBackend<WgpuRuntime, f32, i32, u32>;

/// The bits of a tensor's values.
fn bits(t: &Tensor<Gpu, 1>) -> Vec<u32> {
    let values: Vec<f32> = t.clone().into_data().to_vec().unwrap();
    values.iter().map(|x| x.to_bits()).collect()
}

/// Lengths with vector widths 1 and 4 (70,001 values: several cubes, a
/// partial last one), three steps each, with and without decay. The
/// parameter's first value is shared with another tensor, which must keep
/// its values (the kernel writes in place only into buffers nothing else
/// holds). Every update takes the fused path, and the backends without a
/// kernel (flex) offer none.
#[test]
fn fused_adamw_equals_the_tensor_operations_bit_for_bit() {
    let device = default_device();
    let fused = <Gpu as KernelBackend>::fused_adamw().expect("the CubeCL backend's AdamW kernel");
    assert!(<burn::backend::Flex as KernelBackend>::fused_adamw().is_none());
    let c = AdamWConfig {
        beta1: 0.85,
        beta2: 0.97,
        eps: 1e-6,
        weight_decay: 0.3,
    };
    for n in [70_001usize, 1024] {
        let values = |seed: usize| -> Tensor<Gpu, 1> {
            let v: Vec<f32> = (0..n)
                .map(|i| ((i * 37 + seed * 11) % 101) as f32 / 50.0 - 1.0)
                .map(|x| x * (1.0 + seed as f32))
                .collect();
            Tensor::from_data(TensorData::new(v, [n]), &device)
        };
        for decay in [true, false] {
            let (mut kernel, mut tensors) = (AdamW::<Gpu>::new(c), AdamW::<Gpu>::new(c));
            kernel.use_fused(Some(fused));
            let id = ParamId::new();
            let (mut p_kernel, mut p_tensors) = (values(0), values(0));
            let first = p_kernel.clone();
            for step in 1..=3 {
                let g = values(step);
                kernel.begin_step();
                tensors.begin_step();
                p_kernel = kernel.update_flat(id, 0.01, p_kernel, g.clone(), decay);
                p_tensors = tensors.update_flat(id, 0.01, p_tensors, g, decay);
                let (m_kernel, v_kernel) = kernel.moments(id).unwrap();
                let (m_tensors, v_tensors) = tensors.moments(id).unwrap();
                for (what, got, want) in [
                    ("p", &p_kernel, &p_tensors),
                    ("m", &m_kernel, &m_tensors),
                    ("v", &v_kernel, &v_tensors),
                ] {
                    let (got, want) = (bits(got), bits(want));
                    let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                    assert_eq!(
                        differ, 0,
                        "n {n}, decay {decay}, step {step}: {differ} values of {what} differ"
                    );
                }
            }
            assert_eq!(bits(&first), bits(&values(0)), "a tensor sharing p changed");
            assert_eq!(kernel.fused_updates(), 3);
            assert_eq!(tensors.fused_updates(), 0);
        }
    }
}
