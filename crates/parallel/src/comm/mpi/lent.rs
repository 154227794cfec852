//! Heap buffers lent to a nonblocking MPI operation that may never finish.
//!
//! A nonblocking MPI call keeps reading or writing its buffers until its
//! request completes. When an operation times out it has not completed,
//! and may complete much later (a late rank arrives) or never; MPI cannot
//! cancel a collective. So the buffers an operation works on are not the
//! caller's slices (the caller may free them after the error) but heap
//! copies owned by a [`Lent`]: once the request has completed the copy is
//! taken back ([`Lent::take`]); when the operation is abandoned the `Lent`
//! is simply dropped, which leaks the copy on purpose, so MPI never touches
//! freed memory. The job is aborted after a timeout, so the leak is bounded
//! by one operation's buffers.

use std::ptr::NonNull;

/// An `f32` heap buffer that MPI may use for as long as the process lives.
///
/// Dropping a `Lent` leaks its buffer (see the module doc); only
/// [`Lent::take`] frees it.
pub(super) struct Lent(NonNull<[f32]>);

impl Lent {
    /// Lends a copy of `values`.
    pub(super) fn copy_of(values: &[f32]) -> Self {
        Self(NonNull::from(Box::leak(values.to_vec().into_boxed_slice())))
    }

    /// Lends `len` zeros (a receive buffer).
    pub(super) fn zeros(len: usize) -> Self {
        Self(NonNull::from(Box::leak(vec![0.0; len].into_boxed_slice())))
    }

    /// The buffer, for a send argument of an MPI call.
    ///
    /// # Safety
    /// No mutable view of this buffer may be in use at the same time, and
    /// the view must not be used after [`Lent::take`].
    pub(super) unsafe fn view(&self) -> &'static [f32] {
        // SAFETY: the pointer comes from `Box::leak` and stays valid until
        // `take`; the caller rules out a simultaneous mutable view.
        unsafe { self.0.as_ref() }
    }

    /// The buffer, for a receive argument of an MPI call.
    ///
    /// # Safety
    /// No other view of this buffer may be in use at the same time, and the
    /// view must not be used after [`Lent::take`].
    pub(super) unsafe fn view_mut(&mut self) -> &'static mut [f32] {
        // SAFETY: as in `view`; the caller rules out any other view.
        unsafe { self.0.as_mut() }
    }

    /// Takes the buffer back and frees it when the returned box is dropped.
    ///
    /// # Safety
    /// The MPI request that used a view of this buffer must have completed
    /// (`test` returned `Ok`), so that neither MPI nor any view still uses it.
    pub(super) unsafe fn take(self) -> Box<[f32]> {
        // SAFETY: the pointer came from `Box::leak` and, by the caller's
        // guarantee, nothing else refers to the buffer any more.
        unsafe { Box::from_raw(self.0.as_ptr()) }
    }
}
