//! `ncclBfloat16` buffers: the double widens them to `f32`, runs the `f32`
//! collective, and rounds the result back to bfloat16 (nearest, ties to
//! even), as NCCL rounds each sum it forms. On two ranks that is NCCL's
//! result exactly: one sum per value, rounded once.

use crate::result::Outcome;

/// The `f32` of bfloat16 bits `b` (exact).
fn widen(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// `x` rounded to the nearest bfloat16, ties to even (NaN stays NaN).
fn narrow(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// Runs `collective(send, recv)` on `f32` copies of `send_len` bfloat16
/// values at `send` into `recv_len` values written back to `recv`.
///
/// # Safety
///
/// `send` valid for `send_len` values, `recv` for `recv_len` (they may
/// overlap: `send` is read before `recv` is written).
pub unsafe fn via_f32(
    send: *const u16,
    send_len: usize,
    recv: *mut u16,
    recv_len: usize,
    collective: impl FnOnce(*const f32, *mut f32) -> Outcome,
) -> Outcome {
    if send.is_null() || recv.is_null() {
        return Err(crate::result::INVALID_ARGUMENT);
    }
    // SAFETY: the caller's contract.
    let wide: Vec<f32> = unsafe { std::slice::from_raw_parts(send, send_len) }
        .iter()
        .map(|&b| widen(b))
        .collect();
    let mut out = vec![0f32; recv_len];
    collective(wide.as_ptr(), out.as_mut_ptr())?;
    // SAFETY: the caller's contract.
    let recv = unsafe { std::slice::from_raw_parts_mut(recv, recv_len) };
    for (r, x) in recv.iter_mut().zip(out) {
        *r = narrow(x);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrowing_rounds_to_nearest_even() {
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties to 1 (even).
        assert_eq!(narrow(1.0 + 1.0 / 256.0), 0x3f80);
        // Just above halfway goes up.
        assert_eq!(narrow(1.0 + 1.0 / 256.0 + 1.0 / 65536.0), 0x3f81);
        // 1 + 3 x 2^-8 is halfway between odd 0x3f81 and even 0x3f82.
        assert_eq!(narrow(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(widen(narrow(-2.5)), -2.5);
        assert!(widen(narrow(f32::NAN)).is_nan());
        assert_eq!(widen(narrow(f32::INFINITY)), f32::INFINITY);
    }
}
