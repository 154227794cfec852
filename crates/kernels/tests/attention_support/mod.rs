//! Host-side pieces of the attention tests: a seeded generator and the
//! naive reference attention with its analytic backward.

pub mod reference;
pub mod rng;
