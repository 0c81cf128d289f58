//! The element types and reduction operations of the collectives.

use super::CrossTransport;
use super::PreMulScalar;
use crate::transport::TransportKind;
use std::fmt;

/// Element type of a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    Bf16,
    /// 64-bit IEEE float.
    F64,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
    /// 8-bit float e4m3 ([`Fp8E4M3`](super::Fp8E4M3)); its reductions accumulate in f32 and round once
    /// (see [`STAGING_BYTES`](super::STAGING_BYTES)'s module, "Staged reductions").
    Fp8E4M3,
    /// 8-bit float e5m2 ([`Fp8E5M2`](super::Fp8E5M2)), reduced as e4m3.
    Fp8E5M2,
}

impl DataType {
    /// Every type.
    pub const ALL: [DataType; 12] = [
        DataType::F32,
        DataType::F16,
        DataType::Bf16,
        DataType::F64,
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::Fp8E4M3,
        DataType::Fp8E5M2,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::F64 | DataType::I64 | DataType::U64 => 8,
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::I8 | DataType::U8 | DataType::Fp8E4M3 | DataType::Fp8E5M2 => 1,
        }
    }

    /// The name nccl-tests prints (`float`, `half`, `bfloat16`, `double`, `int8`, `uint8`,
    /// `int32`, `uint32`, `int64`, `uint64`, `f8e4m3`, `f8e5m2`).
    pub fn name(self) -> &'static str {
        match self {
            DataType::F32 => "float",
            DataType::F16 => "half",
            DataType::Bf16 => "bfloat16",
            DataType::F64 => "double",
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
            DataType::Fp8E4M3 => "f8e4m3",
            DataType::Fp8E5M2 => "f8e5m2",
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Reduction operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise product.
    Prod,
    /// Element-wise minimum (floats by IEEE `totalOrder`: -0 < +0).
    Min,
    /// Element-wise maximum (floats by IEEE `totalOrder`).
    Max,
    /// The sum divided once, at the end, by the number of ranks (integers: truncated).
    Avg,
    /// Every rank's input times its own scalar (in the type), then summed in rank order:
    /// NCCL's `ncclRedOpCreatePreMulSum`. Made by [`ReduceOp::pre_mul_sum`] (a host value)
    /// or [`ReduceOp::pre_mul_sum_at`] (read from memory when the call runs).
    PreMulSum(PreMulScalar),
}

impl ReduceOp {
    /// Every built-in operation (all but [`PreMulSum`](ReduceOp::PreMulSum)).
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// The name nccl-tests prints.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
            ReduceOp::PreMulSum(_) => "premulsum",
        }
    }
}

impl CrossTransport {
    /// The transport this setting takes on this machine.
    pub fn resolve(self) -> TransportKind {
        match self {
            CrossTransport::Tcp => TransportKind::Tcp,
            CrossTransport::Ib => TransportKind::Ib,
            CrossTransport::Auto => match crate::transport::ib::list_devices() {
                Ok(d) if !d.is_empty() => TransportKind::Ib,
                _ => TransportKind::Tcp,
            },
        }
    }
}

/// Element types the typed calls accept.
pub trait Element: Copy + Send + Sync + 'static {
    /// The matching [`DataType`].
    const DTYPE: DataType;
}

impl Element for f32 {
    const DTYPE: DataType = DataType::F32;
}
impl Element for half::f16 {
    const DTYPE: DataType = DataType::F16;
}
impl Element for half::bf16 {
    const DTYPE: DataType = DataType::Bf16;
}
impl Element for f64 {
    const DTYPE: DataType = DataType::F64;
}
impl Element for i8 {
    const DTYPE: DataType = DataType::I8;
}
impl Element for u8 {
    const DTYPE: DataType = DataType::U8;
}
impl Element for i32 {
    const DTYPE: DataType = DataType::I32;
}
impl Element for u32 {
    const DTYPE: DataType = DataType::U32;
}
impl Element for i64 {
    const DTYPE: DataType = DataType::I64;
}
impl Element for u64 {
    const DTYPE: DataType = DataType::U64;
}
// The fp8 types' `Element` impls are beside them, in `staged.rs`.
