//! The job layer's tests, in one binary (each test binary links all of Burn).

mod comm;
mod config;
mod device_sync_parallel;
mod fused_adamw;
mod gradients;
mod gradients_parallel;
mod gradients_precision;
mod memory;
mod offload_parallel;
mod pipeline_device_parallel;
mod validate;
