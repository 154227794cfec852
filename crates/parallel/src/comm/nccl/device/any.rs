//! [`AnyCollectives`]: device collectives held by something that is not
//! generic over the backend (a TP group inside every layer, the pipeline),
//! and taken back for the backend whose tensors it is handed.

use super::SharedCollectives;
use crate::per_backend::{Family, PerBackend};

/// The [`Family`] of [`SharedCollectives`].
pub struct Collectives;

impl Family for Collectives {
    type Of<B: burn::tensor::backend::Backend> = SharedCollectives<B>;
    const WHAT: &'static str = "device collectives opened";
}

/// A [`SharedCollectives`] of some backend, or none (the host path).
pub type AnyCollectives = PerBackend<Collectives>;
