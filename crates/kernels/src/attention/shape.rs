//! Shapes, options and shape checks of the attention launchers.

use cubecl::server::Handle;

use super::tiles::MAX_HEAD_DIM;
use crate::dtype::FloatDtype;

/// Dimensions of one attention call. `q`, the output and `dO` are `[batch,
/// n_heads, seq, head_dim]`; `k`, `v` (and their gradients) are `[batch,
/// n_kv_heads, seq, head_dim]`; the log-sum-exp is `[batch, n_heads, seq]`.
/// All contiguous row-major, in the launch's [`FloatDtype`] (the log-sum-exp
/// always f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// Batch size.
    pub batch: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads; must divide `n_heads`. Query head `h` attends with
    /// key/value head `h / (n_heads / n_kv_heads)` (grouped-query attention).
    pub n_kv_heads: usize,
    /// Sequence length (queries and keys), in tokens; any value from 1.
    pub seq: usize,
    /// Values per head, 1 to 256. The test suite covers 32, 64, 80 and 128;
    /// 256 passed a manual run (seq 37 causal with ALiBi and GQA, seq 70
    /// plain; 11 s on lavapipe).
    pub head_dim: usize,
}

impl AttentionShape {
    /// Elements of `q` (and of the output, `dO`, `dQ`).
    pub fn q_elems(&self) -> usize {
        self.batch * self.n_heads * self.seq * self.head_dim
    }

    /// Elements of `k` and `v` (and of `dK`, `dV`).
    pub fn kv_elems(&self) -> usize {
        self.batch * self.n_kv_heads * self.seq * self.head_dim
    }

    /// Elements of the log-sum-exp (one per query row).
    pub fn rows(&self) -> usize {
        self.batch * self.n_heads * self.seq
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    /// Checks the dimensions: all non-zero, `n_kv_heads` divides `n_heads`,
    /// `head_dim` at most 256 and every buffer addressable with 32-bit
    /// indices.
    pub fn validate(&self) -> Result<(), AttentionError> {
        for (name, value) in [
            ("batch", self.batch),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("seq", self.seq),
            ("head_dim", self.head_dim),
        ] {
            if value == 0 {
                return Err(AttentionError::ZeroDim { name });
            }
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(AttentionError::HeadsNotDivisible {
                n_heads: self.n_heads,
                n_kv_heads: self.n_kv_heads,
            });
        }
        if self.head_dim > MAX_HEAD_DIM {
            return Err(AttentionError::HeadDimTooLarge {
                head_dim: self.head_dim,
                max: MAX_HEAD_DIM,
            });
        }
        let elems = self.q_elems();
        if elems > u32::MAX as usize {
            return Err(AttentionError::TooLarge { elems });
        }
        Ok(())
    }
}

/// Options of one attention call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttentionOptions {
    /// Mask key `j` for query `i` when `j > i`.
    pub causal: bool,
    /// Multiplier of `q . k` before the softmax, in [`SCALE_RANGE`];
    /// `None` means `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Which kernels run the products on the matrix units (tensor cores)
    /// where the device runs them for the call's type and head dimension;
    /// elsewhere, and with [`MatrixUnits::Off`], the kernels `choose`
    /// picks run (tiled, on plain units).
    pub matrix_units: MatrixUnits,
}

/// The attention kernels a call asks for on the matrix units
/// ([`AttentionOptions::matrix_units`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatrixUnits {
    /// None: the kernels `choose` picks.
    #[default]
    Off,
    /// The fragment forward and backward on `cmma`
    /// ([`super::AttentionKernel::Fragment`],
    /// [`super::AttentionBackwardKernel::Fragment`]).
    Fragments,
    /// The register forward and backward on the 16 x 8 x 16 `mma`
    /// instruction ([`super::AttentionKernel::Registers`],
    /// [`super::AttentionBackwardKernel::Registers`]).
    Registers,
}

/// The softmax scales the kernels take. Positive, because the register
/// forward takes the largest unscaled score for the largest scaled one;
/// bounded, because it masks a score by giving it the finite value
/// `-1e30` before scaling it: scaled, that stays finite (below `1e8`)
/// and its exponential 0 (above `1e-20`). Softmax scales in use are
/// about `1 / sqrt(head_dim)`, 0.06 to 1.
pub const SCALE_RANGE: std::ops::RangeInclusive<f32> = 1e-20..=1e8;

impl AttentionOptions {
    /// The softmax scale used for `head_dim`.
    pub fn scale_for(&self, head_dim: usize) -> f32 {
        self.scale.unwrap_or(1.0 / (head_dim as f32).sqrt())
    }

    /// [`Self::scale_for`], checked to lie in [`SCALE_RANGE`].
    pub fn checked_scale(&self, head_dim: usize) -> Result<f32, AttentionError> {
        let scale = self.scale_for(head_dim);
        if SCALE_RANGE.contains(&scale) {
            Ok(scale)
        } else {
            Err(AttentionError::Scale {
                scale: scale.to_string(),
            })
        }
    }
}

/// Device buffers read by both the forward and the backward pass.
#[derive(Clone, Copy, Debug)]
pub struct AttentionInputs<'a> {
    /// Queries, `[batch, n_heads, seq, head_dim]`.
    pub q: &'a Handle,
    /// Keys, `[batch, n_kv_heads, seq, head_dim]`.
    pub k: &'a Handle,
    /// Values, `[batch, n_kv_heads, seq, head_dim]`.
    pub v: &'a Handle,
    /// Optional ALiBi slopes, `[n_heads]`, always f32: the score of query `i` and key
    /// `j` in head `h` gets `slopes[h] * (j - i)` added (BLOOM / Hugging Face
    /// convention; with the causal mask `j - i <= 0`, so positive slopes
    /// penalise distant keys).
    pub alibi_slopes: Option<&'a Handle>,
}

/// Errors of the attention launchers: a shape that the kernels do not
/// support or a buffer whose size does not match the shape.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AttentionError {
    /// A dimension is zero.
    #[error("attention shape: `{name}` must be at least 1")]
    ZeroDim {
        /// The field of [`AttentionShape`].
        name: &'static str,
    },
    /// `n_kv_heads` does not divide `n_heads`.
    #[error("attention shape: n_kv_heads ({n_kv_heads}) must divide n_heads ({n_heads})")]
    HeadsNotDivisible {
        /// Query heads.
        n_heads: usize,
        /// Key/value heads.
        n_kv_heads: usize,
    },
    /// `head_dim` above the supported maximum.
    #[error("attention shape: head_dim {head_dim} is above the supported maximum {max}")]
    HeadDimTooLarge {
        /// Requested head dimension.
        head_dim: usize,
        /// Largest supported head dimension.
        max: usize,
    },
    /// A buffer would need indices beyond 32 bits.
    #[error("attention shape: {elems} elements per buffer exceed the 32-bit index range")]
    TooLarge {
        /// Elements of the largest buffer.
        elems: usize,
    },
    /// A softmax scale outside [`SCALE_RANGE`].
    #[error(
        "attention: the softmax scale must lie in {min:e} ..= {max:e}, not {scale}",
        min = SCALE_RANGE.start(),
        max = SCALE_RANGE.end()
    )]
    Scale {
        /// The scale asked for, as printed.
        scale: String,
    },
    /// The runtime cannot run the kernels on this element type.
    #[error("attention: {message}")]
    UnsupportedDtype {
        /// Which type and runtime.
        message: String,
    },
    /// A buffer is smaller than the shape needs.
    #[error("attention buffer `{name}`: expected at least {expected_bytes} bytes for the given shape, got {actual_bytes}")]
    BufferSize {
        /// Which buffer (`q`, `k`, `v`, `alibi_slopes`, `out`, `lse`, `d_out`).
        name: &'static str,
        /// Bytes the shape implies (elements * bytes per element).
        expected_bytes: u64,
        /// Bytes of the handle.
        actual_bytes: u64,
    },
    /// A tiled forward with a tile size it is not compiled for.
    #[error("attention: tile {tile} is not a tile size of the tiled kernel (16 or 32)")]
    UnsupportedTile {
        /// Requested query rows and keys per tile.
        tile: usize,
    },
    /// A tiled forward whose cube needs more shared memory than the device has.
    #[error("attention: the tiled kernel with tile {tile} needs {needed} bytes of shared memory per cube, the device has {max}")]
    SharedMemory {
        /// Query rows and keys per tile.
        tile: usize,
        /// Bytes one cube needs.
        needed: usize,
        /// The device's `max_shared_memory_size`.
        max: usize,
    },
    /// A tiled backward with tiles it is not compiled for.
    #[error("attention: tiles {outer} x {inner} are not tiles of the tiled backward (32 x 32, 32 x 16, 16 x 16 or 16 x 8)")]
    UnsupportedBackwardTiles {
        /// Requested rows per cube.
        outer: usize,
        /// Requested rows of the other side per step.
        inner: usize,
    },
    /// A fragment kernel (forward or backward) with tiles it is not
    /// compiled for, or a head dimension it does not run.
    #[error("attention: the fragment kernels run tiles of 64 x 64, 64 x 32, 32 x 32, 32 x 16 or 16 x 16 and head_dim a multiple of 16 up to 128, not {outer} x {inner} at head_dim {head_dim}")]
    UnsupportedFragment {
        /// Requested rows per cube (16 per plane).
        outer: usize,
        /// Requested rows of the other side per step.
        inner: usize,
        /// Head dimension of the launch.
        head_dim: usize,
    },
    /// A fragment kernel on the matrix units on a type or device without
    /// them ([`super::AttentionKernel::matrix_units_run`]).
    #[error("attention: the fragment kernels do not run on the matrix units in {dtype} on this device (16-bit types, 32-unit planes with 16x16x16 cmma)")]
    MatrixUnitsUnsupported {
        /// Storage type of the launch.
        dtype: &'static str,
    },
    /// A fragment forward whose cube needs more shared memory than the
    /// device has.
    #[error("attention: the fragment forward with tiles {outer} x {inner} needs {needed} bytes of shared memory per cube, the device has {max}")]
    ForwardSharedMemory {
        /// Query rows per cube.
        outer: usize,
        /// Keys per step.
        inner: usize,
        /// Bytes one cube needs.
        needed: usize,
        /// The device's `max_shared_memory_size`.
        max: usize,
    },
    /// A tiled or fragment backward whose cube needs more shared memory
    /// than the device has.
    #[error("attention: the backward with tiles {outer} x {inner} needs {needed} bytes of shared memory per cube, the device has {max}")]
    BackwardSharedMemory {
        /// Rows per cube.
        outer: usize,
        /// Rows of the other side per step.
        inner: usize,
        /// Bytes one cube needs.
        needed: usize,
        /// The device's `max_shared_memory_size`.
        max: usize,
    },
    /// The launch grid exceeds the device's cube-count limit.
    #[error("attention launch: {cubes} cubes along one axis exceed the device limit {max}")]
    GridTooLarge {
        /// Cubes requested along the axis.
        cubes: usize,
        /// The device's limit for that axis.
        max: u32,
    },
}

/// Checks that `handle` holds at least `elems` values of `elem_bytes` bytes
/// (a larger handle is accepted, as [`crate::check`]'s: the kernels touch
/// only the elements the shape names).
pub(crate) fn check_buffer(
    name: &'static str,
    handle: &Handle,
    elems: usize,
    elem_bytes: usize,
) -> Result<(), AttentionError> {
    let expected_bytes = (elems * elem_bytes) as u64;
    let actual_bytes = handle.size_in_used();
    if actual_bytes >= expected_bytes {
        Ok(())
    } else {
        Err(AttentionError::BufferSize {
            name,
            expected_bytes,
            actual_bytes,
        })
    }
}

impl AttentionInputs<'_> {
    /// Checks the sizes of `q`, `k`, `v` (elements of `dtype`) and the
    /// slopes (f32) against `shape`.
    pub(crate) fn check(
        &self,
        shape: &AttentionShape,
        dtype: FloatDtype,
    ) -> Result<(), AttentionError> {
        let size = dtype.size_bytes();
        check_buffer("q", self.q, shape.q_elems(), size)?;
        check_buffer("k", self.k, shape.kv_elems(), size)?;
        check_buffer("v", self.v, shape.kv_elems(), size)?;
        if let Some(slopes) = self.alibi_slopes {
            check_buffer("alibi_slopes", slopes, shape.n_heads, 4)?;
        }
        Ok(())
    }
}
