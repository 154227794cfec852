//! Which forward kernel runs: the one place that chooses between the row
//! kernel and the tiled kernel, and that describes the fragment kernel
//! (the tiled algorithm in 16 x 16 x 16 fragments, on the matrix units
//! where they run), which runs when asked for, and the register kernel
//! (FlashAttention-2's register scheme on the 16 x 8 x 16 `mma`
//! instruction), which runs when named.

use cubecl::ir::features::MmaConfig;
use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::*;

use super::fragment::{
    fragment_forward_shared_bytes, CMMA_MAX_HEAD_DIM, CMMA_PLANE_SIZE, FRAGMENT, FRAGMENT_TILES,
};
use super::mma::{MMA_COLS, MMA_DEPTH, MMA_PLANE_SIZE, MMA_ROWS, MMA_SCRATCH};
use super::mma_forward::TILE_PAD;
use super::shape::{AttentionError, AttentionOptions, AttentionShape, MatrixUnits};
use super::tiled_forward::{tiled_shared_bytes, TILE_SIZES};
use super::tiles::ROWS_PER_CUBE;
use crate::dtype::FloatDtype;

/// The attention forward kernel of a launch. All write the same output and
/// log-sum-exp, which every backward consumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKernel {
    /// One query row per unit, keys read from global memory, no shared
    /// memory (`forward.rs`): runs on any device.
    Row,
    /// FlashAttention-2 tiles (`tiled_forward.rs`): `tile` query rows per
    /// cube, key/value tiles of `tile` rows in shared memory; `tile` is one
    /// of [`TILE_SIZES`] and the cube needs
    /// [`AttentionKernel::shared_bytes`] of shared memory.
    Tiled {
        /// Query rows per cube and keys per tile.
        tile: usize,
    },
    /// FlashAttention-2 tiles with both products in 16 x 16 x 16 fragments
    /// (`fragment_forward.rs`): a cube of `planes` planes of 32 units owns
    /// `16 * planes` query rows and walks the keys `keys` at a time;
    /// `(planes, keys)` is one of [`FRAGMENT_TILES`], `head_dim` a multiple
    /// of 16 up to 128. The operands are the 16-bit type of a 16-bit
    /// storage type (the probabilities rounded to it before the second
    /// product, as FlashAttention-2 does), else f32. With `matrix_units`
    /// the products run on the matrix units (`cmma`, tensor cores on CUDA;
    /// 16-bit types only, where [`Self::matrix_units_run`]); without, on
    /// plain units on any device with the shared memory (how the tests
    /// check the kernel on lavapipe). Not chosen by [`Self::choose`]: it
    /// runs when asked for ([`Self::for_call`] with `matrix_units`, or by
    /// name).
    Fragment {
        /// Planes per cube (16 query rows each).
        planes: usize,
        /// Keys per step, a multiple of 16.
        keys: usize,
        /// Products on the matrix units or on plain units.
        matrix_units: bool,
    },
    /// FlashAttention-2 as its CUDA kernel runs (`mma_forward.rs`): a cube
    /// of `planes` planes of 32 units owns `16 * planes` query rows, each
    /// plane keeps its 16 rows' scores, probabilities and output in
    /// registers, and only the key and value tiles (`keys` rows each) pass
    /// through shared memory. `(planes, keys)` is one of [`MMA_TILES`],
    /// `head_dim` a multiple of 16 up to 128; operands as the fragment
    /// kernel's. With `matrix_units` the products are the device's
    /// 16 x 8 x 16 `mma` instruction (16-bit types only, where
    /// [`Self::mma_runs`]); without, its plain-unit form (how the tests
    /// check the kernel on lavapipe). Runs when named.
    Registers {
        /// Planes per cube (16 query rows each).
        planes: usize,
        /// Keys per step, a multiple of 16.
        keys: usize,
        /// Products on the matrix units or on plain units.
        matrix_units: bool,
    },
}

impl AttentionKernel {
    /// The kernel [`super::attention_forward_typed`] runs for `head_dim` on
    /// `client`'s device: the tiled kernel with the largest of
    /// [`TILE_SIZES`] whose shared memory fits the device's
    /// `max_shared_memory_size`, else the row kernel. Every shape and
    /// storage type takes the tiled kernel where it fits: it is the kernel
    /// of FlashAttention-2 for all sequence lengths, and both kernels give
    /// the same results within f32 rounding. The fragment kernel on the
    /// matrix units is never chosen here: its compute-sanitizer race check
    /// has not concluded, so it runs only when a caller asks for it
    /// ([`AttentionKernel::for_call`] with `matrix_units`, or by name).
    pub fn choose<R: Runtime>(client: &ComputeClient<R>, head_dim: usize) -> AttentionKernel {
        Self::for_shared_memory(
            client.properties().hardware.max_shared_memory_size,
            head_dim,
        )
    }

    /// The kernel [`super::attention_forward_typed`] runs for a call of
    /// `dtype` at `head_dim` with `options` on `client`'s device: the
    /// kernel `options.matrix_units` asks for on the matrix units (the
    /// fragment kernel, [`Self::on_matrix_units`]; the register kernel,
    /// [`Self::registers_for`] where [`Self::mma_runs`]) where it runs,
    /// else [`AttentionKernel::choose`]'s.
    pub fn for_call<R: Runtime>(
        client: &ComputeClient<R>,
        head_dim: usize,
        dtype: FloatDtype,
        options: AttentionOptions,
    ) -> AttentionKernel {
        let max_shared = client.properties().hardware.max_shared_memory_size;
        match options.matrix_units {
            MatrixUnits::Off => None,
            MatrixUnits::Fragments => Self::on_matrix_units(client, head_dim, dtype),
            MatrixUnits::Registers => Self::mma_runs(client, dtype)
                .then(|| Self::registers_for(max_shared, head_dim, true))
                .flatten(),
        }
        .unwrap_or_else(|| Self::choose(client, head_dim))
    }

    /// The fragment kernel on `client`'s matrix units for `head_dim` and
    /// `dtype`, at the largest of [`FRAGMENT_TILES`] whose shared memory
    /// fits the device; `None` where the matrix units do not run `dtype`
    /// ([`Self::matrix_units_run`]) or no tile fits.
    pub fn on_matrix_units<R: Runtime>(
        client: &ComputeClient<R>,
        head_dim: usize,
        dtype: FloatDtype,
    ) -> Option<AttentionKernel> {
        let max_shared = client.properties().hardware.max_shared_memory_size;
        matrix_units_run(client, dtype)
            .then(|| Self::fragment_for(max_shared, head_dim, true))
            .flatten()
    }

    /// Whether `client`'s device runs the fragment kernels' products on its
    /// matrix units in `dtype`: a 16-bit type with 16x16x16 `cmma` and f32
    /// accumulators on 32-unit planes.
    pub fn matrix_units_run<R: Runtime>(client: &ComputeClient<R>, dtype: FloatDtype) -> bool {
        matrix_units_run(client, dtype)
    }

    /// The fragment kernel with the largest of [`FRAGMENT_TILES`] whose
    /// shared memory fits a device with `max_shared_bytes` per cube at
    /// `head_dim`, with the products on the matrix units or not; `None`
    /// where none fits or `head_dim` is not a multiple of 16 up to 128.
    pub fn fragment_for(
        max_shared_bytes: usize,
        head_dim: usize,
        matrix_units: bool,
    ) -> Option<AttentionKernel> {
        let make = |planes, keys| AttentionKernel::Fragment {
            planes,
            keys,
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

    /// The register kernel with the largest of [`MMA_TILES`] whose shared
    /// memory fits a device with `max_shared_bytes` per cube at
    /// `head_dim`, with the products on the matrix units or not; `None`
    /// where none fits or `head_dim` is not a multiple of 16 up to 128.
    pub fn registers_for(
        max_shared_bytes: usize,
        head_dim: usize,
        matrix_units: bool,
    ) -> Option<AttentionKernel> {
        let make = |planes, keys| AttentionKernel::Registers {
            planes,
            keys,
            matrix_units,
        };
        largest_fitting(
            &MMA_TILES,
            make,
            max_shared_bytes,
            head_dim,
            Self::shared_bytes,
        )
    }

    /// Whether `client`'s device runs the register kernel's products on its
    /// matrix units in `dtype`: a 16-bit type with the 16 x 8 x 16 `mma`
    /// instruction (f32 accumulators) on 32-unit planes, and `ldmatrix`,
    /// which loads the kernels' operands from shared memory there.
    pub fn mma_runs<R: Runtime>(client: &ComputeClient<R>, dtype: FloatDtype) -> bool {
        let matmul = &client.features().matmul;
        plane_product(client, dtype, (MMA_ROWS, MMA_COLS, MMA_DEPTH)).is_some_and(|config| {
            matmul.mma.contains(&config) && matmul.ldmatrix.contains(&config.a_type)
        })
    }

    /// [`AttentionKernel::choose`] for a device with `max_shared_bytes` of
    /// shared memory per cube.
    pub fn for_shared_memory(max_shared_bytes: usize, head_dim: usize) -> AttentionKernel {
        TILE_SIZES
            .into_iter()
            .find(|&tile| tiled_shared_bytes(tile, head_dim) <= max_shared_bytes)
            .map_or(AttentionKernel::Row, |tile| AttentionKernel::Tiled { tile })
    }

    /// Shared memory of one cube, bytes, for `head_dim` (0 for the row
    /// kernel); for the fragment kernel on plain units, with f32 operands
    /// whatever the type (an upper bound for 16-bit types).
    pub fn shared_bytes(self, head_dim: usize) -> usize {
        match self {
            AttentionKernel::Row => 0,
            AttentionKernel::Tiled { tile } => tiled_shared_bytes(tile, head_dim),
            AttentionKernel::Fragment {
                planes,
                keys,
                matrix_units,
            } => {
                let operand_bytes = if matrix_units { 2 } else { 4 };
                fragment_forward_shared_bytes(planes, keys, head_dim, operand_bytes)
            }
            AttentionKernel::Registers {
                planes,
                keys,
                matrix_units,
            } => registers_shared_bytes(planes, keys, head_dim, matrix_units),
        }
    }

    /// Query rows a cube owns.
    pub(crate) fn rows_per_cube(self) -> usize {
        match self {
            AttentionKernel::Row => ROWS_PER_CUBE,
            AttentionKernel::Tiled { tile } => tile,
            AttentionKernel::Fragment { planes, .. } => planes * FRAGMENT,
            AttentionKernel::Registers { planes, .. } => planes * MMA_ROWS,
        }
    }

    /// Short name: `row`, `tiled{tile}` (e.g. `tiled32`),
    /// `fragment{rows}x{keys}` with `-cmma` on the matrix units and
    /// `-plain` on plain units (e.g. `fragment64x64-cmma`), or
    /// `registers{rows}x{keys}` with `-mma` or `-plain`.
    pub fn name(self) -> String {
        match self {
            AttentionKernel::Row => "row".to_string(),
            AttentionKernel::Tiled { tile } => format!("tiled{tile}"),
            AttentionKernel::Fragment {
                planes,
                keys,
                matrix_units,
            } => {
                let units = if matrix_units { "cmma" } else { "plain" };
                format!("fragment{}x{keys}-{units}", planes * FRAGMENT)
            }
            AttentionKernel::Registers {
                planes,
                keys,
                matrix_units,
            } => {
                let units = if matrix_units { "mma" } else { "plain" };
                format!("registers{}x{keys}-{units}", planes * MMA_ROWS)
            }
        }
    }

    /// Fails when this is the fragment or the register kernel on matrix
    /// units that do not run `dtype` on `client`'s device
    /// ([`Self::matrix_units_run`], [`Self::mma_runs`]).
    pub(crate) fn check_units<R: Runtime>(
        self,
        client: &ComputeClient<R>,
        dtype: FloatDtype,
    ) -> Result<(), AttentionError> {
        let run = match self {
            AttentionKernel::Fragment {
                matrix_units: true, ..
            } => matrix_units_run(client, dtype),
            AttentionKernel::Registers {
                matrix_units: true, ..
            } => Self::mma_runs(client, dtype),
            _ => true,
        };
        if run {
            Ok(())
        } else {
            Err(AttentionError::MatrixUnitsUnsupported {
                dtype: dtype.name(),
            })
        }
    }

    /// Fails when this kernel cannot run `shape` on a device with
    /// `max_shared_bytes` of shared memory per cube: a tile size not in
    /// [`TILE_SIZES`] (tiled), tiles not in [`FRAGMENT_TILES`] or a head
    /// dimension not a multiple of 16 up to 128 (fragment), or more shared
    /// memory than the device has. (Whether the matrix units run is
    /// checked by the launcher, which has the type.)
    pub(crate) fn check(
        self,
        shape: &AttentionShape,
        max_shared_bytes: usize,
    ) -> Result<(), AttentionError> {
        let needed = self.shared_bytes(shape.head_dim);
        match self {
            AttentionKernel::Row => Ok(()),
            AttentionKernel::Tiled { tile } => {
                if !TILE_SIZES.contains(&tile) {
                    return Err(AttentionError::UnsupportedTile { tile });
                }
                if needed > max_shared_bytes {
                    return Err(AttentionError::SharedMemory {
                        tile,
                        needed,
                        max: max_shared_bytes,
                    });
                }
                Ok(())
            }
            AttentionKernel::Fragment { planes, keys, .. }
            | AttentionKernel::Registers { planes, keys, .. } => {
                let (outer, tiles) = match self {
                    AttentionKernel::Fragment { .. } => (planes * FRAGMENT, &FRAGMENT_TILES[..]),
                    _ => (planes * MMA_ROWS, &MMA_TILES[..]),
                };
                if !tiles.contains(&(planes, keys)) || !fragment_head_dim(shape.head_dim) {
                    return Err(AttentionError::UnsupportedFragment {
                        outer,
                        inner: keys,
                        head_dim: shape.head_dim,
                    });
                }
                if needed > max_shared_bytes {
                    return Err(AttentionError::ForwardSharedMemory {
                        outer,
                        inner: keys,
                        needed,
                        max: max_shared_bytes,
                    });
                }
                Ok(())
            }
        }
    }
}

/// The first kernel `make` gives for the tiles `(planes, inner)` of
/// `tiles` (largest first) whose shared memory fits `max_shared_bytes` at
/// `head_dim`; `None` where none fits or `head_dim` is not a multiple of
/// 16 up to 128 (the fragment and register kernels' head dimensions).
pub(crate) fn largest_fitting<K: Copy>(
    tiles: &[(usize, usize)],
    make: impl Fn(usize, usize) -> K,
    max_shared_bytes: usize,
    head_dim: usize,
    shared_bytes: impl Fn(K, usize) -> usize,
) -> Option<K> {
    if !fragment_head_dim(head_dim) {
        return None;
    }
    tiles
        .iter()
        .map(|&(planes, inner)| make(planes, inner))
        .find(|&kernel| shared_bytes(kernel, head_dim) <= max_shared_bytes)
}

/// Tiles `(planes, keys)` the register forward is compiled for, largest
/// first: a cube of `planes` planes owns `16 * planes` query rows and
/// walks the keys `keys` at a time (FlashAttention-2's CUDA kernel takes 4
/// warps and 64 keys at head dimension 128).
pub const MMA_TILES: [(usize, usize); 4] = [(4, 64), (4, 32), (4, 16), (1, 16)];

/// Shared memory of one cube of the register forward with `planes`
/// planes and `keys` keys per step at `head_dim`, in bytes: the key and
/// the value tile, rows of `head_dim +` [`TILE_PAD`] values (16-bit
/// operands on the matrix units, f32 bounding the plain form) and, on
/// plain units, [`MMA_SCRATCH`] f32 values per plane.
/// Each array is padded to 128 bytes, as allocated.
fn registers_shared_bytes(
    planes: usize,
    keys: usize,
    head_dim: usize,
    matrix_units: bool,
) -> usize {
    let pad = |bytes: usize| bytes.next_multiple_of(128);
    let (operand_bytes, scratch) = if matrix_units {
        (2, 1)
    } else {
        (4, planes * MMA_SCRATCH)
    };
    2 * pad(keys * (head_dim + TILE_PAD) * operand_bytes) + pad(scratch * 4)
}

/// Whether the fragment kernels run `head_dim`: whole 16-column blocks,
/// and at most [`CMMA_MAX_HEAD_DIM`] (each unit keeps `head_dim / 2`
/// accumulators of each output or gradient in registers).
pub(crate) fn fragment_head_dim(head_dim: usize) -> bool {
    head_dim.is_multiple_of(FRAGMENT) && head_dim <= CMMA_MAX_HEAD_DIM
}

/// Whether `client`'s device multiplies `dtype`'s 16-bit operand type
/// ([`cmma_operand`]) in 16x16x16 `cmma` fragments with f32 accumulators,
/// on 32-unit planes: what the fragment kernels on the matrix units need
/// besides their shapes and shared memory.
pub(crate) fn matrix_units_run<R: Runtime>(client: &ComputeClient<R>, dtype: FloatDtype) -> bool {
    plane_product(client, dtype, (FRAGMENT, FRAGMENT, FRAGMENT))
        .is_some_and(|config| client.features().matmul.cmma.contains(&config))
}

// One plane size serves both kernel families' check.
const _: () = assert!(CMMA_PLANE_SIZE == MMA_PLANE_SIZE);

/// The product `(m, n, k)` of `dtype`'s 16-bit operand type
/// ([`cmma_operand`]) with f32 accumulators, as the device lists its
/// matrix-unit products, where `client`'s planes are 32 units wide (both
/// the fragment and the register kernels are written for 32-unit planes);
/// `None` for f32 or other plane sizes.
fn plane_product<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    (m, n, k): (usize, usize, usize),
) -> Option<MmaConfig> {
    let hardware = &client.properties().hardware;
    let planes_of_32 = hardware.plane_size_min == CMMA_PLANE_SIZE as u32
        && hardware.plane_size_max == CMMA_PLANE_SIZE as u32;
    let operand = cmma_operand(dtype).filter(|_| planes_of_32)?;
    Some(MmaConfig {
        a_type: operand.into(),
        b_type: operand.into(),
        cd_type: ElemType::Float(FloatKind::F32).into(),
        m: m as u32,
        n: n as u32,
        k: k as u32,
    })
}

/// The 16-bit operand type of the fragment kernels on the matrix units for
/// storage `dtype` (which it holds exactly); `None` for f32.
fn cmma_operand(dtype: FloatDtype) -> Option<ElemType> {
    match dtype {
        FloatDtype::F32 => None,
        FloatDtype::F16 => Some(ElemType::Float(FloatKind::F16)),
        FloatDtype::Bf16 | FloatDtype::Bf16InF32 => Some(ElemType::Float(FloatKind::BF16)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_tile_that_fits_is_chosen() {
        // 32 x 128: (4096 + 4128 + 1056 + 96 + 256) f32 = 38,528 bytes.
        assert_eq!(tiled_shared_bytes(32, 128), 38_528);
        assert_eq!(
            AttentionKernel::for_shared_memory(48 * 1024, 128),
            AttentionKernel::Tiled { tile: 32 }
        );
        assert_eq!(
            AttentionKernel::for_shared_memory(32 * 1024, 128),
            AttentionKernel::Tiled { tile: 16 }
        );
        assert_eq!(
            AttentionKernel::for_shared_memory(48 * 1024, 256),
            AttentionKernel::Tiled { tile: 16 }
        );
        // wgpu's default limit (16 KiB) fits 16 x 64 but not 16 x 128.
        assert_eq!(
            AttentionKernel::for_shared_memory(16 * 1024, 64),
            AttentionKernel::Tiled { tile: 16 }
        );
        assert_eq!(
            AttentionKernel::for_shared_memory(16 * 1024, 128),
            AttentionKernel::Row
        );
    }

    #[test]
    fn a_tile_that_does_not_fit_is_refused() {
        let shape = AttentionShape {
            batch: 1,
            n_heads: 1,
            n_kv_heads: 1,
            seq: 8,
            head_dim: 128,
        };
        assert_eq!(AttentionKernel::Row.check(&shape, 0), Ok(()));
        assert_eq!(
            AttentionKernel::Tiled { tile: 32 }.check(&shape, 32 * 1024),
            Err(AttentionError::SharedMemory {
                tile: 32,
                needed: 38_528,
                max: 32 * 1024
            })
        );
        assert_eq!(
            AttentionKernel::Tiled { tile: 8 }.check(&shape, 1 << 20),
            Err(AttentionError::UnsupportedTile { tile: 8 })
        );
    }

    #[test]
    fn the_largest_fragment_tiles_that_fit_are_chosen() {
        // 4 planes x 64 keys at head_dim 128 in 16 bits: query and key
        // tiles 2 * 16,384, f32 scores 16,384, probabilities 8,192, four
        // blocks 4,096, row statistics 3 * 256, partials 2 * 512.
        assert_eq!(fragment_forward_shared_bytes(4, 64, 128, 2), 63_232);
        let fragment = |planes, keys, matrix_units| {
            Some(AttentionKernel::Fragment {
                planes,
                keys,
                matrix_units,
            })
        };
        // An H100 (227 KiB per cube) and an A100 (164 KiB) take the largest.
        for max in [227 * 1024, 164 * 1024] {
            assert_eq!(
                AttentionKernel::fragment_for(max, 128, true),
                fragment(4, 64, true)
            );
        }
        // lavapipe (32 KiB), f32 operands: 32 x 32 at 32 and 64, 32 x 16
        // at 128.
        let lavapipe = 32 * 1024;
        for head_dim in [32, 64] {
            assert_eq!(
                AttentionKernel::fragment_for(lavapipe, head_dim, false),
                fragment(2, 32, false)
            );
        }
        assert_eq!(
            AttentionKernel::fragment_for(lavapipe, 128, false),
            fragment(2, 16, false)
        );
        for head_dim in [72, 256] {
            assert_eq!(AttentionKernel::fragment_for(1 << 20, head_dim, true), None);
        }
        assert_eq!(fragment(4, 64, true).unwrap().name(), "fragment64x64-cmma");
        assert_eq!(
            fragment(2, 16, false).unwrap().name(),
            "fragment32x16-plain"
        );
    }

    #[test]
    fn the_largest_register_tiles_that_fit_are_chosen() {
        // 4 planes x 64 keys at head dim 128 in 16 bits: key and value
        // tiles of 64 rows of 136 values, 2 * 17,408 bytes, and the unused
        // one-value scratch.
        assert_eq!(registers_shared_bytes(4, 64, 128, true), 34_944);
        let registers = |planes, keys, matrix_units| {
            Some(AttentionKernel::Registers {
                planes,
                keys,
                matrix_units,
            })
        };
        for max in [227 * 1024, 164 * 1024, 48 * 1024] {
            assert_eq!(
                AttentionKernel::registers_for(max, 128, true),
                registers(4, 64, true)
            );
        }
        // lavapipe (32 KiB), f32 operands and 6 KiB of scratch for 4
        // planes: 64 keys at head dim 32, 32 at 64, 16 at 128.
        let lavapipe = 32 * 1024;
        for (head_dim, keys) in [(32, 64), (64, 32), (128, 16)] {
            assert_eq!(
                AttentionKernel::registers_for(lavapipe, head_dim, false),
                registers(4, keys, false),
                "head dim {head_dim}"
            );
        }
        for head_dim in [72, 256] {
            assert_eq!(
                AttentionKernel::registers_for(1 << 20, head_dim, true),
                None
            );
        }
        assert_eq!(registers(4, 64, true).unwrap().name(), "registers64x64-mma");
        assert_eq!(
            registers(1, 16, false).unwrap().name(),
            "registers16x16-plain"
        );
        let shape = AttentionShape {
            batch: 1,
            n_heads: 1,
            n_kv_heads: 1,
            seq: 8,
            head_dim: 64,
        };
        assert_eq!(
            registers(2, 32, true).unwrap().check(&shape, 1 << 20),
            Err(AttentionError::UnsupportedFragment {
                outer: 32,
                inner: 32,
                head_dim: 64
            })
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
        let kernel = |planes, keys| AttentionKernel::Fragment {
            planes,
            keys,
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
            kernel(4, 64).check(&shape(128), 32 * 1024),
            Err(AttentionError::ForwardSharedMemory {
                outer: 64,
                inner: 64,
                needed: fragment_forward_shared_bytes(4, 64, 128, 4),
                max: 32 * 1024
            })
        );
        assert_eq!(kernel(2, 32).check(&shape(64), 32 * 1024), Ok(()));
    }
}
