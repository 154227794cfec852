//! Element types of the tensors the kernels read and write, and the
//! in-kernel conversions between them and the f32 the kernels compute in.
//!
//! Every kernel is one `#[cube]` source generic over its storage type `F`
//! (f32, f16 or bf16). It loads each element and converts it to f32,
//! accumulates in f32 (sums, dot products, online softmax, shared-memory
//! trees), and converts once when it stores a result. Buffers that carry
//! numerics a 16-bit type would spoil stay f32 whatever the storage type:
//! attention's log-sum-exp, the norms' saved statistics, the losses of
//! cross-entropy, RoPE's inverse frequencies and ALiBi's slopes (each
//! launcher's documentation says which of its buffers are which).
//!
//! [`FloatDtype::Bf16InF32`] is bf16 for runtimes whose shader language has
//! no bf16 type (wgpu: WGSL, and so Mesa's lavapipe): every value sits in a
//! 32-bit word as the f32 of equal value, and the kernel rounds each value it
//! loads and each result it stores to the nearest bf16 (ties to even), as a
//! bf16 load and store would. Same numerics as [`FloatDtype::Bf16`], twice
//! the memory.

use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::*;

/// The element type of a kernel's inputs and outputs (its f32 buffers
/// aside). Accumulation is f32 for every variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FloatDtype {
    /// IEEE binary32, 4 bytes.
    F32,
    /// IEEE binary16, 2 bytes. Needs shader f16 (`SHADER_F16` on wgpu,
    /// which Mesa's lavapipe has; native on CUDA and HIP).
    F16,
    /// bfloat16, 2 bytes. Native on CUDA and HIP; WGSL has no bf16, so the
    /// wgpu runtime refuses it (use [`FloatDtype::Bf16InF32`] there).
    Bf16,
    /// bf16 values carried one per 32-bit word (4 bytes per element), each
    /// load and store rounded to bf16 inside the kernel; for runtimes
    /// without a bf16 type. Same results as [`FloatDtype::Bf16`].
    Bf16InF32,
}

impl FloatDtype {
    /// Bytes per element in device memory.
    pub fn size_bytes(self) -> usize {
        match self {
            FloatDtype::F32 | FloatDtype::Bf16InF32 => 4,
            FloatDtype::F16 | FloatDtype::Bf16 => 2,
        }
    }

    /// Unit roundoff of the values stored (half the distance from 1 to the
    /// next value): 2^-24 for f32, 2^-11 for f16, 2^-8 for bf16.
    pub fn unit_roundoff(self) -> f64 {
        match self {
            FloatDtype::F32 => 2f64.powi(-24),
            FloatDtype::F16 => 2f64.powi(-11),
            FloatDtype::Bf16 | FloatDtype::Bf16InF32 => 2f64.powi(-8),
        }
    }

    /// Short name used in error messages: `f32`, `f16`, `bf16`,
    /// `bf16-in-f32`.
    pub fn name(self) -> &'static str {
        match self {
            FloatDtype::F32 => "f32",
            FloatDtype::F16 => "f16",
            FloatDtype::Bf16 => "bf16",
            FloatDtype::Bf16InF32 => "bf16-in-f32",
        }
    }

    /// The storage type of a tensor of CubeCL element type `elem`: `F32`,
    /// `F16` or `Bf16`; `None` for any other type. A Burn `CubeTensor`
    /// gives its element type as `ElemType::from(tensor.dtype)`.
    pub fn from_elem_type(elem: ElemType) -> Option<FloatDtype> {
        match elem {
            ElemType::Float(FloatKind::F32) => Some(FloatDtype::F32),
            ElemType::Float(FloatKind::F16) => Some(FloatDtype::F16),
            ElemType::Float(FloatKind::BF16) => Some(FloatDtype::Bf16),
            _ => None,
        }
    }

    /// The CubeCL element type the kernels are instantiated with.
    fn elem_type(self) -> ElemType {
        match self {
            FloatDtype::F32 | FloatDtype::Bf16InF32 => ElemType::Float(FloatKind::F32),
            FloatDtype::F16 => ElemType::Float(FloatKind::F16),
            FloatDtype::Bf16 => ElemType::Float(FloatKind::BF16),
        }
    }

    /// Whether `client`'s runtime can run the kernels on this type (it can
    /// store it in buffers and convert it to and from f32).
    pub fn is_supported<R: Runtime>(self, client: &ComputeClient<R>) -> bool {
        client.properties().supports_type(self.elem_type())
    }

    /// `Ok` when [`FloatDtype::is_supported`], else a message naming the
    /// type and the runtime's compiler.
    pub(crate) fn check_supported<R: Runtime>(
        self,
        client: &ComputeClient<R>,
    ) -> Result<(), String> {
        if self.is_supported(client) {
            return Ok(());
        }
        let hint = match self {
            FloatDtype::Bf16 => "; bf16-in-f32 (FloatDtype::Bf16InF32) runs bf16 on it",
            _ => "",
        };
        Err(format!(
            "dtype {} is not supported by this runtime ({}){hint}",
            self.name(),
            R::name(client)
        ))
    }
}

/// Runs `$body` with the type alias `$f` set to the storage type of `$dtype`
/// and the boolean `$round` set to whether the kernel must round to bf16
/// (only for [`FloatDtype::Bf16InF32`]).
macro_rules! with_storage {
    ($dtype:expr, $f:ident, $round:ident, $body:expr) => {
        match $dtype {
            $crate::dtype::FloatDtype::F32 => {
                type $f = f32;
                let $round = false;
                $body
            }
            $crate::dtype::FloatDtype::F16 => {
                type $f = half::f16;
                let $round = false;
                $body
            }
            $crate::dtype::FloatDtype::Bf16 => {
                type $f = half::bf16;
                let $round = false;
                $body
            }
            $crate::dtype::FloatDtype::Bf16InF32 => {
                type $f = f32;
                let $round = true;
                $body
            }
        }
    };
}
pub(crate) use with_storage;

/// `value` rounded to the nearest bf16 (ties to even), as f32. NaN stays NaN.
#[cube]
fn round_to_bf16(value: f32) -> f32 {
    let bits = u32::reinterpret(value);
    let rounded = (bits + 0x7FFFu32 + ((bits >> 16u32) & 1u32)) & 0xFFFF_0000u32;
    select(value.is_nan(), value, f32::reinterpret(rounded))
}

/// Loads a stored value as f32; with `round_bf16` (storage f32 carrying
/// bf16) it is first rounded to bf16, as a bf16 load would see it.
#[cube]
pub(crate) fn load<F: Float>(value: F, #[comptime] round_bf16: bool) -> f32 {
    let v = f32::cast_from(value);
    if round_bf16 {
        round_to_bf16(v)
    } else {
        v
    }
}

/// Converts an f32 result to the storage type; with `round_bf16` it is
/// rounded to bf16 first (the value a bf16 store would keep).
#[cube]
pub(crate) fn store<F: Float>(value: f32, #[comptime] round_bf16: bool) -> F {
    if round_bf16 {
        F::cast_from(round_to_bf16(value))
    } else {
        F::cast_from(value)
    }
}

/// [`round_to_bf16`] on each lane.
#[cube]
fn round_vector_to_bf16<N: Size>(value: Vector<f32, N>) -> Vector<f32, N> {
    let bits = Vector::<u32, N>::reinterpret(value);
    let rounded =
        (bits + Vector::new(0x7FFFu32) + ((bits >> Vector::new(16u32)) & Vector::new(1u32)))
            & Vector::new(0xFFFF_0000u32);
    select_many(
        value.equal(value),
        Vector::<f32, N>::reinterpret(rounded),
        value,
    )
}

/// [`load`] on each lane of a vector.
#[cube]
pub(crate) fn load_vector<F: Float, N: Size>(
    value: Vector<F, N>,
    #[comptime] round_bf16: bool,
) -> Vector<f32, N> {
    let v = Vector::<f32, N>::cast_from(value);
    if round_bf16 {
        round_vector_to_bf16::<N>(v)
    } else {
        v
    }
}

/// [`store`] on each lane of a vector.
#[cube]
pub(crate) fn store_vector<F: Float, N: Size>(
    value: Vector<f32, N>,
    #[comptime] round_bf16: bool,
) -> Vector<F, N> {
    if round_bf16 {
        Vector::<F, N>::cast_from(round_vector_to_bf16::<N>(value))
    } else {
        Vector::<F, N>::cast_from(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_roundoff_is_half_the_machine_epsilon() {
        assert_eq!(
            FloatDtype::F32.unit_roundoff(),
            f64::from(f32::EPSILON) / 2.0
        );
        assert_eq!(
            FloatDtype::F16.unit_roundoff(),
            half::f16::EPSILON.to_f64() / 2.0
        );
        for bf16 in [FloatDtype::Bf16, FloatDtype::Bf16InF32] {
            assert_eq!(bf16.unit_roundoff(), half::bf16::EPSILON.to_f64() / 2.0);
        }
    }

    #[test]
    fn element_types_map_to_storage_types() {
        for dtype in [FloatDtype::F32, FloatDtype::F16, FloatDtype::Bf16] {
            assert_eq!(FloatDtype::from_elem_type(dtype.elem_type()), Some(dtype));
        }
        assert_eq!(
            FloatDtype::from_elem_type(ElemType::Float(FloatKind::F64)),
            None
        );
        assert_eq!(FloatDtype::Bf16.size_bytes(), 2);
        assert_eq!(FloatDtype::Bf16InF32.size_bytes(), 4);
    }
}
