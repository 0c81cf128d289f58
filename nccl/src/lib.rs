//! `libmscclpp_nccl.so`: a drop-in NCCL (docs/guide/06-design.md §8).
//!
//! The library exports NCCL's C API with NCCL 2.2x's ABI (`include/nccl.h` is its header),
//! so that a program built against NCCL runs on it unchanged, linked to it or with
//! `LD_PRELOAD=libmscclpp_nccl.so`.
//!
//! - **Native** (see [`dispatch`]): `ncclAllReduce`, `ncclReduceScatter` and `ncclReduce`
//!   for every operation (sum, prod, min, max, avg, and the pre-multiplied sums of
//!   `ncclRedOpCreatePreMulSum`, made here) on every type, fp8 included (reduced in f32 and
//!   rounded once: `mscclpp_host`'s staged reductions);
//!   `ncclAllGather`, `ncclBroadcast`/`ncclBcast`, `ncclAlltoAll` and `ncclSend`/`ncclRecv`
//!   (alone or in groups) for every type, and `ncclGather`/`ncclScatter` as the sends and
//!   receives they stand for. They run on
//!   [`mscclpp_host::collectives::Collectives`], stream-ordered on the caller's
//!   `cudaStream_t` (the same object as a `CUstream`), capturable into CUDA graphs. The
//!   choice depends only on what every rank of a call agrees on (call, type, operation,
//!   `MSCCLPP_NCCL_FALLBACK`), never on addresses or streams: a call is native on every rank
//!   or on none.
//! - **Fallback**: registration,
//!   windows, the device API, and the calls named by `MSCCLPP_NCCL_FALLBACK=all|op,op`
//!   (`allreduce`, `allgather`, `reducescatter`, `broadcast`, `reduce`, `alltoall`,
//!   `sendrecv`), run on the real NCCL (found at run time, see [`system_nccl`]) over a real
//!   communicator set up *eagerly* beside ours at `ncclCommInitRank*` (rank 0 gets a real
//!   unique id and broadcasts it over our bootstrap), so that nothing is set up later inside
//!   a group or during graph capture. Without a real NCCL, such calls fail with
//!   `ncclInvalidUsage` and `ncclGetLastError` says what is missing.
//! - **Handles**: an `ncclComm_t` is a pointer to a [`comm::Comm`], kept in a table. A
//!   pointer not in the table, with a real NCCL loaded, is the real NCCL's own communicator
//!   (the real library calling its public API internally reaches us under `LD_PRELOAD`): the
//!   call passes through unchanged.
//! - **Errors**: no panic crosses the C boundary ([`error::guard`] at every export);
//!   failures return NCCL's codes and leave a text for `ncclGetLastError`;
//!   `MSCCLPP_DEBUG=WARN` prints failures, `MSCCLPP_DEBUG=INFO` also which path served each
//!   kind of call.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod api;
pub mod comm;
pub mod dispatch;
pub mod error;
pub mod group;
pub mod log;
pub mod setup_fallback;
pub mod system_nccl;
pub mod types;
