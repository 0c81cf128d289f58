/* Session 23: ncclGetLastError(NULL) after an asynchronous error, as nccl-tests reads it:
 * two ranks (fork) on GPU 0; rank 1 sets up and leaves without a call; rank 0 all-reduces,
 * polls ncclCommGetAsyncError until it reports, aborts, then prints ncclGetLastError(NULL). */
#include <stdio.h>
#include <unistd.h>
#include <sys/wait.h>
#include "nccl.h"
int main(void) {
  ncclUniqueId id; ncclComm_t comm;
  if (ncclGetUniqueId(&id) != ncclSuccess) return 2;
  pid_t pid = fork();
  int rank = pid == 0 ? 1 : 0;
  ncclResult_t r = ncclCommInitRank(&comm, 2, id, rank);
  printf("rank %d InitRank %d\n", rank, r); fflush(stdout);
  if (r != ncclSuccess) return 3;
  if (rank == 1) { sleep(1); _exit(0); }
  void *buf; r = ncclMemAlloc(&buf, 1 << 20);
  printf("rank 0 MemAlloc %d\n", r);
  r = ncclAllReduce(buf, buf, 1000, ncclFloat, ncclSum, comm, 0);
  printf("rank 0 AllReduce %d\n", r); fflush(stdout);
  ncclResult_t a = ncclSuccess;
  for (int i = 0; i < 600 && a == ncclSuccess; i++) {
    r = ncclCommGetAsyncError(comm, &a);
    if (r != ncclSuccess) { printf("GetAsyncError failed %d\n", r); break; }
    usleep(50000);
  }
  printf("rank 0 async %d '%s' / '%s'\n", a, ncclGetErrorString(a), ncclGetLastError(NULL));
  r = ncclCommAbort(comm);
  printf("rank 0 Abort %d, then '%s' / '%s'\n", r, ncclGetErrorString(a), ncclGetLastError(NULL));
  waitpid(pid, NULL, 0);
  return 0;
}
