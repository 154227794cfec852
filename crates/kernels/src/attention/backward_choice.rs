//! Which backward kernels run: the one place that chooses between the row
//! kernels and the tiled kernels of the backward, by the rule the forward
//! uses ([`super::AttentionKernel::choose`]).

use cubecl::prelude::*;

use super::shape::{AttentionError, AttentionShape};
use super::tiled_backward_kv::{tiled_backward_shared_bytes, BACKWARD_TILES};

/// The dK/dV and dQ kernels of a backward launch. Both pairs compute the
/// same gradients from the same `lse` (either forward kernel's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionBackwardKernel {
    /// One key row (dK/dV) or query row (dQ) per unit, the other side read
    /// from global memory, no shared memory (`backward_kv.rs`,
    /// `backward_q.rs`): runs on any device.
    Row,
    /// FlashAttention-2 tiles (`tiled_backward_kv.rs`,
    /// `tiled_backward_q.rs`): a dK/dV cube owns `outer` key rows and walks
    /// the query rows `inner` at a time; a dQ cube owns `outer` query rows
    /// and walks the key rows `inner` at a time. `(outer, inner)` is one of
    /// [`BACKWARD_TILES`] and a cube needs
    /// [`AttentionBackwardKernel::shared_bytes`] of shared memory.
    Tiled {
        /// Rows a cube owns.
        outer: usize,
        /// Rows of the other side per step.
        inner: usize,
    },
}

impl AttentionBackwardKernel {
    /// The kernels [`super::attention_backward_typed`] runs for `head_dim`
    /// on `client`'s device: the tiled kernels with the first (largest) of
    /// [`BACKWARD_TILES`] whose shared memory fits the device's
    /// `max_shared_memory_size`, else the row kernels.
    pub fn choose<R: Runtime>(
        client: &ComputeClient<R>,
        head_dim: usize,
    ) -> AttentionBackwardKernel {
        Self::for_shared_memory(
            client.properties().hardware.max_shared_memory_size,
            head_dim,
        )
    }

    /// [`AttentionBackwardKernel::choose`] for a device with
    /// `max_shared_bytes` of shared memory per cube.
    pub fn for_shared_memory(max_shared_bytes: usize, head_dim: usize) -> AttentionBackwardKernel {
        BACKWARD_TILES
            .into_iter()
            .find(|&(outer, inner)| {
                tiled_backward_shared_bytes(outer, inner, head_dim) <= max_shared_bytes
            })
            .map_or(AttentionBackwardKernel::Row, |(outer, inner)| {
                AttentionBackwardKernel::Tiled { outer, inner }
            })
    }

    /// Shared memory of one cube, bytes, for `head_dim` (0 for the row
    /// kernels).
    pub fn shared_bytes(self, head_dim: usize) -> usize {
        match self {
            AttentionBackwardKernel::Row => 0,
            AttentionBackwardKernel::Tiled { outer, inner } => {
                tiled_backward_shared_bytes(outer, inner, head_dim)
            }
        }
    }

    /// Short name: `row` or `tiled{outer}x{inner}` (e.g. `tiled32x16`).
    pub fn name(self) -> String {
        match self {
            AttentionBackwardKernel::Row => "row".to_string(),
            AttentionBackwardKernel::Tiled { outer, inner } => format!("tiled{outer}x{inner}"),
        }
    }

    /// Fails when these kernels cannot run `shape` on a device with
    /// `max_shared_bytes` of shared memory per cube: tiles not in
    /// [`BACKWARD_TILES`], or more shared memory than the device has.
    pub(crate) fn check(
        self,
        shape: &AttentionShape,
        max_shared_bytes: usize,
    ) -> Result<(), AttentionError> {
        let AttentionBackwardKernel::Tiled { outer, inner } = self else {
            return Ok(());
        };
        if !BACKWARD_TILES.contains(&(outer, inner)) {
            return Err(AttentionError::UnsupportedBackwardTiles { outer, inner });
        }
        let needed = self.shared_bytes(shape.head_dim);
        if needed > max_shared_bytes {
            return Err(AttentionError::BackwardSharedMemory {
                outer,
                inner,
                needed,
                max: max_shared_bytes,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_tiles_that_fit_are_chosen() {
        // 32 x 32 at 128: 2 * 64 * 129 + 2 * 32 * 33 + 64 = 18,688 f32.
        assert_eq!(tiled_backward_shared_bytes(32, 32, 128), 74_752);
        // 16 x 8 at 128: 2 * 24 * 129 + 2 * 8 * 17 + 16 = 6,480 f32.
        assert_eq!(tiled_backward_shared_bytes(16, 8, 128), 25_920);
        let tiled = |outer, inner| AttentionBackwardKernel::Tiled { outer, inner };
        // An H100 (227 KiB per cube) takes the largest tiles.
        assert_eq!(
            AttentionBackwardKernel::for_shared_memory(227 * 1024, 128),
            tiled(32, 32)
        );
        // lavapipe (32 KiB): 32 x 32 at 32, 32 x 16 at 64, 16 x 8 at 128.
        let lavapipe = 32 * 1024;
        assert_eq!(
            AttentionBackwardKernel::for_shared_memory(lavapipe, 32),
            tiled(32, 32)
        );
        assert_eq!(
            AttentionBackwardKernel::for_shared_memory(lavapipe, 64),
            tiled(32, 16)
        );
        assert_eq!(
            AttentionBackwardKernel::for_shared_memory(lavapipe, 128),
            tiled(16, 8)
        );
        // 16 x 8 at 256 needs 50,496 bytes.
        assert_eq!(
            AttentionBackwardKernel::for_shared_memory(48 * 1024, 256),
            AttentionBackwardKernel::Row
        );
    }

    #[test]
    fn the_dkdv_kernel_needs_the_most_shared_memory() {
        // The dK/dV kernel's layout, which the shared-memory rule counts
        // for every pair of tiles.
        for (outer, inner) in BACKWARD_TILES {
            for head_dim in [1, 32, 64, 128, 256] {
                let kv = 2 * (outer + inner) * (head_dim + 1) + 2 * inner * (outer + 1) + 2 * inner;
                assert_eq!(
                    tiled_backward_shared_bytes(outer, inner, head_dim),
                    kv * 4,
                    "{outer} x {inner} at {head_dim}"
                );
            }
        }
    }

    #[test]
    fn tiles_that_do_not_fit_or_do_not_exist_are_refused() {
        let shape = AttentionShape {
            batch: 1,
            n_heads: 1,
            n_kv_heads: 1,
            seq: 8,
            head_dim: 128,
        };
        assert_eq!(AttentionBackwardKernel::Row.check(&shape, 0), Ok(()));
        let big = AttentionBackwardKernel::Tiled {
            outer: 32,
            inner: 32,
        };
        assert_eq!(
            big.check(&shape, 32 * 1024),
            Err(AttentionError::BackwardSharedMemory {
                outer: 32,
                inner: 32,
                needed: 74_752,
                max: 32 * 1024
            })
        );
        let odd = AttentionBackwardKernel::Tiled {
            outer: 8,
            inner: 16,
        };
        assert_eq!(
            odd.check(&shape, 1 << 20),
            Err(AttentionError::UnsupportedBackwardTiles {
                outer: 8,
                inner: 16
            })
        );
        assert_eq!(big.name(), "tiled32x32");
    }
}
