//! Which forward kernel runs: the one place that chooses between the row
//! kernel and the tiled kernel, and says where the tiled kernel on matrix
//! units (cmma) can run.

use cubecl::ir::features::MmaConfig;
use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::*;

use super::cmma_forward::{cmma_shared_bytes, CMMA_MAX_HEAD_DIM, CMMA_PLANE_SIZE, FRAGMENT};
use super::shape::{AttentionError, AttentionOptions, AttentionShape};
use super::tiled_forward::{tiled_shared_bytes, TILE_SIZES};
use crate::dtype::FloatDtype;

/// The attention forward kernel of a launch. Both write the same output and
/// log-sum-exp, which the one backward consumes.
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
    /// FlashAttention-2 tiles with both products on the matrix units
    /// (`cmma_forward.rs`, tensor cores on CUDA): 16-bit storage (f16,
    /// bf16, bf16-in-f32) only, `head_dim` a multiple of 16 up to 128, on a
    /// device with 32-unit planes and 16x16x16 `cmma` for the type with f32
    /// accumulators.
    Cmma,
}

impl AttentionKernel {
    /// The kernel [`super::attention_forward_typed`] runs for `head_dim` on
    /// `client`'s device: the tiled kernel with the largest of
    /// [`TILE_SIZES`] whose shared memory fits the device's
    /// `max_shared_memory_size`, else the row kernel. Every shape and
    /// storage type takes the tiled kernel where it fits: it is the kernel
    /// of FlashAttention-2 for all sequence lengths, and both kernels give
    /// the same results within f32 rounding. [`AttentionKernel::Cmma`] is
    /// never chosen here: it is correct where tested (an H100 and an
    /// H200), but its compute-sanitizer race check has not run, so it runs
    /// only when a caller asks for it ([`AttentionKernel::for_call`] with
    /// `matrix_units`, or by name).
    pub fn choose<R: Runtime>(client: &ComputeClient<R>, head_dim: usize) -> AttentionKernel {
        Self::for_shared_memory(
            client.properties().hardware.max_shared_memory_size,
            head_dim,
        )
    }

    /// The kernel [`super::attention_forward_typed`] runs for a call of
    /// `dtype` at `head_dim` with `options` on `client`'s device:
    /// [`AttentionKernel::Cmma`] where `options.matrix_units` asks for it
    /// and [`AttentionKernel::cmma_runs`], else [`AttentionKernel::choose`]'s.
    pub fn for_call<R: Runtime>(
        client: &ComputeClient<R>,
        head_dim: usize,
        dtype: FloatDtype,
        options: AttentionOptions,
    ) -> AttentionKernel {
        if options.matrix_units && Self::cmma_runs(client, head_dim, dtype) {
            return AttentionKernel::Cmma;
        }
        Self::choose(client, head_dim)
    }

    /// Whether [`AttentionKernel::Cmma`] can run `head_dim` and `dtype` on
    /// `client`'s device: 16-bit storage, `head_dim` a multiple of 16 up to
    /// 128, 32-unit planes, 16x16x16 `cmma` with the type's operands and
    /// f32 accumulators, and the shared memory of
    /// [`AttentionKernel::shared_bytes`].
    pub fn cmma_runs<R: Runtime>(
        client: &ComputeClient<R>,
        head_dim: usize,
        dtype: FloatDtype,
    ) -> bool {
        head_dim.is_multiple_of(FRAGMENT)
            && head_dim <= CMMA_MAX_HEAD_DIM
            && cmma_shared_bytes(head_dim) <= client.properties().hardware.max_shared_memory_size
            && matrix_units_run(client, dtype)
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
    /// kernel).
    pub fn shared_bytes(self, head_dim: usize) -> usize {
        match self {
            AttentionKernel::Row => 0,
            AttentionKernel::Tiled { tile } => tiled_shared_bytes(tile, head_dim),
            AttentionKernel::Cmma => cmma_shared_bytes(head_dim),
        }
    }

    /// Short name: `row`, `tiled{tile}` (e.g. `tiled32`) or `cmma`.
    pub fn name(self) -> String {
        match self {
            AttentionKernel::Row => "row".to_string(),
            AttentionKernel::Tiled { tile } => format!("tiled{tile}"),
            AttentionKernel::Cmma => "cmma".to_string(),
        }
    }

    /// Fails when this kernel cannot run `shape` on a device with
    /// `max_shared_bytes` of shared memory per cube: a tile size not in
    /// [`TILE_SIZES`], or more shared memory than the device has.
    pub(crate) fn check(
        self,
        shape: &AttentionShape,
        max_shared_bytes: usize,
    ) -> Result<(), AttentionError> {
        // The cmma kernel's limits, its shared memory among them, are
        // checked by `cmma_runs`, which needs the client.
        let AttentionKernel::Tiled { tile } = self else {
            return Ok(());
        };
        if !TILE_SIZES.contains(&tile) {
            return Err(AttentionError::UnsupportedTile { tile });
        }
        let needed = self.shared_bytes(shape.head_dim);
        if needed > max_shared_bytes {
            return Err(AttentionError::SharedMemory {
                tile,
                needed,
                max: max_shared_bytes,
            });
        }
        Ok(())
    }
}

/// Whether `client`'s device multiplies `dtype`'s 16-bit operand type
/// ([`cmma_operand`]) in 16x16x16 `cmma` fragments with f32 accumulators,
/// on 32-unit planes: what the cmma forward and the fragment backward on
/// the matrix units need besides their shapes and shared memory.
pub(crate) fn matrix_units_run<R: Runtime>(client: &ComputeClient<R>, dtype: FloatDtype) -> bool {
    let Some(operand) = cmma_operand(dtype) else {
        return false;
    };
    let hardware = &client.properties().hardware;
    let fragment = FRAGMENT as u32;
    let config = MmaConfig {
        a_type: operand.into(),
        b_type: operand.into(),
        cd_type: ElemType::Float(FloatKind::F32).into(),
        m: fragment,
        n: fragment,
        k: fragment,
    };
    hardware.plane_size_min == CMMA_PLANE_SIZE as u32
        && hardware.plane_size_max == CMMA_PLANE_SIZE as u32
        && client.features().matmul.cmma.contains(&config)
}

/// The 16-bit operand type of the cmma kernel for storage `dtype` (which
/// it holds exactly); `None` for f32.
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
        // 32 x 128: (4096 + 4128 + 1056 + 96) f32 = 37,504 bytes.
        assert_eq!(tiled_shared_bytes(32, 128), 37_504);
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
                needed: 37_504,
                max: 32 * 1024
            })
        );
        assert_eq!(
            AttentionKernel::Tiled { tile: 8 }.check(&shape, 1 << 20),
            Err(AttentionError::UnsupportedTile { tile: 8 })
        );
    }
}
