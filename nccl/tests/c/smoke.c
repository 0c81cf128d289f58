/* Calls libmscclpp_nccl.so's entry points that need no GPU, through nccl/include/nccl.h,
 * and checks what they return. Exit status: the number of failed checks.
 * MSCCLPP_SMOKE_NO_GPU=1: also checks that ncclCommInitRank fails cleanly (no GPU here). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl.h"

static int failures = 0;

#define CHECK(cond, ...)                                      \
  do {                                                        \
    if (!(cond)) {                                            \
      failures++;                                             \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                           \
      fprintf(stderr, "\n");                                  \
    }                                                         \
  } while (0)

#define EXPECT(call, want)                                                              \
  do {                                                                                  \
    ncclResult_t got_ = (call);                                                         \
    CHECK(got_ == (want), "returned %d (%s), want %d; last error: %s", (int)got_,       \
          ncclGetErrorString(got_), (int)(want), ncclGetLastError(NULL));               \
  } while (0)

static int contains(const char* s, const char* what) { return s && strstr(s, what) != NULL; }

int main(void) {
  /* ABI facts of the header. */
  CHECK(sizeof(ncclUniqueId) == 128, "sizeof(ncclUniqueId) = %zu", sizeof(ncclUniqueId));
  CHECK(sizeof(ncclConfig_t) == 80, "sizeof(ncclConfig_t) = %zu", sizeof(ncclConfig_t));
  CHECK(offsetof(ncclConfig_t, blocking) == 16, "blocking at %zu", offsetof(ncclConfig_t, blocking));
  CHECK(offsetof(ncclConfig_t, commName) == 48, "commName at %zu", offsetof(ncclConfig_t, commName));
  CHECK(sizeof(ncclRedOp_t) == 4 && sizeof(ncclDataType_t) == 4, "enum sizes");
  CHECK(ncclFloat8e5m2 == 11 && ncclBfloat16 == 9 && ncclAvg == 4 && ncclInProgress == 7, "enum values");

  int version = 0;
  EXPECT(ncclGetVersion(&version), ncclSuccess);
  CHECK(version >= 22800 && version < 30000, "version %d", version);
  EXPECT(pncclGetVersion(&version), ncclSuccess);
  EXPECT(ncclGetVersion(NULL), ncclInvalidArgument);

  /* Error strings: one for every code, all different. */
  for (int r = 0; r < ncclNumResults; r++) {
    const char* s = ncclGetErrorString((ncclResult_t)r);
    CHECK(s != NULL && s[0] != '\0', "no string for %d", r);
    for (int q = 0; q < r; q++)
      CHECK(strcmp(s, ncclGetErrorString((ncclResult_t)q)) != 0, "same string for %d and %d", q, r);
  }
  CHECK(ncclGetErrorString((ncclResult_t)99) != NULL, "unknown code");

  ncclUniqueId id, zero;
  memset(&id, 0, sizeof id);
  memset(&zero, 0, sizeof zero);
  EXPECT(ncclGetUniqueId(&id), ncclSuccess);
  CHECK(memcmp(&id, &zero, sizeof id) != 0, "id is all zeros");
  EXPECT(ncclGetUniqueId(NULL), ncclInvalidArgument);

  /* Argument checks of the set-up. */
  ncclComm_t comm = NULL;
  int n0 = 0;
  EXPECT(ncclCommInitRank(NULL, 2, id, 0), ncclInvalidArgument);
  EXPECT(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument);
  comm = (ncclComm_t)(void*)&n0;
  EXPECT(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument);
  CHECK(comm == NULL, "a failed set-up left %p, not NULL (as NCCL)", (void*)comm);
  EXPECT(ncclCommInitRank(&comm, 2, id, -1), ncclInvalidArgument);
  EXPECT(ncclCommInitRank(&comm, 2, zero, 0), ncclInvalidArgument);
  CHECK(contains(ncclGetLastError(NULL), "ncclUniqueId"), "last error: %s", ncclGetLastError(NULL));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.magic = 0;
  EXPECT(ncclCommInitRankConfig(&comm, 2, id, 0, &config), ncclInvalidArgument);
  CHECK(contains(ncclGetLastError(NULL), "NCCL_CONFIG_INITIALIZER"), "last error: %s", ncclGetLastError(NULL));
  EXPECT(ncclCommInitRankScalable(&comm, 2, 0, 0, &id, NULL), ncclInvalidArgument);
  EXPECT(ncclCommInitAll(NULL, 1, NULL), ncclInvalidArgument);
  EXPECT(ncclCommInitAll(&comm, 0, NULL), ncclInvalidArgument);

  /* Calls on no communicator, or on one this library did not make. */
  int n = -1;
  float buf[4];
  ncclComm_t bogus = (ncclComm_t)(void*)buf;
  EXPECT(ncclCommCount(NULL, &n), ncclInvalidArgument);
  EXPECT(ncclCommCount(bogus, &n), ncclInvalidArgument);
  CHECK(contains(ncclGetLastError(NULL), "not a communicator"), "last error: %s", ncclGetLastError(NULL));
  EXPECT(ncclCommUserRank(NULL, &n), ncclInvalidArgument);
  EXPECT(ncclCommCuDevice(NULL, &n), ncclInvalidArgument);
  EXPECT(ncclAllReduce(buf, buf, 4, ncclFloat, ncclSum, NULL, NULL), ncclInvalidArgument);
  EXPECT(ncclAllReduce(buf, buf, 4, (ncclDataType_t)42, ncclSum, NULL, NULL), ncclInvalidArgument);
  CHECK(contains(ncclGetLastError(NULL), "data type 42"), "last error: %s", ncclGetLastError(NULL));
  EXPECT(ncclAllGather(buf, buf, 1, ncclFloat, NULL, NULL), ncclInvalidArgument);
  EXPECT(ncclReduceScatter(buf, buf, 1, ncclFloat, ncclSum, NULL, NULL), ncclInvalidArgument);
  EXPECT(ncclBroadcast(buf, buf, 1, ncclFloat, 0, NULL, NULL), ncclInvalidArgument);
  EXPECT(ncclBcast(buf, 1, ncclFloat, 0, NULL, NULL), ncclInvalidArgument);
  EXPECT(ncclReduce(buf, buf, 1, ncclFloat, ncclSum, 0, NULL, NULL), ncclInvalidArgument);
  EXPECT(ncclSend(buf, 1, ncclFloat, 0, NULL, NULL), ncclInvalidArgument);
  EXPECT(ncclRecv(buf, 1, ncclFloat, 0, NULL, NULL), ncclInvalidArgument);
  EXPECT(ncclAlltoAll(buf, buf, 1, ncclFloat, NULL, NULL), ncclInvalidArgument);
  /* Ending a NULL communicator (a NOCOLOR rank's split child) is done already, as in NCCL. */
  EXPECT(ncclCommDestroy(NULL), ncclSuccess);
  EXPECT(ncclCommAbort(NULL), ncclSuccess);
  ncclComm_t shrunk = bogus;
  EXPECT(ncclCommShrink(bogus, NULL, 0, &shrunk, NULL, 2), ncclInvalidArgument);
  CHECK(shrunk == NULL, "a failed shrink left %p, not NULL (as NCCL)", (void*)shrunk);
  CHECK(contains(ncclGetLastError(NULL), "shrinkFlags 0x2"), "last error: %s", ncclGetLastError(NULL));
  EXPECT(ncclCommShrink(NULL, NULL, 0, &shrunk, NULL, NCCL_SHRINK_ABORT), ncclInvalidArgument);
  EXPECT(ncclCommRevoke(NULL, NCCL_REVOKE_DEFAULT), ncclInvalidArgument);
  EXPECT(pncclCommRevoke(bogus, NCCL_REVOKE_DEFAULT), ncclInvalidArgument);
  EXPECT(ncclCommRevoke(bogus, 1), ncclInvalidArgument);
  CHECK(contains(ncclGetLastError(NULL), "revokeFlags 1"), "last error: %s", ncclGetLastError(NULL));
  /* Device-API helpers: no error channel on a missing communicator but -1 or an empty team;
   * the barrier requirement refuses it. */
  ncclTeam_t t = ncclTeamWorld(NULL);
  CHECK(t.nRanks == 0 && t.rank == 0 && t.stride == 0, "ncclTeamWorld(NULL) = {%d, %d, %d}", t.nRanks,
        t.rank, t.stride);
  t = pncclTeamRail(NULL);
  CHECK(t.nRanks == 0, "ncclTeamRail(NULL).nRanks = %d", t.nRanks);
  ncclTeam_t world = {4, 1, 1};
  CHECK(ncclTeamRankToWorld(NULL, world, 2) == -1, "ncclTeamRankToWorld(NULL) = %d",
        ncclTeamRankToWorld(NULL, world, 2));
  CHECK(pncclTeamRankToLsa(bogus, world, 2) == -1, "ncclTeamRankToLsa(bogus) = %d",
        pncclTeamRankToLsa(bogus, world, 2));
  EXPECT(ncclGinBarrierCreateRequirement(NULL, world, 1, (ncclGinBarrierHandle_t*)buf,
                                         (ncclDevResourceRequirements_t*)buf),
         ncclInvalidArgument);
  EXPECT(ncclGinBarrierCreateRequirement(bogus, world, 1, NULL, (ncclDevResourceRequirements_t*)buf),
         ncclInvalidArgument);
  CHECK(contains(ncclGetLastError(NULL), "outHandle"), "last error: %s", ncclGetLastError(NULL));
  EXPECT(ncclCommFinalize(NULL), ncclSuccess);
  ncclResult_t async = ncclSuccess;
  EXPECT(ncclCommGetAsyncError(NULL, &async), ncclInvalidArgument);
  ncclComm_t child = NULL;
  EXPECT(ncclCommSplit(NULL, 0, 0, &child, NULL), ncclInvalidArgument);
  EXPECT(ncclCommSplit(bogus, -5, 0, &child, NULL), ncclInvalidArgument);
  ncclRedOp_t op;
  float scalar = 2.0f;
  EXPECT(ncclRedOpCreatePreMulSum(NULL, &scalar, ncclFloat, ncclScalarHostImmediate, NULL), ncclInvalidArgument);
  EXPECT(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, NULL), ncclInvalidArgument);
  EXPECT(ncclRedOpCreatePreMulSum(&op, NULL, ncclFloat, ncclScalarHostImmediate, bogus), ncclInvalidArgument);
  EXPECT(ncclRedOpCreatePreMulSum(&op, &scalar, (ncclDataType_t)42, ncclScalarHostImmediate, bogus), ncclInvalidArgument);
  CHECK(contains(ncclGetLastError(NULL), "data type 42"), "last error: %s", ncclGetLastError(NULL));
  EXPECT(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, (ncclScalarResidence_t)7, bogus), ncclInvalidArgument);
  CHECK(contains(ncclGetLastError(NULL), "residence 7"), "last error: %s", ncclGetLastError(NULL));
  EXPECT(ncclRedOpDestroy(ncclSum, NULL), ncclInvalidArgument);
  EXPECT(ncclRedOpDestroy(ncclNumOps, bogus), ncclInvalidArgument);
  EXPECT(ncclMemAlloc(NULL, 16), ncclInvalidArgument);

  /* Groups. */
  EXPECT(ncclGroupEnd(), ncclInvalidUsage);
  EXPECT(ncclGroupStart(), ncclSuccess);
  EXPECT(ncclGroupStart(), ncclSuccess);
  EXPECT(ncclGroupEnd(), ncclSuccess);
  EXPECT(ncclGroupEnd(), ncclSuccess);
  EXPECT(pncclGroupEnd(), ncclInvalidUsage);

  /* No GPU: the set-up fails at once, saying so (it must not wait for rank 1). */
  if (getenv("MSCCLPP_SMOKE_NO_GPU") != NULL) {
    ncclResult_t r = ncclCommInitRank(&comm, 2, id, 0);
    CHECK(r == ncclSystemError || r == ncclUnhandledCudaError, "ncclCommInitRank returned %d", (int)r);
    CHECK(contains(ncclGetLastError(NULL), "no GPU"), "last error: %s", ncclGetLastError(NULL));
    r = ncclCommInitRankConfig(&comm, 1, id, 0, NULL);
    CHECK(r == ncclSystemError || r == ncclUnhandledCudaError, "ncclCommInitRankConfig returned %d", (int)r);
    r = ncclCommInitAll(&comm, 1, NULL);
    CHECK(r == ncclSystemError || r == ncclUnhandledCudaError, "ncclCommInitAll returned %d", (int)r);
    CHECK(contains(ncclGetLastError(NULL), "no GPU"), "last error: %s", ncclGetLastError(NULL));
    printf("no-GPU set-up error: %s\n", ncclGetLastError(NULL));
  }

  printf("smoke: %d failure(s)\n", failures);
  return failures;
}
