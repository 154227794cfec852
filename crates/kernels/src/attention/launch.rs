//! Launchers of the attention forward kernels, generic over the CubeCL
//! runtime, and the helpers the backward launchers (`launch_backward.rs`)
//! share.
//!
//! Memory: besides its outputs, the forward pass allocates nothing but a
//! one-value stand-in when there are no ALiBi slopes; the backward pass adds
//! `delta` (`[batch, n_heads, seq]`). Every buffer is
//! therefore `O(batch * heads * seq * head_dim)` or `O(batch * heads * seq)`;
//! no `[seq, seq]` score matrix exists at any point. Only the tiled and
//! fragment kernels use shared memory (their tiles,
//! [`AttentionKernel::shared_bytes`] and
//! [`super::AttentionBackwardKernel::shared_bytes`] per cube).

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::choice::AttentionKernel;
use super::forward::attention_forward_kernel;
use super::fragment::{with_fragment_operand, CMMA_PLANE_SIZE};
use super::fragment_forward::attention_forward_fragment_kernel;
use super::mma_forward::attention_forward_mma_kernel;
use super::shape::{AttentionError, AttentionInputs, AttentionOptions, AttentionShape};
use super::tiled_forward::{attention_forward_tiled_kernel, TILED_UNITS};
use super::tiles::ROWS_PER_CUBE;
use crate::dtype::{with_storage, FloatDtype};

/// Result of [`attention_forward_typed`].
#[derive(Debug)]
pub struct AttentionForward {
    /// Attention output, `[batch, n_heads, seq, head_dim]`, in the launch's
    /// [`FloatDtype`].
    pub out: Handle,
    /// Natural-log log-sum-exp of each query row's scaled, biased, masked
    /// scores, `[batch, n_heads, seq]`, always `f32` (the backward pass
    /// recomputes `exp(score - lse)` from it: rounded to bf16, whose values
    /// near 10 are 1/16 apart, an `lse` would scale every probability of its
    /// row by up to 3%).
    pub lse: Handle,
}

/// [`attention_forward_typed`] on f32 tensors ([`FloatDtype::F32`]).
pub fn attention_forward<R: Runtime>(
    client: &ComputeClient<R>,
    shape: AttentionShape,
    options: AttentionOptions,
    inputs: AttentionInputs<'_>,
) -> Result<AttentionForward, AttentionError> {
    attention_forward_typed(client, FloatDtype::F32, shape, options, inputs)
}

/// FlashAttention forward: `out = softmax(scale * q k^T + bias + mask) v`
/// per `(batch, head)`, computed tile by tile with an online softmax, plus
/// the per-row log-sum-exp. See [`AttentionShape`] for the layouts and
/// [`AttentionInputs::alibi_slopes`] for the bias convention. Runs the
/// kernel [`AttentionKernel::for_call`] picks for the device, `dtype`,
/// `head_dim` and `options` (see [`attention_forward_with`]).
///
/// `q`, `k`, `v` and the output hold `dtype`; scores, the softmax and the
/// output accumulator are f32, the output rounded once to `dtype`; the
/// log-sum-exp is f32.
///
/// Errors when the shape is unsupported, a buffer size does not match it,
/// the scale is not positive and finite or the runtime cannot run `dtype`. The kernels run asynchronously; read the
/// outputs through `client`.
pub fn attention_forward_typed<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    shape: AttentionShape,
    options: AttentionOptions,
    inputs: AttentionInputs<'_>,
) -> Result<AttentionForward, AttentionError> {
    let kernel = AttentionKernel::for_call(client, shape.head_dim, dtype, options);
    attention_forward_with(client, kernel, dtype, shape, options, inputs)
}

/// [`attention_forward_typed`] with the forward kernel named by the caller
/// (the tests and `ferrotron bench kernels` run each). All kernels write
/// the same outputs; [`super::attention_backward_typed`] takes any's.
///
/// Errors as [`attention_forward_typed`], and when `kernel` has tiles it
/// is not compiled for or needs more shared memory than the device has,
/// or is the fragment or register kernel on matrix units that do not run
/// `dtype`.
pub fn attention_forward_with<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: AttentionKernel,
    dtype: FloatDtype,
    shape: AttentionShape,
    options: AttentionOptions,
    inputs: AttentionInputs<'_>,
) -> Result<AttentionForward, AttentionError> {
    check_dtype(client, dtype)?;
    shape.validate()?;
    inputs.check(&shape, dtype)?;
    kernel.check(&shape, client.properties().hardware.max_shared_memory_size)?;
    kernel.check_units(client, dtype)?;
    let scale = options.checked_scale(shape.head_dim)?;
    let query_tiles = grid_axis(client, shape.seq.div_ceil(kernel.rows_per_cube()), 0)?;
    let heads = grid_axis(client, shape.batch * shape.n_heads, 1)?;
    let cube_count = CubeCount::Static(query_tiles, heads, 1);

    let out = client.empty(shape.q_elems() * dtype.size_bytes());
    let lse = client.empty(shape.rows() * size_of::<f32>());
    let (slopes, alibi) = slopes_arg(client, &inputs, &shape);
    // The fragment and the register kernel take the same arguments.
    macro_rules! launch_on_planes {
        ($kernel:ident, $f:ty, $m:ty, $planes:expr, $keys:expr, $round:expr, $units:expr) => {
            // SAFETY: as for the tiled kernel: sizes checked above, rows
            // and keys past `seq` staged as zeros and never written; the
            // shared memory fits the device and the matrix units, when
            // used, run the operand type (checked above).
            unsafe {
                $kernel::launch_unchecked::<$f, $m, R>(
                    client,
                    cube_count,
                    CubeDim::new_2d(CMMA_PLANE_SIZE as u32, $planes as u32),
                    operand_vector(client, size_of::<$f>(), shape.head_dim),
                    array(inputs.q, shape.q_elems()),
                    array(inputs.k, shape.kv_elems()),
                    array(inputs.v, shape.kv_elems()),
                    slopes,
                    array(&out, shape.q_elems()),
                    array(&lse, shape.rows()),
                    shape.seq as u32,
                    shape.n_heads as u32,
                    shape.group() as u32,
                    scale,
                    shape.head_dim,
                    $planes,
                    $keys,
                    options.causal,
                    alibi,
                    $round,
                    $units,
                );
            }
        };
    }
    with_storage!(dtype, F, round_bf16, {
        match kernel {
            // SAFETY: every buffer holds the elements its `array` argument
            // states (checked above); the kernel clamps the rows it reads to
            // `seq - 1` and writes only rows below `seq`.
            AttentionKernel::Row => unsafe {
                attention_forward_kernel::launch_unchecked::<F, R>(
                    client,
                    cube_count,
                    CubeDim::new_1d(ROWS_PER_CUBE as u32),
                    array(inputs.q, shape.q_elems()),
                    array(inputs.k, shape.kv_elems()),
                    array(inputs.v, shape.kv_elems()),
                    slopes,
                    array(&out, shape.q_elems()),
                    array(&lse, shape.rows()),
                    shape.seq as u32,
                    shape.n_heads as u32,
                    shape.group() as u32,
                    scale,
                    shape.head_dim,
                    options.causal,
                    alibi,
                    round_bf16,
                );
            },
            // SAFETY: as for the row kernel: sizes checked above, rows read
            // clamped to `seq - 1`, only rows below `seq` written; the
            // shared memory fits the device (checked above).
            AttentionKernel::Tiled { tile } => unsafe {
                attention_forward_tiled_kernel::launch_unchecked::<F, R>(
                    client,
                    cube_count,
                    CubeDim::new_1d(TILED_UNITS as u32),
                    array(inputs.q, shape.q_elems()),
                    array(inputs.k, shape.kv_elems()),
                    array(inputs.v, shape.kv_elems()),
                    slopes,
                    array(&out, shape.q_elems()),
                    array(&lse, shape.rows()),
                    shape.seq as u32,
                    shape.n_heads as u32,
                    shape.group() as u32,
                    scale,
                    shape.head_dim,
                    tile,
                    options.causal,
                    alibi,
                    round_bf16,
                );
            },
            AttentionKernel::Fragment {
                planes,
                keys,
                matrix_units,
            } => with_fragment_operand!(dtype, matrix_units, M, {
                launch_on_planes!(
                    attention_forward_fragment_kernel,
                    F,
                    M,
                    planes,
                    keys,
                    round_bf16,
                    matrix_units
                )
            }),
            AttentionKernel::Registers {
                planes,
                keys,
                matrix_units,
            } => with_fragment_operand!(dtype, matrix_units, M, {
                launch_on_planes!(
                    attention_forward_mma_kernel,
                    F,
                    M,
                    planes,
                    keys,
                    round_bf16,
                    matrix_units
                )
            }),
        }
    });
    Ok(AttentionForward { out, lse })
}

/// Values per vector in which the fragment and register kernels read `q`,
/// `k`, `v` and `d_out` (of `elem_bytes` each): the widest load `client`
/// does well (16 bytes on CUDA) that divides `head_dim`, so that a vector
/// never straddles two rows.
pub(super) fn operand_vector<R: Runtime>(
    client: &ComputeClient<R>,
    elem_bytes: usize,
    head_dim: usize,
) -> usize {
    client
        .io_optimized_vector_sizes(elem_bytes)
        .find(|width| head_dim.is_multiple_of(*width))
        .unwrap_or(1)
}

/// Fails unless `client`'s runtime supports `dtype`.
pub(super) fn check_dtype<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: FloatDtype,
) -> Result<(), AttentionError> {
    dtype
        .check_supported(client)
        .map_err(|message| AttentionError::UnsupportedDtype { message })
}

/// An array argument over `handle` holding `elems` values. The launchers
/// checked every size against the shape before calling this.
pub(super) fn array<R: Runtime>(handle: &Handle, elems: usize) -> ArrayArg<R> {
    // SAFETY: `elems` is the number of values the handle holds (checked by
    // the launchers), so the binding does not overrun it.
    unsafe { ArrayArg::from_raw_parts(handle.clone(), elems) }
}

/// The slopes argument and the kernels' `alibi` flag. Without slopes the
/// kernels never read the argument (`alibi` is a compile-time `false`), but
/// every binding needs a buffer: a one-value buffer stands in.
pub(super) fn slopes_arg<R: Runtime>(
    client: &ComputeClient<R>,
    inputs: &AttentionInputs<'_>,
    shape: &AttentionShape,
) -> (ArrayArg<R>, bool) {
    match inputs.alibi_slopes {
        Some(slopes) => (array(slopes, shape.n_heads), true),
        None => {
            let unused = client.create_from_slice(f32::as_bytes(&[0.0]));
            (array(&unused, 1), false)
        }
    }
}

/// `cubes` as a launch-grid size along `axis`, checked against the device.
pub(super) fn grid_axis<R: Runtime>(
    client: &ComputeClient<R>,
    cubes: usize,
    axis: usize,
) -> Result<u32, AttentionError> {
    let (x, y, z) = client.properties().hardware.max_cube_count;
    let max = [x, y, z][axis];
    if cubes <= max as usize {
        Ok(cubes as u32)
    } else {
        Err(AttentionError::GridTooLarge { cubes, max })
    }
}
