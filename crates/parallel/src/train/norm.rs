//! The global L2 norm of gradients spread over a group of ranks.

use crate::comm::{CommError, Communicator};

/// The L2 norm of gradients of which this rank holds a part whose squares
/// sum to `local_squares`, the other parts being held by the other ranks
/// of `group` (ZeRO-2/3: each rank's chunks; replicated gradients pass a
/// one-rank group). The sum is all-reduced in `f32`, as the gradients are.
pub fn global_norm(local_squares: f64, group: &dyn Communicator) -> Result<f64, CommError> {
    if group.world_size() == 1 {
        return Ok(local_squares.sqrt());
    }
    let mut buf = [local_squares as f32];
    group.all_reduce_sum(&mut buf)?;
    Ok(f64::from(buf[0]).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::SingleProcess;

    #[test]
    fn one_rank_norm_is_the_square_root_in_f64() {
        let n = global_norm(2.0, &SingleProcess).unwrap();
        assert_eq!(n, 2f64.sqrt());
    }
}
