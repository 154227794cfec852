//! Training metrics: per-step records as JSON lines, the loss plot, FLOP/s and MFU, memory by class,
//! device memory, pipeline stage times, the heap's peak per step (a counting allocator), each rank's peak
//! memory while building the model and saving or loading a checkpoint, energy counters and the device table.

mod device;
mod device_memory;
pub mod energy;
mod grad_comm;
mod heap;
mod jsonl;
mod memory;
mod peak;
mod phase;
mod pipeline;
mod plot;

pub use device::{device_spec, DeviceSpec, DEVICES};
pub use device_memory::{DeviceMemory, DeviceMemoryProbe};
pub use energy::{EnergyMeter, EnergyProbe};
pub use grad_comm::GradCommTimes;
pub use heap::{heap_bytes, CountingAllocator, HeapWindow};
pub use jsonl::{MetricsWriter, OverrideRecord, StepRecord, ValRecord};
pub use memory::{available_memory_bytes, MemoryBytes};
pub use peak::measure_matmul_flops;
pub use phase::{MemoryPhase, PhaseMemory, PhaseWindow};
pub use pipeline::PipelineTimes;
pub use plot::write_loss_svg;
