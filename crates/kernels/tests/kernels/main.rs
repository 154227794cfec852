//! The kernels' integration tests on the wgpu runtime (lavapipe in CI),
//! one test binary (each binary links CubeCL and wgpu, so the files are
//! modules of one). `wgpu_setup` stays apart: cubecl reads its
//! configuration once per process.

mod attention_support;
mod common;

mod adamw;
mod attention;
mod attention_backward;
mod bias;
mod cross_entropy;
mod embedding;
mod gelu;
mod norm;
mod rope;
mod swiglu;
