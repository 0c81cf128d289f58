/*
 * nccl.h for libmscclpp_nccl.so: NCCL's C API with the ABI of NCCL 2.28.
 *
 * Written for the mscclpp (Rust) project. Programs built against NVIDIA's nccl.h of a 2.2x
 * release run on libmscclpp_nccl.so unchanged (link to it, or LD_PRELOAD it); this header is
 * for building against the library directly. All-reduce, reduce-scatter and reduce (sum,
 * prod, min, max, avg and pre-multiplied sums on every type, fp8 included), all-gather,
 * broadcast, all-to-all, send/recv, gather and scatter (every type) run on mscclpp's kernels;
 * the rest (registration, windows, the device API, and whatever
 * MSCCLPP_NCCL_FALLBACK names) goes to the real NCCL, which the library loads at run time
 * (MSCCLPP_NCCL_LIB, or a libnccl.so.2 already loaded, on the library path, or in a Python
 * site-packages). The README's "NCCL library" section has the details.
 */
#ifndef NCCL_H_
#define NCCL_H_

#include <limits.h>
#include <stddef.h>

#if defined(__has_include)
#if __has_include(<cuda_runtime.h>)
#include <cuda_runtime.h>
#define MSCCLPP_NCCL_HAVE_CUDART 1
#endif
#endif
#ifndef MSCCLPP_NCCL_HAVE_CUDART
/* Without the CUDA toolkit: a stream is the runtime's opaque pointer (same as CUstream). */
typedef struct CUstream_st* cudaStream_t;
#endif

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 0
#define NCCL_SUFFIX "mscclpp"

/* Version codes: 2.8.x and older are X*1000+Y*100+Z, later ones X*10000+Y*100+Z. */
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator: an opaque pointer. */
typedef struct ncclComm* ncclComm_t;
#define NCCL_COMM_NULL NULL
/* A registered memory window (served by the real NCCL). */
typedef struct ncclWindow_vidmem* ncclWindow_t;

/* The rendezvous id every rank of a new communicator is given: 128 opaque bytes. */
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* Results of every call. */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

/* ncclCommRevoke flags. */
#define NCCL_REVOKE_DEFAULT 0x00

/* Communicator settings: a versioned header (size, magic, version) the initializer fills,
 * then fields a caller may set. The layout is NCCL 2.28's (80 bytes on 64-bit Linux). */
typedef struct ncclConfig_v22800 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
} ncclConfig_t;

/* Every field unset: the library's defaults. */
#define NCCL_CONFIG_INITIALIZER                                                               \
  {                                                                                           \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),       \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                  \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,                  \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,                  \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                  \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT                                          \
  }

/* What ncclGroupSimulateEnd reports. */
typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER \
  { sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_UNDEF_FLOAT }

/* Reduction operations. Values from ncclNumOps up are made by ncclRedOpCreatePreMulSum. */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

/* Element types. */
typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

/* Where the scalar of ncclRedOpCreatePreMulSum lives. */
typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

/* Device API types (NCCL 2.28), opaque here: served by the real NCCL. */
typedef struct ncclDevCommRequirements ncclDevCommRequirements;
typedef struct ncclDevComm ncclDevComm;
typedef struct {
  int nRanks, rank, stride;
} ncclTeam_t;

/* Each call exists under its name and under the "p" name (pncclAllReduce, ...). */
#define MSCCLPP_NCCL_DECL(ret, name, args) ret name args; ret p##name args

/* Memory for registration-friendly buffers. */
MSCCLPP_NCCL_DECL(ncclResult_t, ncclMemAlloc, (void** ptr, size_t size));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclMemFree, (void* ptr));

/* Version, ids, errors. */
MSCCLPP_NCCL_DECL(ncclResult_t, ncclGetVersion, (int* version));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclGetUniqueId, (ncclUniqueId* uniqueId));
MSCCLPP_NCCL_DECL(const char*, ncclGetErrorString, (ncclResult_t result));
MSCCLPP_NCCL_DECL(const char*, ncclGetLastError, (ncclComm_t comm));
MSCCLPP_NCCL_DECL(void, ncclResetDebugInit, (void));

/* Communicators. ncclCommInitRank uses the current CUDA device. */
MSCCLPP_NCCL_DECL(ncclResult_t, ncclCommInitRank,
                  (ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclCommInitRankConfig,
                  (ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                   ncclConfig_t* config));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclCommInitRankScalable,
                  (ncclComm_t* newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
                   ncclConfig_t* config));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclCommInitAll, (ncclComm_t* comm, int ndev, const int* devlist));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclCommSplit,
                  (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclCommShrink,
                  (ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                   ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclCommFinalize, (ncclComm_t comm));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclCommDestroy, (ncclComm_t comm));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclCommAbort, (ncclComm_t comm));
/* Stops this rank's operations in flight without freeing the communicator; then
 * ncclCommGetAsyncError says ncclInProgress until they have ended, and only destroy, abort,
 * split and shrink may follow. revokeFlags: NCCL_REVOKE_DEFAULT. */
MSCCLPP_NCCL_DECL(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int revokeFlags));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t* asyncError));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int* count));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int* device));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int* rank));

/* Registration and windows. */
MSCCLPP_NCCL_DECL(ncclResult_t, ncclCommRegister,
                  (const ncclComm_t comm, void* buff, size_t size, void** handle));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void* handle));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclCommWindowRegister,
                  (ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win));

/* Device communicators (NCCL 2.28 device API). */
MSCCLPP_NCCL_DECL(ncclResult_t, ncclDevCommCreate,
                  (ncclComm_t comm, const ncclDevCommRequirements* reqs, ncclDevComm* outDevComm));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclDevCommDestroy, (ncclComm_t comm, const ncclDevComm* devComm));
typedef struct ncclGinBarrierHandle ncclGinBarrierHandle_t;
typedef struct ncclDevResourceRequirements ncclDevResourceRequirements_t;
MSCCLPP_NCCL_DECL(ncclTeam_t, ncclTeamWorld, (ncclComm_t comm));
MSCCLPP_NCCL_DECL(ncclTeam_t, ncclTeamLsa, (ncclComm_t comm));
MSCCLPP_NCCL_DECL(ncclTeam_t, ncclTeamRail, (ncclComm_t comm));
MSCCLPP_NCCL_DECL(int, ncclTeamRankToWorld, (ncclComm_t comm, ncclTeam_t team, int rank));
MSCCLPP_NCCL_DECL(int, ncclTeamRankToLsa, (ncclComm_t comm, ncclTeam_t team, int rank));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclGinBarrierCreateRequirement,
                  (ncclComm_t comm, ncclTeam_t team, int nBarriers,
                   ncclGinBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq));

/* Reduction operations with a pre-multiplied scalar. */
MSCCLPP_NCCL_DECL(ncclResult_t, ncclRedOpCreatePreMulSum,
                  (ncclRedOp_t * op, void* scalar, ncclDataType_t datatype,
                   ncclScalarResidence_t residence, ncclComm_t comm));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm));

/* Collectives: enqueued on `stream`; in place when the buffers coincide as in NCCL. */
MSCCLPP_NCCL_DECL(ncclResult_t, ncclReduce,
                  (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                   ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclBcast,
                  (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                   cudaStream_t stream));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclBroadcast,
                  (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                   int root, ncclComm_t comm, cudaStream_t stream));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclAllReduce,
                  (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                   ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclReduceScatter,
                  (const void* sendbuff, void* recvbuff, size_t recvcount,
                   ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                   cudaStream_t stream));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclAllGather,
                  (const void* sendbuff, void* recvbuff, size_t sendcount,
                   ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclAlltoAll,
                  (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                   ncclComm_t comm, cudaStream_t stream));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclGather,
                  (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                   int root, ncclComm_t comm, cudaStream_t stream));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclScatter,
                  (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                   int root, ncclComm_t comm, cudaStream_t stream));

/* Point to point: pair them inside a group when they must progress together. */
MSCCLPP_NCCL_DECL(ncclResult_t, ncclSend,
                  (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                   ncclComm_t comm, cudaStream_t stream));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclRecv,
                  (void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                   ncclComm_t comm, cudaStream_t stream));

/* Groups: calls between start and end are issued together at the end. */
MSCCLPP_NCCL_DECL(ncclResult_t, ncclGroupStart, (void));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclGroupEnd, (void));
MSCCLPP_NCCL_DECL(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t * simInfo));

#undef MSCCLPP_NCCL_DECL

#ifdef __cplusplus
}
#endif

#endif /* NCCL_H_ */
