//! Launchers of the attention kernels, generic over the CubeCL runtime.
//!
//! Memory: besides its outputs, the forward pass allocates nothing but a
//! one-value stand-in when there are no ALiBi slopes; the backward pass adds
//! `delta` (`[batch, n_heads, seq]`). Every buffer is
//! therefore `O(batch * heads * seq * head_dim)` or `O(batch * heads * seq)`;
//! no `[seq, seq]` score matrix exists at any point. Only the tiled forward
//! uses shared memory (its tiles, [`AttentionKernel::shared_bytes`] per
//! cube).

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::backward_kv::attention_backward_kv_kernel;
use super::backward_q::attention_backward_q_kernel;
use super::choice::AttentionKernel;
use super::cmma_forward::{attention_forward_cmma_kernel, CMMA_PLANES, CMMA_PLANE_SIZE, CMMA_ROWS};
use super::delta::attention_delta_kernel;
use super::forward::attention_forward_kernel;
use super::shape::{
    check_buffer, AttentionError, AttentionInputs, AttentionOptions, AttentionShape,
};
use super::tiled_forward::{attention_forward_tiled_kernel, TILED_UNITS};
use super::tiles::ROWS_PER_CUBE;
use crate::dtype::{with_storage, FloatDtype};

/// Runs `$body` with the type alias `$m` set to the 16-bit operand type of
/// the cmma kernel for `$dtype` (f16 for f16; bf16 for bf16 and
/// bf16-in-f32). Only reached for 16-bit types (`cmma_runs` refuses f32).
macro_rules! with_operand {
    ($dtype:expr, $m:ident, $body:expr) => {
        match $dtype {
            FloatDtype::F16 => {
                type $m = half::f16;
                $body
            }
            _ => {
                type $m = half::bf16;
                $body
            }
        }
    };
}

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

/// Result of [`attention_backward_typed`], in the launch's [`FloatDtype`].
#[derive(Debug)]
pub struct AttentionGradients {
    /// Gradient of the queries, `[batch, n_heads, seq, head_dim]`.
    pub dq: Handle,
    /// Gradient of the keys, `[batch, n_kv_heads, seq, head_dim]`, summed
    /// over the query heads that share each key/value head.
    pub dk: Handle,
    /// Gradient of the values, `[batch, n_kv_heads, seq, head_dim]`.
    pub dv: Handle,
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
/// kernel [`AttentionKernel::choose`] picks for the device and `head_dim`
/// (see [`attention_forward_with`]).
///
/// `q`, `k`, `v` and the output hold `dtype`; scores, the softmax and the
/// output accumulator are f32, the output rounded once to `dtype`; the
/// log-sum-exp is f32.
///
/// Errors when the shape is unsupported, a buffer size does not match it or
/// the runtime cannot run `dtype`. The kernels run asynchronously; read the
/// outputs through `client`.
pub fn attention_forward_typed<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    shape: AttentionShape,
    options: AttentionOptions,
    inputs: AttentionInputs<'_>,
) -> Result<AttentionForward, AttentionError> {
    let kernel = AttentionKernel::choose(client, shape.head_dim);
    attention_forward_with(client, kernel, dtype, shape, options, inputs)
}

/// [`attention_forward_typed`] with the forward kernel named by the caller
/// (the tests and `ferrotron bench kernels` run both). Both kernels write
/// the same outputs; [`attention_backward_typed`] takes either's.
///
/// Errors as [`attention_forward_typed`], and when `kernel` is tiled with a
/// tile size it is not compiled for or more shared memory than the device
/// has.
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
    if kernel == AttentionKernel::Cmma && !AttentionKernel::cmma_runs(client, shape.head_dim, dtype)
    {
        return Err(AttentionError::CmmaUnsupported {
            head_dim: shape.head_dim,
            dtype: dtype.name(),
        });
    }
    let rows_per_cube = match kernel {
        AttentionKernel::Row => ROWS_PER_CUBE,
        AttentionKernel::Tiled { tile } => tile,
        AttentionKernel::Cmma => CMMA_ROWS,
    };
    let query_tiles = grid_axis(client, shape.seq.div_ceil(rows_per_cube), 0)?;
    let heads = grid_axis(client, shape.batch * shape.n_heads, 1)?;
    let cube_count = CubeCount::Static(query_tiles, heads, 1);

    let out = client.empty(shape.q_elems() * dtype.size_bytes());
    let lse = client.empty(shape.rows() * size_of::<f32>());
    let (slopes, alibi) = slopes_arg(client, &inputs, &shape);
    let scale = options.scale_for(shape.head_dim);
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
            // SAFETY: as for the tiled kernel: sizes checked above, rows
            // and keys past `seq` staged as zeros and never written; the
            // device runs the kernel (`cmma_runs`, checked above).
            AttentionKernel::Cmma => with_operand!(dtype, M, unsafe {
                attention_forward_cmma_kernel::launch_unchecked::<F, M, R>(
                    client,
                    cube_count,
                    CubeDim::new_2d(CMMA_PLANE_SIZE as u32, CMMA_PLANES as u32),
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
            }),
        }
    });
    Ok(AttentionForward { out, lse })
}

/// [`attention_backward_typed`] on f32 tensors ([`FloatDtype::F32`]).
pub fn attention_backward<R: Runtime>(
    client: &ComputeClient<R>,
    shape: AttentionShape,
    options: AttentionOptions,
    inputs: AttentionInputs<'_>,
    out: &Handle,
    lse: &Handle,
    d_out: &Handle,
) -> Result<AttentionGradients, AttentionError> {
    attention_backward_typed(
        client,
        FloatDtype::F32,
        shape,
        options,
        inputs,
        out,
        lse,
        d_out,
    )
}

/// FlashAttention-2 backward: from the forward's inputs, its `out` and
/// `lse`, and the output gradient `d_out` (`[batch, n_heads, seq,
/// head_dim]`), computes `dq`, `dk`, `dv`. Three launches: `delta =
/// rowsum(d_out * out)`; dK/dV per key tile over all query tiles (and all
/// query heads of a key/value group); dQ per query tile over all key tiles.
/// The probabilities are recomputed from `lse`; no atomics, so the result is
/// deterministic.
///
/// `q`, `k`, `v`, `out`, `d_out` and the gradients hold `dtype`, `lse` is
/// f32 (as the forward wrote it); `delta` and every sum are f32, each
/// gradient rounded once to `dtype`.
///
/// Errors when the shape is unsupported, a buffer size does not match it or
/// the runtime cannot run `dtype`.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward_typed<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    shape: AttentionShape,
    options: AttentionOptions,
    inputs: AttentionInputs<'_>,
    out: &Handle,
    lse: &Handle,
    d_out: &Handle,
) -> Result<AttentionGradients, AttentionError> {
    check_dtype(client, dtype)?;
    shape.validate()?;
    inputs.check(&shape, dtype)?;
    let size = dtype.size_bytes();
    check_buffer("out", out, shape.q_elems(), size)?;
    check_buffer("lse", lse, shape.rows(), size_of::<f32>())?;
    check_buffer("d_out", d_out, shape.q_elems(), size)?;
    let tiles = grid_axis(client, shape.seq.div_ceil(ROWS_PER_CUBE), 0)?;
    let heads = grid_axis(client, shape.batch * shape.n_heads, 1)?;
    let kv_heads = grid_axis(client, shape.batch * shape.n_kv_heads, 1)?;
    let scale = options.scale_for(shape.head_dim);
    let cube_dim = CubeDim::new_1d(ROWS_PER_CUBE as u32);

    let delta = client.empty(shape.rows() * size_of::<f32>());
    let dk = client.empty(shape.kv_elems() * size);
    let dv = client.empty(shape.kv_elems() * size);
    let dq = client.empty(shape.q_elems() * size);
    with_storage!(dtype, F, round_bf16, {
        attention_delta_kernel::launch::<F, R>(
            client,
            CubeCount::Static(tiles, heads, 1),
            cube_dim,
            array(out, shape.q_elems()),
            array(d_out, shape.q_elems()),
            array(&delta, shape.rows()),
            shape.seq as u32,
            shape.head_dim,
            round_bf16,
        );

        let (slopes, alibi) = slopes_arg(client, &inputs, &shape);
        // SAFETY: as in `attention_forward_typed`: sizes checked above, rows
        // read clamped to `seq - 1`, only rows below `seq` written.
        unsafe {
            attention_backward_kv_kernel::launch_unchecked::<F, R>(
                client,
                CubeCount::Static(tiles, kv_heads, 1),
                cube_dim,
                array(inputs.q, shape.q_elems()),
                array(inputs.k, shape.kv_elems()),
                array(inputs.v, shape.kv_elems()),
                slopes,
                array(d_out, shape.q_elems()),
                array(lse, shape.rows()),
                array(&delta, shape.rows()),
                array(&dk, shape.kv_elems()),
                array(&dv, shape.kv_elems()),
                shape.seq as u32,
                shape.n_heads as u32,
                shape.group() as u32,
                scale,
                shape.head_dim,
                options.causal,
                alibi,
                round_bf16,
            );
        }

        let (slopes, alibi) = slopes_arg(client, &inputs, &shape);
        // SAFETY: as in `attention_forward_typed`: sizes checked above, rows
        // read clamped to `seq - 1`, only rows below `seq` written.
        unsafe {
            attention_backward_q_kernel::launch_unchecked::<F, R>(
                client,
                CubeCount::Static(tiles, heads, 1),
                cube_dim,
                array(inputs.q, shape.q_elems()),
                array(inputs.k, shape.kv_elems()),
                array(inputs.v, shape.kv_elems()),
                slopes,
                array(d_out, shape.q_elems()),
                array(lse, shape.rows()),
                array(&delta, shape.rows()),
                array(&dq, shape.q_elems()),
                shape.seq as u32,
                shape.n_heads as u32,
                shape.group() as u32,
                scale,
                shape.head_dim,
                options.causal,
                alibi,
                round_bf16,
            );
        }
    });
    Ok(AttentionGradients { dq, dk, dv })
}

/// Fails unless `client`'s runtime supports `dtype`.
fn check_dtype<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: FloatDtype,
) -> Result<(), AttentionError> {
    dtype
        .check_supported(client)
        .map_err(|message| AttentionError::UnsupportedDtype { message })
}

/// An array argument over `handle` holding `elems` values. The launchers
/// checked every size against the shape before calling this.
fn array<R: Runtime>(handle: &Handle, elems: usize) -> ArrayArg<R> {
    // SAFETY: `elems` is the number of values the handle holds (checked by
    // the launchers), so the binding does not overrun it.
    unsafe { ArrayArg::from_raw_parts(handle.clone(), elems) }
}

/// The slopes argument and the kernels' `alibi` flag. Without slopes the
/// kernels never read the argument (`alibi` is a compile-time `false`), but
/// every binding needs a buffer: a one-value buffer stands in.
fn slopes_arg<R: Runtime>(
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
fn grid_axis<R: Runtime>(
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
