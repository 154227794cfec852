//! What a collective on device buffers sends: the element type on the
//! wire for a reduction precision (`--reduce-dtype`), and its bytes.

use burn::tensor::{DType, FloatDType};
use ferrotron_engine::precision::Precision;

use super::super::types::NcclDataType;

/// The NCCL element type that carries values reduced in `reduce`: f32,
/// or bf16 / fp16 as themselves, half the bytes on the wire. The values
/// are cast on the device before the collective and back after it, so a
/// reduction in bf16 rounds each rank's values, and NCCL rounds each
/// partial sum it forms, to bf16 (FSDP's `reduce_dtype` on NCCL alike).
pub fn wire_dtype(reduce: Precision) -> NcclDataType {
    match reduce {
        Precision::Fp32 => NcclDataType::F32,
        Precision::Bf16 => NcclDataType::Bf16,
        Precision::Fp16 => NcclDataType::F16,
    }
}

/// The Burn dtype of tensors sent as `dtype`.
pub fn tensor_dtype(dtype: NcclDataType) -> FloatDType {
    match dtype {
        NcclDataType::F32 => FloatDType::F32,
        NcclDataType::Bf16 => FloatDType::BF16,
        NcclDataType::F16 => FloatDType::F16,
    }
}

/// The precision that carries values of `dtype` as themselves: bf16 and
/// fp16 as 16-bit values, every other dtype in f32.
pub fn carried_in(dtype: DType) -> Precision {
    match dtype {
        DType::BF16 => Precision::Bf16,
        DType::F16 => Precision::Fp16,
        _ => Precision::Fp32,
    }
}

/// Bytes on the wire of `values` values reduced in `reduce`.
pub fn wire_bytes(values: usize, reduce: Precision) -> usize {
    values * wire_dtype(reduce).size_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_reduction_sends_half_the_bytes_of_f32() {
        assert_eq!(wire_dtype(Precision::Fp32), NcclDataType::F32);
        assert_eq!(wire_dtype(Precision::Bf16), NcclDataType::Bf16);
        assert_eq!(wire_dtype(Precision::Fp16), NcclDataType::F16);
        assert_eq!(wire_bytes(1000, Precision::Fp32), 4000);
        assert_eq!(wire_bytes(1000, Precision::Bf16), 2000);
        for d in [NcclDataType::F32, NcclDataType::Bf16, NcclDataType::F16] {
            let back = match tensor_dtype(d) {
                FloatDType::F32 => Precision::Fp32,
                FloatDType::BF16 => Precision::Bf16,
                FloatDType::F16 => Precision::Fp16,
                other => panic!("{other:?}"),
            };
            assert_eq!(wire_dtype(back), d);
        }
    }
}
