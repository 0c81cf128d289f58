/// Bits 0..8 of the tag: the collective.
pub const KIND_SHIFT: u32 = 0;
/// Bits 8..16: the element type (1 f32, 2 f16, 3 bf16, 4 f64, 5 i8, 6 u8, 7 i32, 8 u32,
/// 9 i64, 10 u64, 11 fp8 e4m3, 12 fp8 e5m2; 0 for byte movers that take none). A
/// reducing call of fp8 carries its data widened to f32 (see
/// [`staging`](super::staging)).
pub const DTYPE_SHIFT: u32 = 8;
/// Bits 16..24: the reduction, [`op`](super::op) code + 1 (1 sum, 2 prod, 3 min, 4 max,
/// 5 avg, 6 pre-multiplied sum; 0 for the collectives that do not reduce). Reducing kernels built for any
/// operation read theirs here ([`op_code`]).
pub const OP_SHIFT: u32 = 16;
/// Bits 24..32: the algorithm.
pub const ALGO_SHIFT: u32 = 24;
/// Bits 32..40: the root of a rooted collective (reduce, broadcast), which its kernels
/// read here ([`root`]); the peer of a send/receive.
pub const ROOT_SHIFT: u32 = 32;
/// Collective: all-reduce.
pub const ALL_REDUCE: u64 = 1;
/// Collective: all-gather.
pub const ALL_GATHER: u64 = 2;
/// Collective: reduce-scatter.
pub const REDUCE_SCATTER: u64 = 3;
/// Collective: reduce (to a root).
pub const REDUCE: u64 = 4;
/// Collective: broadcast (from a root).
pub const BROADCAST: u64 = 5;
/// Collective: all-to-all.
pub const ALL_TO_ALL: u64 = 6;
/// Point-to-point sends and receives (a group; no descriptor exchange, see
/// [`send_recv`](super::send_recv)).
pub const SEND_RECV: u64 = 7;
/// The descriptor tag of a rank whose round across hosts failed earlier
/// ([`guard::CROSS`](super::guard::CROSS)): no call's tag (its
/// kind field would be 0xff).
pub const BROKEN: u64 = u64::MAX;
/// Builds a tag.
#[inline(always)]
pub const fn tag(kind: u64, dtype: u64, op: u64, algo: u64) -> u64 {
    kind << KIND_SHIFT | dtype << DTYPE_SHIFT | op << OP_SHIFT | algo << ALGO_SHIFT
}
/// A tag with a root (see [`ROOT_SHIFT`]).
#[inline(always)]
pub const fn rooted_tag(kind: u64, dtype: u64, op: u64, algo: u64, root: u64) -> u64 {
    tag(kind, dtype, op, algo) | (root & 0xff) << ROOT_SHIFT
}
/// Algorithm code ([`ALGO_SHIFT`]) of the pipelined broadcast and reduce
/// ([`pipe`](super::pipe)); 1 is their LL path, 2 their rounds through the scratch.
pub const PIPELINED: u64 = 3;
/// Bits 40..60 of a pipelined call's tag: its piece size in 16-byte units.
pub const PIECE_SHIFT: u32 = 40;
/// Bits 60..64: its depth (pieces in flight per block and link).
pub const DEPTH_SHIFT: u32 = 60;
/// `tag` with a pipelined call's `piece` (bytes, a multiple of 16, below 16 MiB) and
/// `depth` (below 16).
#[inline(always)]
pub const fn with_pipe(tag: u64, piece: u64, depth: u32) -> u64 {
    tag | ((piece / 16) & 0xf_ffff) << PIECE_SHIFT | (depth as u64 & 0xf) << DEPTH_SHIFT
}
/// The piece size (bytes) of a pipelined call's tag ([`with_pipe`]).
#[inline(always)]
pub const fn piece(tag: u64) -> u64 {
    (tag >> PIECE_SHIFT & 0xf_ffff) * 16
}
/// The depth of a pipelined call's tag ([`with_pipe`]).
#[inline(always)]
pub const fn depth(tag: u64) -> u32 {
    (tag >> DEPTH_SHIFT & 0xf) as u32
}
/// Field `shift` of a tag.
#[inline(always)]
pub const fn field(tag: u64, shift: u32) -> u64 {
    (tag >> shift) & 0xff
}
/// The [`op`](super::op) code of a tag (its [`OP_SHIFT`] field less one).
#[inline(always)]
pub const fn op_code(tag: u64) -> u32 {
    (field(tag, OP_SHIFT) as u32).wrapping_sub(1)
}
/// The operation argument of the any-type kernels ([`Dyn`](super::types::Dyn)): the
/// [`op_code`] with the type's code ([`DTYPE_SHIFT`]) above it, `op | dtype << 8`.
#[inline(always)]
pub const fn type_op(tag: u64) -> u32 {
    op_code(tag) & 0xff | (field(tag, DTYPE_SHIFT) as u32) << 8
}
/// The element size of the tag's type ([`DTYPE_SHIFT`]; 0 for a type that is not
/// reduced).
#[inline(always)]
pub const fn type_size(tag: u64) -> u64 {
    super::types::dtype_size(field(tag, DTYPE_SHIFT) as u32)
}
/// The root of a tag ([`ROOT_SHIFT`]).
#[inline(always)]
pub const fn root(tag: u64) -> u32 {
    field(tag, ROOT_SHIFT) as u32
}
