//! The communicator of a one-rank job: every collective is the identity.

use std::sync::Arc;

use super::{check_blocks, check_rank, CommError, Communicator, Incoming, Outgoing};

/// World size 1, rank 0. Collectives copy or leave buffers as they are;
/// `send`/`recv` (and an `exchange` of any message) have no peer and
/// return an error.
#[derive(Clone, Copy, Debug, Default)]
pub struct SingleProcess;

impl Communicator for SingleProcess {
    fn rank(&self) -> usize {
        0
    }

    fn world_size(&self) -> usize {
        1
    }

    fn split(&self, _color: usize, _key: usize) -> Result<Arc<dyn Communicator>, CommError> {
        Ok(Arc::new(SingleProcess))
    }

    fn all_reduce_sum(&self, _buf: &mut [f32]) -> Result<(), CommError> {
        Ok(())
    }

    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        check_blocks("all_gather", send.len(), recv.len(), 1)?;
        recv.copy_from_slice(send);
        Ok(())
    }

    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        check_blocks("reduce_scatter_sum", recv.len(), send.len(), 1)?;
        recv.copy_from_slice(send);
        Ok(())
    }

    fn broadcast(&self, _buf: &mut [f32], root: usize) -> Result<(), CommError> {
        check_rank("broadcast", root, 1)
    }

    fn send(&self, _buf: &[f32], dest: usize, _tag: i32) -> Result<(), CommError> {
        check_rank("send", dest, 1)?;
        Err(CommError::Transport(
            "send: a one-rank job has no peer to send to".into(),
        ))
    }

    fn recv(&self, _buf: &mut [f32], src: usize, _tag: i32) -> Result<(), CommError> {
        check_rank("recv", src, 1)?;
        Err(CommError::Transport(
            "recv: a one-rank job has no peer to receive from".into(),
        ))
    }

    fn exchange(
        &self,
        sends: &[Outgoing<'_>],
        recvs: &mut [Incoming<'_>],
    ) -> Result<(), CommError> {
        if sends.is_empty() && recvs.is_empty() {
            return Ok(());
        }
        Err(CommError::Transport(
            "exchange: a one-rank job has no peer to exchange with".into(),
        ))
    }

    fn barrier(&self) -> Result<(), CommError> {
        Ok(())
    }

    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_process_collectives_are_the_identity() {
        let c = SingleProcess;
        assert_eq!((c.rank(), c.world_size()), (0, 1));
        let mut buf = vec![1.0, -2.0, 3.5];
        c.all_reduce_sum(&mut buf).unwrap();
        c.all_reduce_avg(&mut buf).unwrap();
        c.broadcast(&mut buf, 0).unwrap();
        assert_eq!(buf, [1.0, -2.0, 3.5]);
        let mut out = vec![0.0; 3];
        c.all_gather(&buf, &mut out).unwrap();
        assert_eq!(out, buf);
        let mut out = vec![0.0; 3];
        c.reduce_scatter_sum(&buf, &mut out).unwrap();
        assert_eq!(out, buf);
        c.barrier().unwrap();
        assert_eq!(c.split(3, 0).unwrap().world_size(), 1);
    }

    #[test]
    fn single_process_rejects_bad_lengths_ranks_and_peers() {
        let c = SingleProcess;
        let mut out = vec![0.0; 2];
        assert!(c.all_gather(&[1.0], &mut out).is_err());
        assert!(c.broadcast(&mut out, 1).is_err());
        assert!(c.send(&out, 0, 0).is_err());
        assert!(c.recv(&mut out, 0, 0).is_err());
    }
}
