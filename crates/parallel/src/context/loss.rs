//! The loss over the whole sequences of a context-parallel ring.
//!
//! Each rank scores its own tokens; the sequences' mean is the sum over
//! the ring of each rank's mean times its share of the kept tokens,
//! `sum_r mean_r * kept_r / kept`. The sum is Megatron's `g` (an
//! all-reduce forward, the identity backward, [`reduce_from_tp`] over the
//! ring), so every rank holds the whole loss and back-propagates its own
//! tokens' part of it: the ring's gradients add up to the one-rank ones
//! (the gradient sync sums them, see `Trainer::parallel`).

use burn::tensor::Tensor;

use crate::tensor::{reduce_from_tp, TpGroup, TpOps};

/// The mean loss (nats per kept token, `[1]`) of the sequences split over
/// `ring`, from this rank's mean `local` (`[1]`, 0 when it keeps no token)
/// over its `kept` tokens (the goldfish loss's dropped targets not
/// counted). The identity on a ring of one rank. Collective over `ring`.
pub fn ring_mean<B: TpOps>(local: Tensor<B, 1>, kept: usize, ring: &TpGroup) -> Tensor<B, 1> {
    if ring.size() == 1 {
        return local;
    }
    let mut total = [kept as f32];
    ring.comm()
        .all_reduce_sum(&mut total)
        .unwrap_or_else(|e| panic!("the ring's token count over {ring:?} failed: {e}"));
    let share = kept as f64 / f64::from(total[0]).max(1.0);
    reduce_from_tp(local.mul_scalar(share), ring)
}
