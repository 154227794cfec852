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
//! Taken-back buffers of at most [`MAX_SPARE_BYTES`] are kept in
//! [`Spares`] for the next operations: a fresh multi-MiB buffer per call
//! cost more (page faults) than the all-reduce itself. Larger ones are
//! freed: kept, the largest message of a run (a whole embedding's
//! gradient bucket, its TP block gathered for `model.safetensors`) stayed
//! resident twice over on every communicator that carried it, about 300
//! MiB per rank at GPT-2 small's size, which made a sharded rank hold
//! 0.64-0.69 of the one-rank run's memory while saving a checkpoint
//! instead of its share. A call that large pays its buffers' page faults,
//! a small part of moving that many bytes.

use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::Mutex;

/// Most buffers kept for reuse: the send and receive buffer of one call.
const MAX_SPARES: usize = 2;

/// Largest buffer kept for reuse, bytes: 32 MiB, above a default DDP
/// bucket (25 MiB), so that a run with the default buckets reuses its
/// all-reduce buffers and a communicator keeps at most 64 MiB between calls.
const MAX_SPARE_BYTES: usize = 32 << 20;

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
/// two of at most [`MAX_SPARE_BYTES`] each.
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
    /// enough are kept or it is larger than [`MAX_SPARE_BYTES`].
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
        if spares.len() < MAX_SPARES && buf.capacity() * size_of::<f32>() <= MAX_SPARE_BYTES {
            spares.push(buf);
        }
    }

    /// Bytes of the kept buffers (their capacity).
    #[cfg(test)]
    fn kept_bytes(&self) -> usize {
        self.kept()
            .iter()
            .map(|b| b.capacity() * size_of::<f32>())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lends a send copy of `n` values and a receive buffer of `n`, as a
    /// collective does, copies the one into the other (a one-rank
    /// all-reduce) and takes both back: returns what was received.
    fn one_call(spares: &Spares, n: usize) -> Vec<f32> {
        let values: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let send = spares.lend_copy(&values);
        let mut recv = spares.lend_scratch(n);
        let mut out = vec![0.0; n];
        // SAFETY: no MPI request uses these buffers; one view of each.
        unsafe {
            recv.view_mut().copy_from_slice(send.view());
            spares.reclaim(recv, Some(&mut out));
            spares.reclaim(send, None);
        }
        out
    }

    #[test]
    fn buffers_up_to_the_cap_are_kept_and_larger_ones_freed() {
        let f32_bytes = size_of::<f32>();
        let kept = Spares::default();
        let small = MAX_SPARE_BYTES / f32_bytes / 4;
        assert_eq!(one_call(&kept, small)[small - 1], (small - 1) as f32);
        assert!(kept.kept_bytes() >= 2 * small * f32_bytes);
        // Reused buffers give what the call received.
        assert_eq!(one_call(&kept, 3), [0.0, 1.0, 2.0]);

        let freed = Spares::default();
        let large = MAX_SPARE_BYTES / f32_bytes + 1;
        assert_eq!(one_call(&freed, large)[large - 1], (large - 1) as f32);
        assert_eq!(freed.kept_bytes(), 0);
    }
}
