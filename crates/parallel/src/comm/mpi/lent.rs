//! Heap buffers lent to a nonblocking MPI operation that may never finish.
//!
//! A nonblocking MPI call keeps reading or writing its buffers until its
//! request completes. When an operation times out it has not completed,
//! and may complete much later (a late rank arrives) or never; MPI cannot
//! cancel a collective. So the buffers an operation works on are not the
//! caller's slices (the caller may free them after the error) but heap
//! buffers owned by a [`Lent`]: once the request has completed the buffer
//! is taken back ([`Spares::reclaim`]); when the operation is abandoned the
//! `Lent` is simply dropped, which leaks the buffer on purpose, so MPI never
//! touches freed memory. The job is aborted after a timeout, so the leak is
//! bounded by one operation's buffers.
//!
//! Taken-back buffers are kept in [`Spares`] for the next operations: a
//! fresh multi-MiB buffer per call cost more (page faults) than the
//! all-reduce itself.

use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::Mutex;

/// Most buffers kept for reuse: the send and receive buffer of one call.
const MAX_SPARES: usize = 2;

/// An `f32` heap buffer that MPI may use for as long as the process lives.
///
/// Dropping a `Lent` leaks its buffer (see the module doc); only
/// [`Spares::reclaim`] gives it back.
pub(super) struct Lent {
    ptr: NonNull<f32>,
    len: usize,
    capacity: usize,
}

impl Lent {
    /// Lends `buf`, with its contents.
    fn new(buf: Vec<f32>) -> Self {
        let mut buf = ManuallyDrop::new(buf);
        Self {
            ptr: NonNull::new(buf.as_mut_ptr()).expect("a Vec's pointer is never null"),
            len: buf.len(),
            capacity: buf.capacity(),
        }
    }

    /// The buffer, for a send argument of an MPI call.
    ///
    /// # Safety
    /// No mutable view of this buffer may be in use at the same time, and
    /// the view must not be used after [`Lent::take`].
    pub(super) unsafe fn view(&self) -> &'static [f32] {
        // SAFETY: `ptr`, `len` describe the initialized part of a leaked
        // Vec, valid until `take`; the caller rules out a mutable view.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The buffer, for a receive argument of an MPI call.
    ///
    /// # Safety
    /// No other view of this buffer may be in use at the same time, and the
    /// view must not be used after [`Lent::take`].
    pub(super) unsafe fn view_mut(&mut self) -> &'static mut [f32] {
        // SAFETY: as in `view`; the caller rules out any other view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Takes the buffer back.
    ///
    /// # Safety
    /// The MPI request that used a view of this buffer must have completed
    /// (`test` returned `Ok`), so that neither MPI nor any view still uses it.
    unsafe fn take(self) -> Vec<f32> {
        // SAFETY: the parts came from a Vec that was never freed and, by
        // the caller's guarantee, nothing else refers to it any more.
        unsafe { Vec::from_raw_parts(self.ptr.as_ptr(), self.len, self.capacity) }
    }
}

/// Buffers of completed operations, reused by the next ones; holds at most
/// two, so at most twice the largest buffer of a call stays allocated.
#[derive(Default)]
pub(super) struct Spares(Mutex<Vec<Vec<f32>>>);

impl Spares {
    /// The kept buffers (a poisoned lock still holds valid buffers).
    fn kept(&self) -> std::sync::MutexGuard<'_, Vec<Vec<f32>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lends a copy of `values`.
    pub(super) fn lend_copy(&self, values: &[f32]) -> Lent {
        let mut buf = self.kept().pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(values);
        Lent::new(buf)
    }

    /// Lends a receive buffer of `len` values: what a kept buffer held,
    /// zeros beyond it (MPI overwrites them all; not clearing saves a pass).
    pub(super) fn lend_scratch(&self, len: usize) -> Lent {
        let mut buf = self.kept().pop().unwrap_or_default();
        buf.truncate(len);
        buf.resize(len, 0.0);
        Lent::new(buf)
    }

    /// Takes back the buffer of a completed operation, copies it into
    /// `out` (if given; same length) and keeps it for reuse, or frees it if
    /// enough are kept.
    ///
    /// # Safety
    /// As [`Lent::take`]: the request that used `lent` has completed.
    pub(super) unsafe fn reclaim(&self, lent: Lent, out: Option<&mut [f32]>) {
        // SAFETY: guaranteed by the caller.
        let buf = unsafe { lent.take() };
        if let Some(out) = out {
            out.copy_from_slice(&buf);
        }
        let mut spares = self.kept();
        if spares.len() < MAX_SPARES {
            spares.push(buf);
        }
    }
}
