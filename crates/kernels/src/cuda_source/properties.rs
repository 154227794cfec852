//! The device properties and compilation options of the NVIDIA
//! architectures the sources are written for, as `cubecl-cuda` 0.10 sets
//! them from the driver (`runtime.rs`), for the parts a kernel's choice or
//! code depends on: the 32-unit planes, the shared memory a cube may opt
//! into, the types, and the matrix instructions (`wmma` fragments, the
//! manual `mma` and `ldmatrix`).

use cubecl::features::Plane;
use cubecl::ir::{
    DeviceProperties, ElemType, FloatKind, HardwareProperties, MemoryDeviceProperties, VectorSize,
};
use cubecl::profile::TimingMethod;
use cubecl_cpp::cuda::arch::CudaArchitecture;
use cubecl_cpp::cuda::mma::CudaWmmaCompiler;
use cubecl_cpp::shared::{
    register_mma_features, register_wmma_features, CompilationOptions, CppSupportedFeatures,
};
use cubecl_cpp::{register_supported_types, DialectWmmaCompiler};

/// An NVIDIA architecture the sources are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CudaArch {
    /// Ampere, `sm_80` (A100): 163 KiB of shared memory per cube, 108 SMs.
    Sm80,
    /// Hopper, `sm_90` (H100, H200): 227 KiB of shared memory per cube,
    /// 132 SMs. NVRTC compiles it as `sm_90a`, as `cubecl-cuda` does.
    Sm90,
}

impl CudaArch {
    /// Compute capability times ten (80, 90).
    pub fn version(self) -> u32 {
        match self {
            CudaArch::Sm80 => 80,
            CudaArch::Sm90 => 90,
        }
    }

    /// The architecture of a compute capability times ten.
    pub fn from_version(version: u32) -> Option<Self> {
        match version {
            80 => Some(CudaArch::Sm80),
            90 => Some(CudaArch::Sm90),
            _ => None,
        }
    }

    /// NVRTC's `--gpu-architecture` value, as `cubecl-cuda` passes it.
    pub fn nvrtc_arch(self) -> &'static str {
        match self {
            CudaArch::Sm80 => "sm_80",
            CudaArch::Sm90 => "sm_90a",
        }
    }

    /// Bytes of shared memory one cube may opt into
    /// (`CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`).
    fn max_shared_bytes(self) -> usize {
        match self {
            CudaArch::Sm80 => 166_912,
            CudaArch::Sm90 => 232_448,
        }
    }

    fn multiprocessors(self) -> u32 {
        match self {
            CudaArch::Sm80 => 108,
            CudaArch::Sm90 => 132,
        }
    }

    /// The device properties `cubecl-cuda` reports for this architecture
    /// (the memory ones: an 80 GB device, 256-byte alignment).
    pub(super) fn properties(self) -> DeviceProperties {
        let cuda = CudaArchitecture {
            version: self.version(),
        };
        let hardware = HardwareProperties {
            load_width: 128,
            plane_size_min: 32,
            plane_size_max: 32,
            max_bindings: 1024,
            max_shared_memory_size: self.max_shared_bytes(),
            max_cube_count: (i32::MAX as u32, u16::MAX as u32, u16::MAX as u32),
            max_units_per_cube: 1024,
            max_cube_dim: (1024, 1024, 64),
            num_streaming_multiprocessors: Some(self.multiprocessors()),
            num_tensor_cores: Some(4),
            min_tensor_cores_dim: Some(8),
            num_cpu_cores: None,
            max_vector_size: VectorSize::MAX,
        };
        let memory = MemoryDeviceProperties {
            max_page_size: 80_000_000_000 / 4,
            alignment: 256,
        };
        let mut properties =
            DeviceProperties::new(Default::default(), memory, hardware, TimingMethod::System);
        register_supported_types(&mut properties);
        properties.features.plane.insert(Plane::Ops);
        properties.features.plane.insert(Plane::Sync);
        properties
            .features
            .plane
            .insert(Plane::NonUniformControlFlow);
        properties.features.copy_async = true;
        properties.features.memory_reinterpret = true;
        properties.features.alignment = true;
        register_wmma_features(
            CudaWmmaCompiler::supported_wmma_combinations(&cuda),
            &mut properties,
        );
        register_mma_features(
            CudaWmmaCompiler::supported_mma_combinations(&cuda),
            &mut properties,
        );
        // `ldmatrix` of 16-bit values, as `cubecl-cuda` lists it from sm_75.
        for kind in [FloatKind::F16, FloatKind::BF16] {
            let ty = ElemType::Float(kind).into();
            properties.features.matmul.ldmatrix.insert(ty);
        }
        properties
    }

    /// The compilation options `cubecl-cuda` uses on this architecture.
    pub(super) fn compilation_options(self) -> CompilationOptions {
        CompilationOptions {
            warp_size: 32,
            supports_features: CppSupportedFeatures {
                fast_math: true,
                grid_constants: true,
                clusters: self == CudaArch::Sm90,
                elect_sync: self == CudaArch::Sm90,
                fast_tanh: true,
            },
        }
    }
}
