//! Launcher-side checks shared by the fused ops: every launcher validates
//! its shapes against the byte sizes of the handles it is given before it
//! launches anything, and reports a mismatch (or an element type the
//! runtime cannot run) as a [`ShapeError`].

use crate::dtype::FloatDtype;
use cubecl::server::Handle;
use std::fmt;

/// A launcher was given shapes or buffers that do not agree.
///
/// `op` names the launcher (for example `"rms_norm_forward"`), `message`
/// says which argument is wrong and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeError {
    /// The launcher that rejected its arguments.
    pub op: &'static str,
    /// Which argument is wrong and what was expected.
    pub message: String,
}

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.op, self.message)
    }
}

impl std::error::Error for ShapeError {}

/// Fails unless `value` is at least 1.
pub(crate) fn nonzero(op: &'static str, name: &str, value: usize) -> Result<(), ShapeError> {
    if value == 0 {
        return Err(ShapeError {
            op,
            message: format!("{name} must be at least 1, got 0"),
        });
    }
    Ok(())
}

/// Fails unless `handle` holds at least `elems` elements of `elem_bytes`
/// bytes each. A larger handle is accepted: CubeCL's CUDA runtime rounds
/// the buffers of Burn's tensors up (a 192-value f32 weight sits in 1024
/// bytes), and every kernel reads and writes only the elements its shape
/// names.
pub(crate) fn elems(
    op: &'static str,
    name: &str,
    handle: &Handle,
    elems: usize,
    elem_bytes: usize,
) -> Result<(), ShapeError> {
    let bytes = handle.size_in_used();
    if bytes < (elems * elem_bytes) as u64 {
        return Err(ShapeError {
            op,
            message: format!(
                "{name} holds {bytes} bytes, expected {elems} elements of {elem_bytes} bytes = {} bytes",
                elems * elem_bytes
            ),
        });
    }
    Ok(())
}

/// Fails unless `handle` holds at least `elems` 4-byte elements (f32, u32).
pub(crate) fn elems_4b(
    op: &'static str,
    name: &str,
    handle: &Handle,
    count: usize,
) -> Result<(), ShapeError> {
    elems(op, name, handle, count, 4)
}

/// Fails unless `client`'s runtime supports `dtype`.
pub(crate) fn dtype<R: cubecl::Runtime>(
    op: &'static str,
    client: &cubecl::prelude::ComputeClient<R>,
    dtype: FloatDtype,
) -> Result<(), ShapeError> {
    dtype
        .check_supported(client)
        .map_err(|message| ShapeError { op, message })
}

/// Fails unless `value` fits the `u32` scalars the kernels take.
pub(crate) fn fits_u32(op: &'static str, name: &str, value: usize) -> Result<(), ShapeError> {
    if u32::try_from(value).is_err() {
        return Err(ShapeError {
            op,
            message: format!("{name} = {value} does not fit in u32"),
        });
    }
    Ok(())
}
