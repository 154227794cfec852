//! Host-side pieces of the attention tests: the
//! naive reference attention with its analytic backward.

pub mod reference;
