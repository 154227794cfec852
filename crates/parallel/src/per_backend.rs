//! [`PerBackend`]: one backend's value of a [`Family`] (device
//! collectives, a device block kernel), held by an owner that is not
//! generic over the backend (the TP group, the pipeline, the CP ring) and
//! taken back for the backend whose tensors the owner is handed.

use std::any::Any;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::Arc;

use burn::tensor::backend::Backend;

/// A kind of value that exists once per backend.
pub trait Family: 'static {
    /// The value for backend `B`.
    type Of<B: Backend>: Any + Send + Sync;
    /// What the value is, for the mismatch panic (`device collectives`).
    const WHAT: &'static str;
}

/// A value of family `F` for some backend, or none.
pub struct PerBackend<F: Family>(Option<Arc<dyn Any + Send + Sync>>, PhantomData<fn() -> F>);

impl<F: Family> Clone for PerBackend<F> {
    fn clone(&self) -> Self {
        Self(self.0.clone(), PhantomData)
    }
}

impl<F: Family> Default for PerBackend<F> {
    fn default() -> Self {
        Self::none()
    }
}

impl<F: Family> PerBackend<F> {
    /// None: the owner's host path.
    pub fn none() -> Self {
        Self(None, PhantomData)
    }

    /// `value`, for the tensors of backend `B`.
    pub fn new<B: Backend>(value: F::Of<B>) -> Self {
        Self(Some(Arc::new(value)), PhantomData)
    }

    /// Whether there is a value.
    pub fn is_some(&self) -> bool {
        self.0.is_some()
    }

    /// The value, if there is one, for the tensors of `B`.
    ///
    /// # Panics
    /// If it was given for another backend than `B`, naming `owner` (a
    /// caller bug: the owner would otherwise fall back to its host path
    /// unseen).
    pub fn get<B: Backend>(&self, owner: &dyn Debug) -> Option<&F::Of<B>> {
        let any = self.0.as_ref()?;
        Some(any.downcast_ref::<F::Of<B>>().unwrap_or_else(|| {
            panic!(
                "{owner:?}: {} for another backend than {}",
                F::WHAT,
                std::any::type_name::<B>()
            )
        }))
    }
}
