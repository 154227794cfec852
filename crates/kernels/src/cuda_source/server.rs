//! The recording runtime: a CubeCL [`ComputeServer`] that compiles every
//! launch to CUDA C++ and keeps the source instead of running it.

use std::sync::{Arc, Mutex};

use cubecl::backtrace::BackTrace;
use cubecl::bytes::Bytes;
use cubecl::client::ComputeClient;
use cubecl::device::{Device, DeviceId, DeviceService, ServerUtilitiesHandle};
use cubecl::future::DynFut;
use cubecl::ir::TargetProperties;
use cubecl::prelude::*;
use cubecl::profile::ProfileDuration;
use cubecl::server::{
    Binding, ComputeServer, CopyDescriptor, IoError, KernelArguments, ProfileError, ProfilingToken,
    ServerCommunication, ServerError, ServerUtilities,
};
use cubecl::stream_id::StreamId;
use cubecl::zspace::{Shape, Strides};
use cubecl::{CubeTask, MemoryAllocationMode, MemoryUsage};
use cubecl_cpp::cuda::mma::contiguous_elements_cuda;
use cubecl_cpp::cuda::mma::CudaWmmaCompiler;
use cubecl_cpp::cuda::CudaDialect;
use cubecl_cpp::shared::{CompilationOptions, CppCompiler};
use cubecl_runtime::allocator::PitchedMemoryLayoutPolicy;
use cubecl_runtime::logging::ServerLogger;
use cubecl_runtime::memory_management::ManagedMemoryHandle;
use cubecl_runtime::storage::{BytesStorage, ComputeStorage, ManagedResource};

use super::CudaArch;

/// CubeCL's CUDA compiler, as `cubecl-cuda` 0.10 builds it by default
/// (`wmma` fragments through `mma.h`).
type CudaCompiler = CppCompiler<CudaDialect<CudaWmmaCompiler>>;

/// Device type id of [`CudaSourceDevice`] (distinct from the real
/// runtimes' devices).
const DEVICE_TYPE: u16 = 0xC5;

/// One compiled kernel.
#[derive(Debug, Clone)]
pub struct KernelSource {
    /// The entry point's name in the source (CubeCL's kernel name with its
    /// element types), which `cubecl-cuda` passes to the driver.
    pub entry: String,
    /// The CUDA C++ source NVRTC would receive.
    pub source: String,
    /// Units per cube `(x, y, z)`.
    pub cube_dim: (u32, u32, u32),
    /// Bytes of static shared memory CubeCL counts for the kernel.
    pub shared_bytes: usize,
}

/// The sources a [`CudaSourceServer`] has compiled, in launch order, each
/// distinct source once; the runtime's `Info`, read through
/// [`super::recorded`].
#[derive(Debug, Default)]
pub struct Recorded {
    sources: Mutex<Vec<KernelSource>>,
}

impl Recorded {
    /// Takes the sources recorded since the last call.
    pub fn take(&self) -> Vec<KernelSource> {
        std::mem::take(
            &mut *self
                .sources
                .lock()
                .expect("no recorder panics holding the lock"),
        )
    }

    fn push(&self, source: KernelSource) {
        let mut sources = self
            .sources
            .lock()
            .expect("no recorder panics holding the lock");
        if !sources.iter().any(|known| known.source == source.source) {
            sources.push(source);
        }
    }
}

/// The device of [`CudaSourceRuntime`]: an architecture, no hardware.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CudaSourceDevice {
    /// The architecture the sources are compiled for.
    pub arch: CudaArch,
}

impl Default for CudaSourceDevice {
    fn default() -> Self {
        CudaSourceDevice {
            arch: CudaArch::Sm90,
        }
    }
}

impl Device for CudaSourceDevice {
    fn from_id(device_id: DeviceId) -> Self {
        let arch = CudaArch::from_version(device_id.index_id as u32)
            .unwrap_or_else(|| panic!("{device_id} is not a CUDA source device"));
        CudaSourceDevice { arch }
    }

    fn to_id(&self) -> DeviceId {
        DeviceId::new(DEVICE_TYPE, self.arch.version() as u16)
    }
}

/// The recording server of one architecture.
#[derive(Debug)]
pub struct CudaSourceServer {
    options: CompilationOptions,
    utilities: Arc<ServerUtilities<Self>>,
}

impl CudaSourceServer {
    fn new(arch: CudaArch) -> Self {
        let properties = arch.properties();
        let policy = PitchedMemoryLayoutPolicy::new(properties.memory.alignment as usize);
        let utilities = ServerUtilities::new(
            properties,
            Arc::new(ServerLogger::default()),
            Recorded::default(),
            policy,
        );
        CudaSourceServer {
            options: arch.compilation_options(),
            utilities: Arc::new(utilities),
        }
    }

    fn unsupported<T>(&self) -> Result<T, ServerError> {
        Err(IoError::UnsupportedIoOperation {
            backtrace: BackTrace::capture(),
        }
        .into())
    }
}

impl DeviceService for CudaSourceServer {
    fn init(device_id: DeviceId) -> Self {
        CudaSourceServer::new(CudaSourceDevice::from_id(device_id).arch)
    }

    fn utilities(&self) -> ServerUtilitiesHandle {
        self.utilities.clone() as ServerUtilitiesHandle
    }
}

impl ServerCommunication for CudaSourceServer {
    const SERVER_COMM_ENABLED: bool = false;
}

impl ComputeServer for CudaSourceServer {
    type Kernel = Box<dyn CubeTask<CudaCompiler>>;
    type Info = Recorded;
    type MemoryLayoutPolicy = PitchedMemoryLayoutPolicy;
    /// Never allocated: only names the resource type of [`Self::get_resource`].
    type Storage = BytesStorage;

    /// Buffers are never stored: a launch only needs their bindings.
    fn initialize_memory(&mut self, _memory: ManagedMemoryHandle, _size: u64, _stream: StreamId) {}

    fn logger(&self) -> Arc<ServerLogger> {
        self.utilities.logger.clone()
    }

    fn utilities(&self) -> Arc<ServerUtilities<Self>> {
        self.utilities.clone()
    }

    fn read(
        &mut self,
        _descriptors: Vec<CopyDescriptor>,
        _stream_id: StreamId,
    ) -> DynFut<Result<Vec<Bytes>, ServerError>> {
        let result = self.unsupported();
        Box::pin(async move { result })
    }

    /// Written values are dropped: no kernel runs to read them.
    fn write(&mut self, _descriptors: Vec<(CopyDescriptor, Bytes)>, _stream_id: StreamId) {}

    fn sync(&mut self, _stream_id: StreamId) -> DynFut<Result<(), ServerError>> {
        Box::pin(async { Ok(()) })
    }

    fn get_resource(
        &mut self,
        _binding: Binding,
        _stream_id: StreamId,
    ) -> Result<ManagedResource<<Self::Storage as ComputeStorage>::Resource>, ServerError> {
        self.unsupported()
    }

    /// Compiles `kernel` as `cubecl-cuda` would before handing it to NVRTC
    /// and records the source. A kernel CubeCL cannot compile for the
    /// architecture panics with CubeCL's error, as a launch on the device
    /// would fail.
    unsafe fn launch(
        &mut self,
        kernel: Self::Kernel,
        _count: CubeCount,
        _bindings: KernelArguments,
        mode: ExecutionMode,
        _stream_id: StreamId,
    ) {
        let compiled = kernel
            .compile(
                &mut CudaCompiler::default(),
                &self.options,
                mode,
                kernel.address_type(),
            )
            .unwrap_or_else(|error| panic!("CubeCL cannot compile {}: {error}", kernel.name()));
        let cube_dim = compiled.cube_dim;
        let shared_bytes = compiled
            .repr
            .as_ref()
            .map_or(0, |repr| repr.shared_memory_size());
        self.utilities.info.push(KernelSource {
            entry: compiled.entrypoint_name,
            source: compiled.source,
            cube_dim: (cube_dim.x, cube_dim.y, cube_dim.z),
            shared_bytes,
        });
    }

    fn flush(&mut self, _stream_id: StreamId) -> Result<(), ServerError> {
        Ok(())
    }

    fn memory_usage(&mut self, _stream_id: StreamId) -> Result<MemoryUsage, ServerError> {
        self.unsupported()
    }

    fn memory_cleanup(&mut self, _stream_id: StreamId) {}

    fn start_profile(&mut self, _stream_id: StreamId) -> Result<ProfilingToken, ServerError> {
        self.unsupported()
    }

    fn end_profile(
        &mut self,
        _stream_id: StreamId,
        _token: ProfilingToken,
    ) -> Result<ProfileDuration, ProfileError> {
        Err(ProfileError::NotRegistered {
            backtrace: BackTrace::capture(),
        })
    }

    fn allocation_mode(&mut self, _mode: MemoryAllocationMode, _stream_id: StreamId) {}
}

/// CubeCL runtime over [`CudaSourceServer`].
#[derive(Debug, Clone)]
pub struct CudaSourceRuntime;

impl Runtime for CudaSourceRuntime {
    type Compiler = CudaCompiler;
    type Server = CudaSourceServer;
    type Device = CudaSourceDevice;

    fn client(device: &Self::Device) -> ComputeClient<Self> {
        ComputeClient::load(device)
    }

    fn name(_client: &ComputeClient<Self>) -> &'static str {
        "cuda-source"
    }

    fn max_cube_count() -> (u32, u32, u32) {
        (i32::MAX as u32, u16::MAX as u32, u16::MAX as u32)
    }

    fn can_read_tensor(_shape: &Shape, _strides: &Strides) -> bool {
        false
    }

    /// `cubecl-cuda`'s: the register layouts of PTX's `mma` operands.
    fn target_properties() -> TargetProperties {
        use cubecl::ir::{ContiguousElements, MatrixLayout, MmaProperties};
        TargetProperties {
            mma: MmaProperties {
                register_size_bits: 32,
                const_plane_size: 32,
                register_layout_a: MatrixLayout::RowMajor,
                register_layout_b: MatrixLayout::ColMajor,
                register_layout_acc: MatrixLayout::RowMajor,
                register_duplication_a: 1,
                register_duplication_b: 1,
                register_duplication_acc: 1,
                contiguous_elements: ContiguousElements::new(contiguous_elements_cuda),
            },
        }
    }

    /// Every architecture, whatever the type asked for.
    fn enumerate_devices(_type_id: u16, _info: &Recorded) -> Vec<DeviceId> {
        [CudaArch::Sm80, CudaArch::Sm90]
            .iter()
            .map(|arch| CudaSourceDevice { arch: *arch }.to_id())
            .collect()
    }
}
