//! Ferrotron parallel execution: everything that spans ranks.
//!
//! How a process learns its rank ([`launch`]), the device mesh ([`mesh`])
//! and the process groups split along it ([`groups`]), the communicators
//! ([`comm`]), context parallelism's sequence split and ring attention
//! ([`context`]), the one flat layout of parameters and gradients ([`flat`]),
//! the gradient-sync contract and the global gradient norm
//! ([`grad_sync`]), a micro-batch's forward and backward under that
//! contract ([`micro_batch`]), data parallelism ([`ddp`]) and ZeRO
//! ([`zero`]) as gradient-sync strategies, tensor parallelism ([`tensor`]),
//! pipeline parallelism and its schedules ([`pipeline`]), activation
//! recomputation ([`recompute`]), the training step and loop
//! ([`train`]), and the planner that picks a layout before a job runs
//! ([`plan`]). A single-device
//! run is the parallel code with every degree set to 1 (DESIGN.md).
//!
//! Imports run one way: the contracts ([`grad_sync`], [`micro_batch`],
//! [`flat`]) import no strategy; the strategies ([`ddp`]; [`zero`], whose
//! stage 1 reuses DDP's replicated gradients) and the pipeline import the
//! contracts; [`train`] imports them all, and nothing imports [`train`].

pub mod comm;
pub mod context;
pub mod ddp;
pub mod flat;
pub mod grad_sync;
pub mod groups;
pub mod launch;
pub mod mesh;
pub mod micro_batch;
pub mod per_backend;
pub mod pipeline;
pub mod plan;
pub mod recompute;
pub mod tensor;
pub mod train;
pub mod zero;
