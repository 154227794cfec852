//! Which backward kernels run: the one place that chooses between the row
//! kernels and the tiled kernels of the backward, by the rule the forward
//! uses ([`super::AttentionKernel::choose`]), and that describes the
//! fragment and the register kernels, which run when named.

use cubecl::prelude::*;

use super::choice::{fragment_head_dim, largest_fitting, matrix_units_run, AttentionKernel};
use super::fragment::{fragment_backward_shared_bytes, FRAGMENT, FRAGMENT_TILES};
use super::mma::{MMA_ROWS, MMA_SCRATCH};
use super::mma_forward::TILE_PAD;
use super::shape::{AttentionError, AttentionOptions, AttentionShape, MatrixUnits};
use super::tiled_backward_kv::{tiled_backward_shared_bytes, BACKWARD_TILES};
use crate::dtype::FloatDtype;

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
    /// FlashAttention-2 tiles with every product in 16 x 16 x 16 fragments
    /// (`fragment_backward_kv.rs`, `fragment_backward_q.rs`): a cube of
    /// `planes` planes of 32 units owns `16 * planes` rows (key rows in the
    /// dK/dV kernel, query rows in the dQ kernel) and walks the other side
    /// `inner` rows at a time; `(planes, inner)` is one of
    /// [`FRAGMENT_TILES`], `head_dim` a multiple of 16 up to 128.
    /// The operands are the 16-bit type of a 16-bit storage type (the
    /// probabilities and their gradient rounded to it before their
    /// products, as FlashAttention-2 does), else f32. With `matrix_units`
    /// the products run on the matrix units (`cmma`; 16-bit types only,
    /// where [`Self::matrix_units_run`]); without, on plain units, on any
    /// device with the shared memory (how the tests check the kernels, and
    /// their 16-bit rounding in f16, on lavapipe). Not chosen by
    /// [`Self::choose`]: it runs when named.
    Fragment {
        /// Planes per cube (16 rows each).
        planes: usize,
        /// Rows of the other side per step, a multiple of 16.
        inner: usize,
        /// Products on the matrix units or on plain units.
        matrix_units: bool,
    },
    /// FlashAttention-2's backward as its CUDA kernel runs
    /// (`mma_backward_kv.rs`, `mma_backward_q.rs`), the register forward's
    /// scheme: a cube of `planes` planes of 32 units owns `16 * planes`
    /// rows (key rows in the dK/dV kernel, query rows in the dQ kernel),
    /// each plane keeps its rows' scores, probabilities, their gradient
    /// and its gradients in registers, and walks the other side `inner`
    /// rows at a time through shared memory. `(planes, inner)` is one of
    /// [`MMA_BACKWARD_TILES`], `head_dim` a multiple of 16 up to 128;
    /// operands as the fragment kernels'. With `matrix_units` the products
    /// are the 16 x 8 x 16 `mma` instruction (16-bit types only, where
    /// [`Self::mma_runs`]); without, its plain-unit form (how the tests
    /// check the kernels on lavapipe). Runs when named.
    Registers {
        /// Planes per cube (16 rows each).
        planes: usize,
        /// Rows of the other side per step, a multiple of 16.
        inner: usize,
        /// Products on the matrix units or on plain units.
        matrix_units: bool,
    },
}

/// Tiles `(planes, inner)` the register backward is compiled for, largest
/// first. `inner` stays at 32 or less: each unit holds its share of a
/// plane's two `16 x inner` products besides its two `16 x head_dim`
/// gradients (dK and dV), 176 registers at head dim 128.
pub const MMA_BACKWARD_TILES: [(usize, usize); 4] = [(4, 32), (4, 16), (2, 16), (1, 16)];

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

    /// The kernels [`super::attention_backward_typed`] runs for a call of
    /// `dtype` at `head_dim` with `options` on `client`'s device: those
    /// `options.matrix_units` asks for on the matrix units (the fragment
    /// kernels, [`Self::fragment_for`], where [`Self::matrix_units_run`];
    /// the register kernels, [`Self::registers_for`], where
    /// [`Self::mma_runs`]) where a tile fits, else [`Self::choose`]'s.
    pub fn for_call<R: Runtime>(
        client: &ComputeClient<R>,
        head_dim: usize,
        dtype: FloatDtype,
        options: AttentionOptions,
    ) -> AttentionBackwardKernel {
        let max_shared = client.properties().hardware.max_shared_memory_size;
        match options.matrix_units {
            MatrixUnits::Off => None,
            MatrixUnits::Fragments => matrix_units_run(client, dtype)
                .then(|| Self::fragment_for(max_shared, head_dim, true))
                .flatten(),
            MatrixUnits::Registers => Self::mma_runs(client, dtype)
                .then(|| Self::registers_for(max_shared, head_dim, true))
                .flatten(),
        }
        .unwrap_or_else(|| Self::choose(client, head_dim))
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

    /// The fragment kernels with the largest of
    /// [`FRAGMENT_TILES`] whose shared memory fits a device with
    /// `max_shared_bytes` per cube at `head_dim`, with the products on the
    /// matrix units or not; `None` where none fits or `head_dim` is not a
    /// multiple of 16 up to 128.
    pub fn fragment_for(
        max_shared_bytes: usize,
        head_dim: usize,
        matrix_units: bool,
    ) -> Option<AttentionBackwardKernel> {
        let make = |planes, inner| AttentionBackwardKernel::Fragment {
            planes,
            inner,
            matrix_units,
        };
        largest_fitting(
            &FRAGMENT_TILES,
            make,
            max_shared_bytes,
            head_dim,
            Self::shared_bytes,
        )
    }

    /// The register kernels with the largest of [`MMA_BACKWARD_TILES`]
    /// whose shared memory fits a device with `max_shared_bytes` per cube
    /// at `head_dim`, with the products on the matrix units or not; `None`
    /// where none fits or `head_dim` is not a multiple of 16 up to 128.
    pub fn registers_for(
        max_shared_bytes: usize,
        head_dim: usize,
        matrix_units: bool,
    ) -> Option<AttentionBackwardKernel> {
        let make = |planes, inner| AttentionBackwardKernel::Registers {
            planes,
            inner,
            matrix_units,
        };
        largest_fitting(
            &MMA_BACKWARD_TILES,
            make,
            max_shared_bytes,
            head_dim,
            Self::shared_bytes,
        )
    }

    /// Whether `client`'s device runs the register kernels' products on
    /// the `mma` instruction in `dtype` (the register forward's condition,
    /// [`AttentionKernel::mma_runs`]).
    pub fn mma_runs<R: Runtime>(client: &ComputeClient<R>, dtype: FloatDtype) -> bool {
        AttentionKernel::mma_runs(client, dtype)
    }

    /// Whether `client`'s device runs the fragment kernels' products on its
    /// matrix units in `dtype`: a 16-bit type with 16x16x16 `cmma` and f32
    /// accumulators on 32-unit planes (the fragment forward's condition).
    pub fn matrix_units_run<R: Runtime>(client: &ComputeClient<R>, dtype: FloatDtype) -> bool {
        matrix_units_run(client, dtype)
    }

    /// Shared memory of one cube, bytes, for `head_dim` (0 for the row
    /// kernels); for the fragment kernels on plain units, with f32
    /// operands whatever the type (an upper bound for 16-bit types).
    pub fn shared_bytes(self, head_dim: usize) -> usize {
        match self {
            AttentionBackwardKernel::Row => 0,
            AttentionBackwardKernel::Tiled { outer, inner } => {
                tiled_backward_shared_bytes(outer, inner, head_dim)
            }
            AttentionBackwardKernel::Fragment {
                planes,
                inner,
                matrix_units,
            } => {
                let operand_bytes = if matrix_units { 2 } else { 4 };
                fragment_backward_shared_bytes(planes, inner, head_dim, operand_bytes)
            }
            AttentionBackwardKernel::Registers {
                planes,
                inner,
                matrix_units,
            } => registers_backward_shared_bytes(planes, inner, head_dim, matrix_units),
        }
    }

    /// Short name: `row`, `tiled{outer}x{inner}` (e.g. `tiled32x16`),
    /// `fragment{outer}x{inner}` with `-cmma` on the matrix units and
    /// `-plain` on plain units (e.g. `fragment64x64-cmma`), or
    /// `registers{outer}x{inner}` with `-mma` or `-plain`.
    pub fn name(self) -> String {
        match self {
            AttentionBackwardKernel::Row => "row".to_string(),
            AttentionBackwardKernel::Tiled { outer, inner } => format!("tiled{outer}x{inner}"),
            AttentionBackwardKernel::Fragment {
                planes,
                inner,
                matrix_units,
            } => {
                let units = if matrix_units { "cmma" } else { "plain" };
                format!("fragment{}x{inner}-{units}", planes * FRAGMENT)
            }
            AttentionBackwardKernel::Registers {
                planes,
                inner,
                matrix_units,
            } => {
                let units = if matrix_units { "mma" } else { "plain" };
                format!("registers{}x{inner}-{units}", planes * MMA_ROWS)
            }
        }
    }

    /// Rows a cube owns (dK/dV: key rows; dQ: query rows); 0 for the row
    /// kernels, whose cubes are sized by the launcher.
    pub(crate) fn outer_rows(self) -> usize {
        match self {
            AttentionBackwardKernel::Row => 0,
            AttentionBackwardKernel::Tiled { outer, .. } => outer,
            AttentionBackwardKernel::Fragment { planes, .. } => planes * FRAGMENT,
            AttentionBackwardKernel::Registers { planes, .. } => planes * MMA_ROWS,
        }
    }

    /// Fails when these kernels cannot run `shape` on a device with
    /// `max_shared_bytes` of shared memory per cube: tiles not in
    /// [`BACKWARD_TILES`] (tiled) or [`FRAGMENT_TILES`] and a head
    /// dimension not a multiple of 16 up to 128 (fragment), or more shared
    /// memory than the device has. (Whether the matrix units run is
    /// checked by the launcher, which has the type.)
    pub(crate) fn check(
        self,
        shape: &AttentionShape,
        max_shared_bytes: usize,
    ) -> Result<(), AttentionError> {
        let (outer, inner) = match self {
            AttentionBackwardKernel::Row => return Ok(()),
            AttentionBackwardKernel::Tiled { outer, inner } => {
                if !BACKWARD_TILES.contains(&(outer, inner)) {
                    return Err(AttentionError::UnsupportedBackwardTiles { outer, inner });
                }
                (outer, inner)
            }
            AttentionBackwardKernel::Fragment { planes, inner, .. }
            | AttentionBackwardKernel::Registers { planes, inner, .. } => {
                let (outer, tiles) = match self {
                    AttentionBackwardKernel::Fragment { .. } => {
                        (planes * FRAGMENT, &FRAGMENT_TILES[..])
                    }
                    _ => (planes * MMA_ROWS, &MMA_BACKWARD_TILES[..]),
                };
                if !tiles.contains(&(planes, inner)) || !fragment_head_dim(shape.head_dim) {
                    return Err(AttentionError::UnsupportedFragment {
                        outer,
                        inner,
                        head_dim: shape.head_dim,
                    });
                }
                (outer, inner)
            }
        };
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

/// Shared memory of one cube of the register backward with `planes`
/// planes and `inner` rows of the other side per step at `head_dim`, in
/// bytes: the dK/dV kernel's, the larger (the dQ kernel holds only the two
/// `inner`-row tiles). Its key and value tiles of `16 * planes` rows and
/// its query and output-gradient tiles of `inner` rows, rows of `head_dim
/// +` [`TILE_PAD`] values (16-bit operands on the matrix units, f32
/// bounding the plain form), the tile's log-sum-exp and `delta`, and on
/// plain units [`MMA_SCRATCH`] f32 values per plane. Each array is padded
/// to 128 bytes, as allocated.
fn registers_backward_shared_bytes(
    planes: usize,
    inner: usize,
    head_dim: usize,
    matrix_units: bool,
) -> usize {
    let pad = |bytes: usize| bytes.next_multiple_of(128);
    let (operand_bytes, scratch) = if matrix_units {
        (2, 1)
    } else {
        (4, planes * MMA_SCRATCH)
    };
    let row_bytes = (head_dim + TILE_PAD) * operand_bytes;
    2 * pad(planes * MMA_ROWS * row_bytes)
        + 2 * pad(inner * row_bytes)
        + 2 * pad(inner * 4)
        + pad(scratch * 4)
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
    fn the_largest_register_tiles_that_fit_are_chosen() {
        // 4 planes x 32 at head_dim 128 in 16 bits: key and value tiles of
        // 64 rows of 136 values 2 * 17,408, query and output-gradient
        // tiles of 32 rows 2 * 8,704, lse and delta 2 * 128, the unused
        // one-value scratch 128.
        assert_eq!(registers_backward_shared_bytes(4, 32, 128, true), 52_608);
        let registers = |planes, inner, matrix_units| {
            Some(AttentionBackwardKernel::Registers {
                planes,
                inner,
                matrix_units,
            })
        };
        for max in [227 * 1024, 164 * 1024, 64 * 1024] {
            assert_eq!(
                AttentionBackwardKernel::registers_for(max, 128, true),
                registers(4, 32, true)
            );
        }
        // lavapipe (32 KiB), f32 operands: 64 x 16 at 32, 32 x 16 at 64,
        // none at 128.
        let lavapipe = 32 * 1024;
        assert_eq!(
            AttentionBackwardKernel::registers_for(lavapipe, 32, false),
            registers(4, 16, false)
        );
        assert_eq!(
            AttentionBackwardKernel::registers_for(lavapipe, 64, false),
            registers(2, 16, false)
        );
        assert_eq!(
            AttentionBackwardKernel::registers_for(lavapipe, 128, false),
            None
        );
        assert_eq!(registers(4, 32, true).unwrap().name(), "registers64x32-mma");
        let shape = AttentionShape {
            batch: 1,
            n_heads: 1,
            n_kv_heads: 1,
            seq: 8,
            head_dim: 64,
        };
        assert_eq!(
            registers(4, 64, true).unwrap().check(&shape, 1 << 20),
            Err(AttentionError::UnsupportedFragment {
                outer: 64,
                inner: 64,
                head_dim: 64
            })
        );
    }

    #[test]
    fn the_largest_fragment_tiles_that_fit_are_chosen() {
        // 4 planes x 64 at head_dim 128 in 16 bits, the dK/dV kernel:
        // operand tiles 2 * 16,384 + 2 * 16,384, f32 products 2 * 16,384,
        // p and ds 2 * 8,192, two blocks of 4 planes 2 * 4,096, lse and
        // delta 2 * 256.
        assert_eq!(fragment_backward_shared_bytes(4, 64, 128, 2), 123_392);
        let fragment = |planes, inner, matrix_units| {
            Some(AttentionBackwardKernel::Fragment {
                planes,
                inner,
                matrix_units,
            })
        };
        // An H100 (227 KiB per cube) and an A100 (164 KiB) take the largest.
        for max in [227 * 1024, 164 * 1024] {
            assert_eq!(
                AttentionBackwardKernel::fragment_for(max, 128, true),
                fragment(4, 64, true)
            );
        }
        // lavapipe (32 KiB), f32 operands: 32 x 16 at 32, 16 x 16 at 64,
        // none at 128.
        let lavapipe = 32 * 1024;
        assert_eq!(
            AttentionBackwardKernel::fragment_for(lavapipe, 32, false),
            fragment(2, 16, false)
        );
        assert_eq!(
            AttentionBackwardKernel::fragment_for(lavapipe, 64, false),
            fragment(1, 16, false)
        );
        assert_eq!(
            AttentionBackwardKernel::fragment_for(lavapipe, 128, false),
            None
        );
        // Whole 16-column blocks up to 128 only.
        for head_dim in [72, 256] {
            assert_eq!(
                AttentionBackwardKernel::fragment_for(1 << 20, head_dim, true),
                None
            );
        }
        assert_eq!(fragment(4, 64, true).unwrap().name(), "fragment64x64-cmma");
        assert_eq!(
            fragment(1, 16, false).unwrap().name(),
            "fragment16x16-plain"
        );
    }

    #[test]
    fn fragment_tiles_and_head_dims_it_does_not_run_are_refused() {
        let shape = |head_dim| AttentionShape {
            batch: 1,
            n_heads: 1,
            n_kv_heads: 1,
            seq: 8,
            head_dim,
        };
        let kernel = |planes, inner| AttentionBackwardKernel::Fragment {
            planes,
            inner,
            matrix_units: false,
        };
        assert_eq!(
            kernel(3, 16).check(&shape(64), 1 << 20),
            Err(AttentionError::UnsupportedFragment {
                outer: 48,
                inner: 16,
                head_dim: 64
            })
        );
        assert_eq!(
            kernel(1, 16).check(&shape(40), 1 << 20),
            Err(AttentionError::UnsupportedFragment {
                outer: 16,
                inner: 16,
                head_dim: 40
            })
        );
        assert_eq!(
            kernel(1, 16).check(&shape(128), 32 * 1024),
            Err(AttentionError::BackwardSharedMemory {
                outer: 16,
                inner: 16,
                needed: fragment_backward_shared_bytes(1, 16, 128, 4),
                max: 32 * 1024
            })
        );
        assert_eq!(kernel(1, 16).check(&shape(64), 32 * 1024), Ok(()));
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
