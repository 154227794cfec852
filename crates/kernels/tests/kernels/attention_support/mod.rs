//! Host-side pieces of the attention tests: the naive reference attention
//! with its analytic backward, and the check of a case's kernels against
//! it.

pub mod check;
pub mod reference;
