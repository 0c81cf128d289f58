/* Session 23: does ncclGetLastError(NULL) keep a failure's text across ncclCommAbort? */
#include <stdio.h>
#include "nccl.h"
int main(void) {
  ncclUniqueId id; ncclComm_t comm;
  ncclResult_t r = ncclGetUniqueId(&id);
  printf("GetUniqueId %d\n", r);
  r = ncclCommInitRank(&comm, 1, id, 0);
  printf("InitRank %d '%s'\n", r, ncclGetLastError(NULL));
  r = ncclAllReduce((void*)16, (void*)16, 10, ncclFloat, ncclSum, comm, 0);
  printf("AllReduce(bad pointers) %d '%s' / '%s'\n", r, ncclGetErrorString(r), ncclGetLastError(NULL));
  ncclResult_t a; r = ncclCommGetAsyncError(comm, &a);
  printf("GetAsyncError %d async %d '%s'\n", r, a, ncclGetLastError(NULL));
  r = ncclCommAbort(comm);
  printf("Abort %d, then last error '%s'\n", r, ncclGetLastError(NULL));
  return 0;
}
