//! Passing blocks to the next rank of the ring ([`RingTransport`]).
//!
//! On host buffers (any [`Communicator`]) [`RingTransport::pass_on`]
//! sends buffers to rank `r + 1` and receives the same shapes from rank
//! `r - 1` in one [`Communicator::exchange`] (no deadlock, as every rank
//! sends and receives at once), on a helper thread, while the calling
//! thread computes: the transfer of the next block overlaps the current
//! block's attention. The calling thread makes no communicator call
//! meanwhile, so an MPI communicator (`MPI_THREAD_SERIALIZED`, one call at
//! a time) sees one caller at a time. On device tensors
//! ([`super::DeviceRing`]) the transfer is one grouped send/receive of
//! the device collectives, before the step.

use super::block::HeadBuf;
use crate::comm::{CommError, Communicator, Incoming, Outgoing};

/// Message tags of the ring, one per kind of buffer, in a range no other
/// user of the context-parallel group takes.
pub(super) const TAG_BASE: i32 = 3200;

/// How a ring's ranks pass buffers `T` to the next rank.
pub trait RingTransport<T> {
    /// This rank and the number of ranks in the ring, `(rank, cp)`.
    fn place(&self) -> (usize, usize);

    /// Runs `compute` while `send` (each with its tag) goes to the next
    /// rank of the ring and buffers of the same shapes come from the
    /// previous one; returns the received buffers (in `send`'s order) and
    /// `compute`'s result. Nothing to send: `compute` alone, no
    /// communication.
    ///
    /// # Errors
    /// The transfer's.
    fn pass_on<R>(
        &self,
        send: &[(i32, &T)],
        compute: impl FnOnce() -> R,
    ) -> Result<(Vec<T>, R), CommError>;
}

impl<C: Communicator + ?Sized> RingTransport<HeadBuf> for C {
    fn place(&self) -> (usize, usize) {
        (self.rank(), self.world_size())
    }

    fn pass_on<R>(
        &self,
        send: &[(i32, &HeadBuf)],
        compute: impl FnOnce() -> R,
    ) -> Result<(Vec<HeadBuf>, R), CommError> {
        if send.is_empty() {
            return Ok((Vec::new(), compute()));
        }
        let (rank, cp) = (self.rank(), self.world_size());
        let (next, prev) = ((rank + 1) % cp, (rank + cp - 1) % cp);
        let mut received: Vec<HeadBuf> = send
            .iter()
            .map(|(_, b)| HeadBuf::filled(b.dims, 0.0))
            .collect();
        let result = std::thread::scope(|s| {
            let transfer = s.spawn(|| {
                let outgoing: Vec<Outgoing<'_>> = send
                    .iter()
                    .map(|&(tag, b)| Outgoing {
                        to: next,
                        tag,
                        values: &b.data,
                    })
                    .collect();
                let mut incoming: Vec<Incoming<'_>> = send
                    .iter()
                    .zip(received.iter_mut())
                    .map(|(&(tag, _), b)| Incoming {
                        from: prev,
                        tag,
                        values: &mut b.data,
                    })
                    .collect();
                self.exchange(&outgoing, &mut incoming)
            });
            let result = compute();
            let sent = transfer
                .join()
                .expect("the ring's transfer thread panicked");
            sent.map(|()| result)
        })?;
        Ok((received, result))
    }
}
