//! [`AnyCollectives`]: device collectives held by something that is not
//! generic over the backend (a TP group inside every layer, the pipeline),
//! and taken back for the backend whose tensors it is handed.

use std::any::Any;
use std::sync::Arc;

use burn::tensor::backend::Backend;

use super::SharedCollectives;

/// A [`SharedCollectives`] of some backend, or none (the host path).
#[derive(Clone, Default)]
pub struct AnyCollectives(Option<Arc<dyn Any + Send + Sync>>);

impl AnyCollectives {
    /// No device collectives: the owner's communicator's host path.
    pub fn none() -> Self {
        Self(None)
    }

    /// `collectives`, for the tensors of backend `B`.
    pub fn new<B: Backend>(collectives: SharedCollectives<B>) -> Self {
        Self(Some(Arc::new(collectives)))
    }

    /// Whether there are any.
    pub fn is_some(&self) -> bool {
        self.0.is_some()
    }

    /// The collectives, if there are any, for the tensors of `B`.
    ///
    /// # Panics
    /// If they were given for another backend than `B`, naming `owner`
    /// (a caller bug: the owner would otherwise fall back to the host
    /// path unseen).
    pub fn get<B: Backend>(&self, owner: &dyn std::fmt::Debug) -> Option<&SharedCollectives<B>> {
        let any = self.0.as_ref()?;
        Some(
            any.downcast_ref::<SharedCollectives<B>>()
                .unwrap_or_else(|| {
                    panic!(
                        "{owner:?}: device collectives opened for another backend than {}",
                        std::any::type_name::<B>()
                    )
                }),
        )
    }
}
