//! Fused row normalisations over `[rows, hidden]` f32 (rows = tokens):
//! RMSNorm (Llama) and LayerNorm (GPT-2, BLOOM). A cube normalises 8 rows
//! with 32 units per row, accumulating in f32 through a fixed shared-memory
//! tree per row (no atomics, so results are bitwise reproducible). The forward saves per-row
//! statistics for the backward; the backward computes `dx` per row and the
//! parameter gradients with a second kernel in which each unit sums one
//! column over all rows, in row order.

pub mod layer;
pub mod rms;

use crate::check::{self, ShapeError};

/// Checks `rows` and `hidden` and that each named buffer holds the number of
/// f32 elements paired with it.
fn check_buffers(
    op: &'static str,
    rows: usize,
    hidden: usize,
    buffers: &[(&str, &cubecl::server::Handle, usize)],
) -> Result<(), ShapeError> {
    check::nonzero(op, "rows", rows)?;
    check::nonzero(op, "hidden", hidden)?;
    check::fits_u32(op, "rows * hidden", rows * hidden)?;
    for (name, handle, elems) in buffers {
        check::elems_4b(op, name, handle, *elems)?;
    }
    Ok(())
}
