//! Collective times under the alpha-beta model: a message of `n` bytes
//! over a link of bandwidth `beta^-1` and start-up `alpha` takes
//! `alpha + n beta`.
//!
//! - Ring all-reduce over `k` ranks: `2(k-1)/k x bytes / bw + 2(k-1) alpha`
//!   (reduce-scatter then all-gather, each `k-1` steps; Thakur et al. 2005).
//! - Tree all-reduce (NCCL's double binary tree, for latency-bound sizes):
//!   `2 log2(k) alpha + 2 bytes / bw`. The faster of the two is used, as
//!   NCCL chooses.
//! - All-gather and reduce-scatter (ring): `(k-1)/k x bytes / bw + (k-1) alpha`,
//!   `bytes` being the whole gathered buffer.
//! - Point-to-point: `alpha + bytes / bw`.

use super::link::Link;

/// Seconds to all-reduce `bytes` over `k` ranks on `link`.
pub fn all_reduce(bytes: f64, k: usize, link: &Link) -> f64 {
    if k <= 1 {
        return 0.0;
    }
    let n = k as f64;
    let ring = 2.0 * (n - 1.0) / n * bytes / link.bandwidth + 2.0 * (n - 1.0) * link.latency;
    let tree = 2.0 * n.log2().ceil() * link.latency + 2.0 * bytes / link.bandwidth;
    ring.min(tree)
}

/// Seconds to all-gather (or reduce-scatter) a `bytes` buffer over `k` ranks.
pub fn all_gather(bytes: f64, k: usize, link: &Link) -> f64 {
    if k <= 1 {
        return 0.0;
    }
    let n = k as f64;
    (n - 1.0) / n * bytes / link.bandwidth + (n - 1.0) * link.latency
}

/// Seconds to send `bytes` to one peer.
pub fn p2p(bytes: f64, link: &Link) -> f64 {
    link.latency + bytes / link.bandwidth
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Link = Link {
        name: "test",
        bandwidth: 1e9,
        latency: 1e-5,
    };

    #[test]
    fn large_messages_take_the_ring_small_ones_the_tree() {
        // 1 GB over 8 ranks: ring 2*7/8 s + 14 alpha.
        assert!((all_reduce(1e9, 8, &L) - (1.75 + 14e-5)).abs() < 1e-12);
        // 8 bytes over 64 ranks: tree 2*6 alpha + 16 ns beats ring's 126 alpha.
        assert!((all_reduce(8.0, 64, &L) - (12e-5 + 16e-9)).abs() < 1e-15);
        assert!((all_gather(1e9, 4, &L) - (0.75 + 3e-5)).abs() < 1e-12);
        assert_eq!(all_reduce(1e9, 1, &L), 0.0);
    }
}
