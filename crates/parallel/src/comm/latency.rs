//! A test double: a communicator that is slower than the one it wraps by
//! a fixed transfer rate, to make communication cost something on a
//! machine where ranks share memory (the overlap tests and benchmark).

use std::sync::Arc;
use std::time::Duration;

use super::{CommError, Communicator, Incoming, Outgoing};

/// Wraps a communicator and sleeps, before each operation that carries
/// values, the time those bytes take at `bytes_per_s` (an all-reduce its
/// buffer, an all-gather what it receives, a reduce-scatter what it sends,
/// an exchange all its messages), then runs the operation. Results are the
/// wrapped communicator's, unchanged. Groups split from it are slowed alike.
pub struct Latency {
    inner: Arc<dyn Communicator>,
    bytes_per_s: f64,
}

impl Latency {
    /// `inner`, slowed to `bytes_per_s` bytes per second (> 0).
    pub fn new(inner: Arc<dyn Communicator>, bytes_per_s: f64) -> Self {
        assert!(bytes_per_s > 0.0, "a transfer rate must be positive");
        Self { inner, bytes_per_s }
    }

    /// Sleeps for `values` f32 values at the rate.
    fn pause(&self, values: usize) {
        let bytes = (values * std::mem::size_of::<f32>()) as f64;
        std::thread::sleep(Duration::from_secs_f64(bytes / self.bytes_per_s));
    }
}

impl Communicator for Latency {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    fn split(&self, color: usize, key: usize) -> Result<Arc<dyn Communicator>, CommError> {
        let group = self.inner.split(color, key)?;
        Ok(Arc::new(Self::new(group, self.bytes_per_s)))
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CommError> {
        self.pause(buf.len());
        self.inner.all_reduce_sum(buf)
    }

    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        self.pause(recv.len());
        self.inner.all_gather(send, recv)
    }

    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        self.pause(send.len());
        self.inner.reduce_scatter_sum(send, recv)
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        self.pause(buf.len());
        self.inner.broadcast(buf, root)
    }

    fn send(&self, buf: &[f32], dest: usize, tag: i32) -> Result<(), CommError> {
        self.pause(buf.len());
        self.inner.send(buf, dest, tag)
    }

    fn recv(&self, buf: &mut [f32], src: usize, tag: i32) -> Result<(), CommError> {
        self.pause(buf.len());
        self.inner.recv(buf, src, tag)
    }

    fn exchange(
        &self,
        sends: &[Outgoing<'_>],
        recvs: &mut [Incoming<'_>],
    ) -> Result<(), CommError> {
        let sent: usize = sends.iter().map(|s| s.values.len()).sum();
        let received: usize = recvs.iter().map(|r| r.values.len()).sum();
        self.pause(sent + received);
        self.inner.exchange(sends, recvs)
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.inner.barrier()
    }

    fn abort(&self, code: i32) -> ! {
        self.inner.abort(code)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::comm::SingleProcess;

    #[test]
    fn operations_take_their_bytes_at_the_rate_and_keep_the_values() {
        // 10_000 values = 40 kB at 1 MB/s: 40 ms.
        let slow = Latency::new(Arc::new(SingleProcess), 1e6);
        let mut buf = vec![1.5; 10_000];
        let t = Instant::now();
        slow.all_reduce_sum(&mut buf).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(40));
        assert!(buf.iter().all(|&x| x == 1.5));
        let mut recv = vec![0.0; 3];
        slow.all_gather(&[1.0, 2.0, 3.0], &mut recv).unwrap();
        assert_eq!(recv, [1.0, 2.0, 3.0]);
    }
}
