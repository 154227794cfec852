//! One CubeCL runtime as a benchmark target: the fused kernels launched on
//! its buffers, and the reference ops on Burn's CubeCL backend over the same
//! device (`Autodiff<CubeBackend<R, f32, i32, BT>>`, no burn-fusion).

use std::marker::PhantomData;

use anyhow::{anyhow, Result};
use burn::backend::Autodiff;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime};
use cubecl::prelude::*;

use super::cases::{AttentionPath, Case, MmaTiles};
use super::fused;
use super::kernels::Sample;
use super::reference::{self, Meter};
use super::target::Target;

/// Runtime `R` on `device`; `BT` is the bool element of Burn's backend on
/// it (`u32` on wgpu, `u8` on CUDA and HIP, as Burn's own aliases).
pub struct CubeTarget<R: CubeRuntime, BT: BoolElement> {
    name: &'static str,
    device: R::Device,
    client: ComputeClient<R>,
    bool_element: PhantomData<BT>,
}

impl<R: CubeRuntime, BT: BoolElement> CubeTarget<R, BT> {
    /// Opens `device`; an error when the runtime finds no device there (no
    /// driver, no adapter).
    pub fn open(name: &'static str, device: R::Device) -> Result<Self> {
        let client = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| R::client(&device)))
            .map_err(|_| anyhow!("the {name} runtime found no device (see the panic above)"))?;
        Ok(Self {
            name,
            device,
            client,
            bool_element: PhantomData,
        })
    }
}

impl<R: CubeRuntime, BT: BoolElement> Target for CubeTarget<R, BT> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn has_fused(&self) -> bool {
        true
    }

    fn fused_skip(&self, case: &Case) -> Option<String> {
        let Case::Attention {
            head_dim, forward, ..
        } = *case
        else {
            return None;
        };
        let why = match forward {
            AttentionPath::MmaBf16(MmaTiles::Forward(..) | MmaTiles::Backward(..)) => {
                " (no mma instruction, or these tiles do not fit its shared memory)"
            }
            _ => "",
        };
        fused::attention_kernels(&self.client, head_dim, forward)
            .is_none()
            .then(|| format!("{}: not on this device{why}", case.kernel()))
    }

    fn fused(&self, case: &Case) -> Result<Sample> {
        fused::run(&self.client, case)
    }

    fn reference(&self, case: &Case) -> Result<Sample> {
        let mut meter = DeviceMeter {
            client: &self.client,
            base: 0,
            high: 0,
        };
        reference::run::<Autodiff<CubeBackend<R, f32, i32, BT>>>(case, &self.device, &mut meter)
    }

    /// Skipped when one of its tensors is larger than the largest buffer
    /// the device allocates (`max_page_size`: 128 MiB on lavapipe's adapter).
    fn reference_skip(&self, case: &Case) -> Option<String> {
        let largest = case.largest_reference_tensor_bytes();
        let limit = self.client.properties().memory.max_page_size;
        (largest > limit).then(|| {
            format!(
                "reference skipped on {}: one tensor of {:.0} MiB, the device's largest buffer \
                 is {:.0} MiB",
                self.name,
                largest as f64 / MIB,
                limit as f64 / MIB
            )
        })
    }
}

const MIB: f64 = (1u64 << 20) as f64;

/// Device `bytes_in_use` (cubecl's memory pools) at the sample points,
/// highest minus the value at the start. A lower bound of the true peak:
/// buffers alive only inside the forward or the backward are not seen.
struct DeviceMeter<'a, R: Runtime> {
    client: &'a ComputeClient<R>,
    base: u64,
    high: u64,
}

impl<R: Runtime> Meter for DeviceMeter<'_, R> {
    fn start(&mut self) -> Result<()> {
        self.base = fused::in_use(self.client)?;
        self.high = self.base;
        Ok(())
    }

    fn sample(&mut self) -> Result<()> {
        self.high = self.high.max(fused::in_use(self.client)?);
        Ok(())
    }

    fn peak(&self) -> u64 {
        self.high.saturating_sub(self.base)
    }
}
