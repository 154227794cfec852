//! Launchers of the attention backward kernels, generic over the CubeCL
//! runtime: `delta = rowsum(d_out * out)`, then the dK/dV and the dQ
//! kernels of an [`AttentionBackwardKernel`] (row, tiled, fragment or
//! register);
//! [`attention_backward_from_delta`] runs the second part alone.

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::backward_choice::AttentionBackwardKernel;
use super::backward_kv::attention_backward_kv_kernel;
use super::backward_q::attention_backward_q_kernel;
use super::delta::attention_delta_kernel;
use super::fragment::{with_fragment_operand, CMMA_PLANE_SIZE};
use super::fragment_backward_kv::attention_backward_kv_fragment_kernel;
use super::fragment_backward_q::attention_backward_q_fragment_kernel;
use super::launch::{array, check_dtype, grid_axis, operand_vector, slopes_arg};
use super::mma_backward_kv::attention_backward_kv_mma_kernel;
use super::mma_backward_q::attention_backward_q_mma_kernel;
use super::shape::{
    check_buffer, AttentionError, AttentionInputs, AttentionOptions, AttentionShape,
};
use super::tiled_backward_kv::{attention_backward_kv_tiled_kernel, BACKWARD_UNITS};
use super::tiled_backward_q::attention_backward_q_tiled_kernel;
use super::tiles::ROWS_PER_CUBE;
use crate::dtype::{with_storage, FloatDtype};

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
/// deterministic. Runs the kernels [`AttentionBackwardKernel::for_call`]
/// picks for the device, `dtype`, `head_dim` and `options` (see
/// [`attention_backward_with`]).
///
/// `q`, `k`, `v`, `out`, `d_out` and the gradients hold `dtype`, `lse` is
/// f32 (as the forward wrote it); `delta` and every sum are f32, each
/// gradient rounded once to `dtype`.
///
/// Errors when the shape is unsupported, a buffer size does not match it,
/// the scale is not positive and finite or the runtime cannot run `dtype`.
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
    let kernel = AttentionBackwardKernel::for_call(client, shape.head_dim, dtype, options);
    attention_backward_with(
        client, kernel, dtype, shape, options, inputs, out, lse, d_out,
    )
}

/// [`attention_backward_typed`] with the backward kernels named by the
/// caller (the tests and `ferrotron bench kernels` run each). All give the
/// same gradients within f32 rounding, the fragment kernels on the matrix
/// units within the rounding of the probabilities and their gradient to
/// the 16-bit type.
///
/// Errors as [`attention_backward_typed`], and when `kernel` is tiled or
/// fragment with tiles it is not compiled for or more shared memory than
/// the device has, fragment at a head dimension it does not run, or
/// fragment on the matrix units where they do not run `dtype`.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward_with<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: AttentionBackwardKernel,
    dtype: FloatDtype,
    shape: AttentionShape,
    options: AttentionOptions,
    inputs: AttentionInputs<'_>,
    out: &Handle,
    lse: &Handle,
    d_out: &Handle,
) -> Result<AttentionGradients, AttentionError> {
    check_launch(client, kernel, dtype, shape, &inputs)?;
    options.checked_scale(shape.head_dim)?;
    let size = dtype.size_bytes();
    check_buffer("out", out, shape.q_elems(), size)?;
    check_buffer("d_out", d_out, shape.q_elems(), size)?;
    let delta_tiles = grid_axis(client, shape.seq.div_ceil(ROWS_PER_CUBE), 0)?;
    let heads = grid_axis(client, shape.batch * shape.n_heads, 1)?;
    let delta = client.empty(shape.rows() * size_of::<f32>());
    with_storage!(dtype, F, round_bf16, {
        attention_delta_kernel::launch::<F, R>(
            client,
            CubeCount::Static(delta_tiles, heads, 1),
            CubeDim::new_1d(ROWS_PER_CUBE as u32),
            array(out, shape.q_elems()),
            array(d_out, shape.q_elems()),
            array(&delta, shape.rows()),
            shape.seq as u32,
            shape.head_dim,
            round_bf16,
        );
    });
    attention_backward_from_delta(
        client, kernel, dtype, shape, options, inputs, lse, &delta, d_out,
    )
}

/// The dK/dV and dQ launches of [`attention_backward_with`] given `delta =
/// rowsum(d_out * out)` `[batch, n_heads, seq]` (f32) instead of `out`:
/// for a caller whose rows' softmax runs over more keys than this launch
/// sees (ring attention's blocks, where `lse` and `delta` are those of
/// the whole attention and the gradients this block's share of it).
///
/// Errors as [`attention_backward_with`].
#[allow(clippy::too_many_arguments)]
pub fn attention_backward_from_delta<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: AttentionBackwardKernel,
    dtype: FloatDtype,
    shape: AttentionShape,
    options: AttentionOptions,
    inputs: AttentionInputs<'_>,
    lse: &Handle,
    delta: &Handle,
    d_out: &Handle,
) -> Result<AttentionGradients, AttentionError> {
    check_launch(client, kernel, dtype, shape, &inputs)?;
    let scale = options.checked_scale(shape.head_dim)?;
    let size = dtype.size_bytes();
    check_buffer("lse", lse, shape.rows(), size_of::<f32>())?;
    check_buffer("delta", delta, shape.rows(), size_of::<f32>())?;
    check_buffer("d_out", d_out, shape.q_elems(), size)?;
    let rows_per_cube = match kernel {
        AttentionBackwardKernel::Row => ROWS_PER_CUBE,
        _ => kernel.outer_rows(),
    };
    let grid = Grid {
        tiles: grid_axis(client, shape.seq.div_ceil(rows_per_cube), 0)?,
        heads: grid_axis(client, shape.batch * shape.n_heads, 1)?,
        kv_heads: grid_axis(client, shape.batch * shape.n_kv_heads, 1)?,
    };
    let grads = AttentionGradients {
        dq: client.empty(shape.q_elems() * size),
        dk: client.empty(shape.kv_elems() * size),
        dv: client.empty(shape.kv_elems() * size),
    };
    let launch = Launch {
        client,
        shape,
        scale,
        causal: options.causal,
        inputs,
        d_out,
        lse,
        delta,
        grid,
    };
    with_storage!(dtype, F, round_bf16, {
        match kernel {
            AttentionBackwardKernel::Row => launch.row::<F>(&grads, round_bf16),
            AttentionBackwardKernel::Tiled { outer, inner } => {
                launch.tiled::<F>(&grads, outer, inner, round_bf16)
            }
            AttentionBackwardKernel::Fragment {
                planes,
                inner,
                matrix_units,
            } => with_fragment_operand!(
                dtype,
                matrix_units,
                M,
                launch.on_planes::<F, M>(&grads, false, planes, inner, round_bf16, matrix_units)
            ),
            AttentionBackwardKernel::Registers {
                planes,
                inner,
                matrix_units,
            } => with_fragment_operand!(
                dtype,
                matrix_units,
                M,
                launch.on_planes::<F, M>(&grads, true, planes, inner, round_bf16, matrix_units)
            ),
        }
    });
    Ok(grads)
}

/// What both backward launchers check before launching anything: the
/// runtime runs `dtype`, the shape is supported, the inputs match it, and
/// `kernel` fits the device (its tiles, shared memory and, for fragment
/// and register kernels on the matrix units, `dtype` there).
fn check_launch<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: AttentionBackwardKernel,
    dtype: FloatDtype,
    shape: AttentionShape,
    inputs: &AttentionInputs<'_>,
) -> Result<(), AttentionError> {
    check_dtype(client, dtype)?;
    shape.validate()?;
    inputs.check(&shape, dtype)?;
    kernel.check(&shape, client.properties().hardware.max_shared_memory_size)?;
    let run = match kernel {
        AttentionBackwardKernel::Fragment {
            matrix_units: true, ..
        } => AttentionBackwardKernel::matrix_units_run(client, dtype),
        AttentionBackwardKernel::Registers {
            matrix_units: true, ..
        } => AttentionBackwardKernel::mma_runs(client, dtype),
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

/// Cube counts of the backward launches, checked against the device.
#[derive(Clone, Copy)]
struct Grid {
    /// Row tiles of the dK/dV and dQ kernels.
    tiles: u32,
    /// `batch * n_heads`.
    heads: u32,
    /// `batch * n_kv_heads`.
    kv_heads: u32,
}

/// What the dK/dV and dQ launches share; every size was checked by
/// [`attention_backward_with`].
struct Launch<'a, R: Runtime> {
    client: &'a ComputeClient<R>,
    shape: AttentionShape,
    scale: f32,
    causal: bool,
    inputs: AttentionInputs<'a>,
    d_out: &'a Handle,
    lse: &'a Handle,
    delta: &'a Handle,
    grid: Grid,
}

impl<R: Runtime> Launch<'_, R> {
    /// The row kernels: dK/dV per key row, dQ per query row.
    fn row<F: Float>(&self, grads: &AttentionGradients, round_bf16: bool) {
        let (s, client, grid) = (self.shape, self.client, self.grid);
        let cube_dim = CubeDim::new_1d(ROWS_PER_CUBE as u32);
        let (slopes, alibi) = slopes_arg(client, &self.inputs, &s);
        // SAFETY: as in `attention_forward_typed`: sizes checked by the
        // caller, rows read clamped to `seq - 1`, only rows below `seq`
        // written.
        unsafe {
            attention_backward_kv_kernel::launch_unchecked::<F, R>(
                client,
                CubeCount::Static(grid.tiles, grid.kv_heads, 1),
                cube_dim,
                array(self.inputs.q, s.q_elems()),
                array(self.inputs.k, s.kv_elems()),
                array(self.inputs.v, s.kv_elems()),
                slopes,
                array(self.d_out, s.q_elems()),
                array(self.lse, s.rows()),
                array(self.delta, s.rows()),
                array(&grads.dk, s.kv_elems()),
                array(&grads.dv, s.kv_elems()),
                s.seq as u32,
                s.n_heads as u32,
                s.group() as u32,
                self.scale,
                s.head_dim,
                self.causal,
                alibi,
                round_bf16,
            );
        }
        let (slopes, alibi) = slopes_arg(client, &self.inputs, &s);
        // SAFETY: as above.
        unsafe {
            attention_backward_q_kernel::launch_unchecked::<F, R>(
                client,
                CubeCount::Static(grid.tiles, grid.heads, 1),
                cube_dim,
                array(self.inputs.q, s.q_elems()),
                array(self.inputs.k, s.kv_elems()),
                array(self.inputs.v, s.kv_elems()),
                slopes,
                array(self.d_out, s.q_elems()),
                array(self.lse, s.rows()),
                array(self.delta, s.rows()),
                array(&grads.dq, s.q_elems()),
                s.seq as u32,
                s.n_heads as u32,
                s.group() as u32,
                self.scale,
                s.head_dim,
                self.causal,
                alibi,
                round_bf16,
            );
        }
    }

    /// The tiled kernels with `outer` rows per cube and `inner` rows of the
    /// other side per step.
    fn tiled<F: Float>(
        &self,
        grads: &AttentionGradients,
        outer: usize,
        inner: usize,
        round_bf16: bool,
    ) {
        let (s, client, grid) = (self.shape, self.client, self.grid);
        let cube_dim = CubeDim::new_1d(BACKWARD_UNITS as u32);
        let (slopes, alibi) = slopes_arg(client, &self.inputs, &s);
        // SAFETY: sizes checked by the caller, rows read clamped to `seq -
        // 1`, only rows below `seq` written; the shared memory fits the
        // device (`AttentionBackwardKernel::check`).
        unsafe {
            attention_backward_kv_tiled_kernel::launch_unchecked::<F, R>(
                client,
                CubeCount::Static(grid.tiles, grid.kv_heads, 1),
                cube_dim,
                array(self.inputs.q, s.q_elems()),
                array(self.inputs.k, s.kv_elems()),
                array(self.inputs.v, s.kv_elems()),
                slopes,
                array(self.d_out, s.q_elems()),
                array(self.lse, s.rows()),
                array(self.delta, s.rows()),
                array(&grads.dk, s.kv_elems()),
                array(&grads.dv, s.kv_elems()),
                s.seq as u32,
                s.n_heads as u32,
                s.group() as u32,
                self.scale,
                s.head_dim,
                outer,
                inner,
                self.causal,
                alibi,
                round_bf16,
            );
        }
        let (slopes, alibi) = slopes_arg(client, &self.inputs, &s);
        // SAFETY: as above.
        unsafe {
            attention_backward_q_tiled_kernel::launch_unchecked::<F, R>(
                client,
                CubeCount::Static(grid.tiles, grid.heads, 1),
                cube_dim,
                array(self.inputs.q, s.q_elems()),
                array(self.inputs.k, s.kv_elems()),
                array(self.inputs.v, s.kv_elems()),
                slopes,
                array(self.d_out, s.q_elems()),
                array(self.lse, s.rows()),
                array(self.delta, s.rows()),
                array(&grads.dq, s.q_elems()),
                s.seq as u32,
                s.n_heads as u32,
                s.group() as u32,
                self.scale,
                s.head_dim,
                outer,
                inner,
                self.causal,
                alibi,
                round_bf16,
            );
        }
    }

    /// The fragment kernels (or, with `registers`, the register kernels)
    /// with `planes` planes per cube (`16 * planes` rows), `inner` rows of
    /// the other side per step, operands `M`, and the products on the
    /// matrix units or on plain units. Both pairs take the same arguments.
    fn on_planes<F: Float, M: Float>(
        &self,
        grads: &AttentionGradients,
        registers: bool,
        planes: usize,
        inner: usize,
        round_bf16: bool,
        matrix_units: bool,
    ) {
        let (s, client, grid) = (self.shape, self.client, self.grid);
        let cube_dim = CubeDim::new_2d(CMMA_PLANE_SIZE as u32, planes as u32);
        let kv_count = CubeCount::Static(grid.tiles, grid.kv_heads, 1);
        let q_count = CubeCount::Static(grid.tiles, grid.heads, 1);
        macro_rules! launch {
            ($kernel:ident, $count:expr, $($grads:expr),+) => {{
                let (slopes, alibi) = slopes_arg(client, &self.inputs, &s);
                // SAFETY: sizes checked by the caller, rows past `seq`
                // staged as zeros and never written; the shared memory
                // fits the device and the matrix units, when used, run `M`
                // (`AttentionBackwardKernel::check`, `matrix_units_run`,
                // `mma_runs`).
                unsafe {
                    $kernel::launch_unchecked::<F, M, R>(
                        client,
                        $count,
                        cube_dim,
                        operand_vector(client, size_of::<F>(), s.head_dim),
                        array(self.inputs.q, s.q_elems()),
                        array(self.inputs.k, s.kv_elems()),
                        array(self.inputs.v, s.kv_elems()),
                        slopes,
                        array(self.d_out, s.q_elems()),
                        array(self.lse, s.rows()),
                        array(self.delta, s.rows()),
                        $($grads,)+
                        s.seq as u32,
                        s.n_heads as u32,
                        s.group() as u32,
                        self.scale,
                        s.head_dim,
                        planes,
                        inner,
                        self.causal,
                        alibi,
                        round_bf16,
                        matrix_units,
                    );
                }
            }};
        }
        let (dk, dv) = (&grads.dk, &grads.dv);
        let kv = |h| array(h, s.kv_elems());
        if registers {
            launch!(attention_backward_kv_mma_kernel, kv_count, kv(dk), kv(dv));
            launch!(
                attention_backward_q_mma_kernel,
                q_count,
                array(&grads.dq, s.q_elems())
            );
        } else {
            launch!(
                attention_backward_kv_fragment_kernel,
                kv_count,
                kv(dk),
                kv(dv)
            );
            launch!(
                attention_backward_q_fragment_kernel,
                q_count,
                array(&grads.dq, s.q_elems())
            );
        }
    }
}
