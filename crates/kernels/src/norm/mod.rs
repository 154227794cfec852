//! Fused row normalisations over `[rows, hidden]` (rows = tokens): RMSNorm
//! (Llama) and LayerNorm (GPT-2, BLOOM). Inputs, outputs and parameters in
//! f32, f16 or bf16 ([`FloatDtype`]); the saved statistics (`mean`,
//! `rstd`) always f32. A cube normalises 8 rows with 32 units per row,
//! accumulating in f32 through a fixed shared-memory tree per row (no
//! atomics, so results are bitwise reproducible). The forward saves per-row
//! statistics for the backward; the backward computes `dx` per row and the
//! parameter gradients in two passes over chunks of rows and tiles of
//! columns, in an order fixed by the shapes (`crate::column_sums`).

pub mod layer;
pub mod rms;

use crate::check::{self, ShapeError};
use crate::dtype::FloatDtype;
use crate::reduce::NORM_ROWS_PER_CUBE;
use cubecl::prelude::*;
use cubecl::server::Handle;

/// Checks `dtype`, `rows` and `hidden`, that each buffer of `typed` holds
/// the number of `dtype` elements paired with it and each buffer of `f32s`
/// that number of f32.
fn check_buffers<R: Runtime>(
    op: &'static str,
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    rows: usize,
    hidden: usize,
    typed: &[(&str, &Handle, usize)],
    f32s: &[(&str, &Handle, usize)],
) -> Result<(), ShapeError> {
    check::dtype(op, client, dtype)?;
    check::nonzero(op, "rows", rows)?;
    check::nonzero(op, "hidden", hidden)?;
    check::fits_u32(op, "rows * hidden", rows * hidden)?;
    for (name, handle, elems) in typed {
        check::elems(op, name, handle, *elems, dtype.size_bytes())?;
    }
    for (name, handle, elems) in f32s {
        check::elems_4b(op, name, handle, *elems)?;
    }
    Ok(())
}

/// The launch grid of the row kernels: one cube per `NORM_ROWS_PER_CUBE`
/// rows.
fn row_cubes<R: Runtime>(client: &ComputeClient<R>, rows: usize) -> CubeCount {
    cubecl::calculate_cube_count_elemwise(
        client,
        rows.div_ceil(NORM_ROWS_PER_CUBE as usize),
        CubeDim::new_1d(1),
    )
}
