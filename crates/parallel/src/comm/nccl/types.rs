//! The NCCL C enums this binding uses, with their values from `nccl.h`
//! (identical in RCCL's `rccl.h`).

use std::ffi::c_int;

/// Element type of a device buffer (`ncclDataType_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NcclDataType {
    /// IEEE binary32, 4 bytes (`ncclFloat32` = 7).
    F32,
    /// IEEE binary16, 2 bytes (`ncclFloat16` = 6).
    F16,
    /// bfloat16, 2 bytes (`ncclBfloat16` = 9; NCCL >= 2.10; RCCL has it too).
    Bf16,
}

impl NcclDataType {
    /// The `ncclDataType_t` value passed to the C API.
    pub fn raw(self) -> c_int {
        match self {
            NcclDataType::F16 => 6,
            NcclDataType::F32 => 7,
            NcclDataType::Bf16 => 9,
        }
    }

    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            NcclDataType::F32 => 4,
            NcclDataType::F16 | NcclDataType::Bf16 => 2,
        }
    }
}

/// Element-wise reduction of a collective (`ncclRedOp_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NcclReduceOp {
    /// Sum over ranks (`ncclSum` = 0).
    Sum,
    /// Product over ranks (`ncclProd` = 1).
    Prod,
    /// Maximum over ranks (`ncclMax` = 2).
    Max,
    /// Minimum over ranks (`ncclMin` = 3).
    Min,
    /// Sum divided by the number of ranks (`ncclAvg` = 4; NCCL >= 2.10).
    Avg,
}

impl NcclReduceOp {
    /// The `ncclRedOp_t` value passed to the C API.
    pub fn raw(self) -> c_int {
        match self {
            NcclReduceOp::Sum => 0,
            NcclReduceOp::Prod => 1,
            NcclReduceOp::Max => 2,
            NcclReduceOp::Min => 3,
            NcclReduceOp::Avg => 4,
        }
    }
}

/// `ncclSuccess`: the only `ncclResult_t` that is not an error.
pub(crate) const NCCL_SUCCESS: c_int = 0;

/// The C name of an `ncclResult_t` value (`ncclSystemError` for 2), or
/// `"unknown ncclResult_t"` for a value this binding does not know (a newer
/// library may add codes).
pub fn result_name(code: c_int) -> &'static str {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        8 => "ncclTimeout",
        _ => "unknown ncclResult_t",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_codes_have_their_nccl_h_names() {
        assert_eq!(result_name(NCCL_SUCCESS), "ncclSuccess");
        assert_eq!(result_name(1), "ncclUnhandledCudaError");
        assert_eq!(result_name(2), "ncclSystemError");
        assert_eq!(result_name(3), "ncclInternalError");
        assert_eq!(result_name(4), "ncclInvalidArgument");
        assert_eq!(result_name(5), "ncclInvalidUsage");
        assert_eq!(result_name(6), "ncclRemoteError");
        assert_eq!(result_name(7), "ncclInProgress");
        assert_eq!(result_name(8), "ncclTimeout");
        assert_eq!(result_name(9), "unknown ncclResult_t");
        assert_eq!(result_name(-1), "unknown ncclResult_t");
    }

    #[test]
    fn dtype_and_op_values_match_nccl_h() {
        assert_eq!(
            [NcclDataType::F16, NcclDataType::F32, NcclDataType::Bf16].map(NcclDataType::raw),
            [6, 7, 9]
        );
        assert_eq!(
            [NcclDataType::F16, NcclDataType::F32, NcclDataType::Bf16]
                .map(NcclDataType::size_bytes),
            [2, 4, 2]
        );
        assert_eq!(
            [
                NcclReduceOp::Sum,
                NcclReduceOp::Prod,
                NcclReduceOp::Max,
                NcclReduceOp::Min,
                NcclReduceOp::Avg
            ]
            .map(NcclReduceOp::raw),
            [0, 1, 2, 3, 4]
        );
    }
}
