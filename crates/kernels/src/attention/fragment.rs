//! The 16 x 16 tile product the fragment backward kernels are built from,
//! on the matrix units (`cmma`) or on plain units, and the shared memory
//! those kernels take.
//!
//! Both forms read their operands from shared memory as `M` and leave the
//! f32 product in shared memory, so a kernel is one source for both: on a
//! device with 16 x 16 x 16 `cmma` for `M` (tensor cores) the products run
//! there; elsewhere (lavapipe, which has no cooperative matrices) the same
//! kernel runs with the products on plain units, which is how the tests
//! check its tiling, masking and indexing without a GPU.

use cubecl::prelude::*;

/// Units per plane the fragment kernels are written for (NVIDIA's warp;
/// on devices with other plane sizes only the plain form runs, whose
/// barriers are cube barriers).
pub(crate) const CMMA_PLANE_SIZE: usize = 32;

/// Side of the square `cmma` fragments (m = n = k = 16).
pub(crate) const FRAGMENT: usize = 16;

/// Largest head dimension of the fragment kernels (each unit keeps up to
/// `head_dim / 2` accumulators of one gradient or output in registers).
pub(crate) const CMMA_MAX_HEAD_DIM: usize = 128;

/// Tiles `(planes, inner)` the fragment kernels are compiled for, largest
/// first: a cube of `planes` planes owns `16 * planes` rows (query rows in
/// the forward and the dQ kernel, key rows in the dK/dV kernel) and walks
/// the other side `inner` rows at a time.
pub const FRAGMENT_TILES: [(usize, usize); 5] = [(4, 64), (4, 32), (2, 32), (2, 16), (1, 16)];

/// Runs `$body` with the type alias `$m` set to the operand type of the
/// fragment kernels for `$dtype`: the 16-bit type itself for f16 and bf16;
/// for bf16 carried in f32, bf16 on the matrix units and f32 on plain
/// units (WGSL has no bf16); f32 for f32 (plain units only: the matrix
/// units are never reached for f32).
macro_rules! with_fragment_operand {
    ($dtype:expr, $matrix_units:expr, $m:ident, $body:expr) => {
        match ($dtype, $matrix_units) {
            (FloatDtype::F16, _) => {
                type $m = half::f16;
                $body
            }
            (FloatDtype::Bf16, _) | (FloatDtype::Bf16InF32, true) => {
                type $m = half::bf16;
                $body
            }
            (FloatDtype::F32, _) | (FloatDtype::Bf16InF32, false) => {
                type $m = f32;
                $body
            }
        }
    };
}
pub(crate) use with_fragment_operand;

/// Entries of one 16 x 16 fragment each unit of a plane computes in the
/// plain form (`16 * 16 / 32`); also each unit's share of an accumulator
/// block.
pub(crate) const PER_LANE: usize = FRAGMENT * FRAGMENT / CMMA_PLANE_SIZE;

/// `c[16 x 16] = a[16 x depth] * b[depth x 16]`, computed by one plane
/// (the 32 units whose `UNIT_POS_X` is `lane`) and stored row-major in `c`
/// from `c_at` with row stride `c_stride`, in f32.
///
/// `a` is row-major from `a_at` with row stride `a_stride`; `b` is
/// row-major (`b[k, j]` at `b_at + k * b_stride + j`) or, with
/// `b_col_major`, column-major (`b[k, j]` at `b_at + j * b_stride + k`).
/// `depth` is a multiple of 16. `a_len`, `b_len` and `c_len` are the
/// lengths of the shared arrays (the ends of the slices `cmma` reads).
///
/// With `matrix_units`, `cmma` fragments with f32 accumulators (every unit
/// of the plane must call this together); otherwise each unit sums
/// [`PER_LANE`] entries in f32 over `depth`. Offsets and strides must be
/// multiples of 16 elements (the `cmma` loads' alignment).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn fragment_product<M: Float>(
    a: &SharedMemory<M>,
    a_at: usize,
    b: &SharedMemory<M>,
    b_at: usize,
    c: &mut SharedMemory<f32>,
    c_at: usize,
    lane: usize,
    #[comptime] strides: (usize, usize, usize),
    #[comptime] lens: (usize, usize, usize),
    #[comptime] depth: usize,
    #[comptime] b_col_major: bool,
    #[comptime] matrix_units: bool,
) {
    let (a_stride, b_stride, c_stride) = strides;
    let (a_len, b_len, c_len) = lens;
    if matrix_units {
        let acc = cmma::Matrix::<f32>::from_value(
            cmma::MatrixIdent::Accumulator,
            FRAGMENT,
            FRAGMENT,
            FRAGMENT,
            cmma::MatrixLayout::Undefined,
            0.0f32,
        );
        #[unroll]
        for kb in 0..comptime!(depth / FRAGMENT) {
            let x = cmma::Matrix::<M>::from_slice(
                cmma::MatrixIdent::A,
                FRAGMENT,
                FRAGMENT,
                FRAGMENT,
                cmma::MatrixLayout::RowMajor,
                &a.slice(a_at + kb * FRAGMENT, a_len),
                a_stride as u32,
            );
            if b_col_major {
                let y = cmma::Matrix::<M>::from_slice(
                    cmma::MatrixIdent::B,
                    FRAGMENT,
                    FRAGMENT,
                    FRAGMENT,
                    cmma::MatrixLayout::ColMajor,
                    &b.slice(b_at + kb * FRAGMENT, b_len),
                    b_stride as u32,
                );
                cmma::execute::<M, M, f32, f32>(&x, &y, &acc, &acc);
            } else {
                let y = cmma::Matrix::<M>::from_slice(
                    cmma::MatrixIdent::B,
                    FRAGMENT,
                    FRAGMENT,
                    FRAGMENT,
                    cmma::MatrixLayout::RowMajor,
                    &b.slice(b_at + kb * FRAGMENT * b_stride, b_len),
                    b_stride as u32,
                );
                cmma::execute::<M, M, f32, f32>(&x, &y, &acc, &acc);
            }
        }
        cmma::store(
            &mut c.slice_mut(c_at, c_len),
            &acc,
            c_stride as u32,
            cmma::MatrixLayout::RowMajor,
        );
    } else {
        // Element (k, j) of `b` at `b_at + k * step_k + j * step_j`.
        let (step_k, step_j) = comptime!(if b_col_major {
            (1usize, b_stride)
        } else {
            (b_stride, 1usize)
        });
        for j in 0..PER_LANE {
            let e = lane + j * CMMA_PLANE_SIZE;
            let row = e / FRAGMENT;
            let col = e % FRAGMENT;
            let mut sum = 0.0f32;
            for kk in 0..depth {
                let x = f32::cast_from(a[a_at + row * a_stride + kk]);
                let y = f32::cast_from(b[b_at + kk * step_k + col * step_j]);
                sum += x * y;
            }
            c[c_at + row * c_stride + col] = sum;
        }
    }
}

/// The barrier between a plane's [`fragment_product`] into a 16 x 16
/// block and its units' reads of their [`PER_LANE`] entries of it (and
/// between those reads and the next product into the block). On the
/// matrix units the block is stored by the plane together, so a plane
/// barrier (the device's planes are 32 units wide there); on plain units
/// each unit reads back only the entries it computed, so none.
#[cube]
pub(crate) fn sync_block(#[comptime] matrix_units: bool) {
    if matrix_units {
        sync_plane();
    }
}

/// Shared memory of one cube of the fragment backward with `planes` planes
/// (`16 * planes` rows a cube owns) and `inner` rows of the other side per
/// step, for `head_dim` and operands of `operand_bytes` bytes, in bytes:
/// the larger of the two kernels'. Both hold two `outer x head_dim` and two
/// `inner x head_dim` operand tiles and two f32 `outer x inner` product
/// tiles; the dK/dV kernel adds two `outer x inner` operand tiles, two f32
/// accumulator blocks per plane and two f32 values per inner row, the dQ
/// kernel one operand tile, one block per plane and two values per outer
/// row. Each array is padded to 128 bytes, as allocated.
pub(crate) fn fragment_backward_shared_bytes(
    planes: usize,
    inner: usize,
    head_dim: usize,
    operand_bytes: usize,
) -> usize {
    let pad = |bytes: usize| bytes.next_multiple_of(128);
    let outer = planes * FRAGMENT;
    let block = pad(planes * FRAGMENT * FRAGMENT * 4);
    let common = 2 * pad(outer * head_dim * operand_bytes)
        + 2 * pad(inner * head_dim * operand_bytes)
        + 2 * pad(outer * inner * 4);
    let kv = common + 2 * pad(outer * inner * operand_bytes) + 2 * block + 2 * pad(inner * 4);
    let q = common + pad(outer * inner * operand_bytes) + block + 2 * pad(outer * 4);
    kv.max(q)
}

/// Shared memory of one cube of the fragment forward with `planes` planes
/// (`16 * planes` query rows) and `keys` keys per step, for `head_dim` and
/// operands of `operand_bytes` bytes, in bytes: the query tile and one
/// key/value tile as operands, the f32 scores and the operand
/// probabilities of a step (`rows x keys` each), one f32 16 x 16 block per
/// plane, three f32 statistics per row and two f32 partials per unit (two
/// units per row). Each array is padded to 128 bytes, as allocated.
pub(crate) fn fragment_forward_shared_bytes(
    planes: usize,
    keys: usize,
    head_dim: usize,
    operand_bytes: usize,
) -> usize {
    let pad = |bytes: usize| bytes.next_multiple_of(128);
    let rows = planes * FRAGMENT;
    pad(rows * head_dim * operand_bytes)
        + pad(keys * head_dim * operand_bytes)
        + pad(rows * keys * 4)
        + pad(rows * keys * operand_bytes)
        + pad(planes * FRAGMENT * FRAGMENT * 4)
        + 3 * pad(rows * 4)
        + 2 * pad(2 * rows * 4)
}
