/* MPI_Allreduce of floats (sum) over a size sweep, timed like mscclpp-perf: warm-up
 * calls, a barrier, then the mean of `iters` calls, the max over ranks; every result is
 * checked against the sum computed here. Built and run by scripts/host-vs-mpi.py.
 * Usage: allreduce MIN_BYTES MAX_BYTES FACTOR ITERS WARMUP
 * Prints one line per size: bytes, time in microseconds, wrong elements. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (argc != 6) {
    if (rank == 0) fprintf(stderr, "usage: %s MIN_BYTES MAX_BYTES FACTOR ITERS WARMUP\n", argv[0]);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  size_t lo = strtoull(argv[1], 0, 0), hi = strtoull(argv[2], 0, 0);
  int factor = atoi(argv[3]), iters = atoi(argv[4]), warmup = atoi(argv[5]);
  if (lo < 4 || factor < 2 || iters < 1 || warmup < 0) MPI_Abort(MPI_COMM_WORLD, 2);
  long total_wrong = 0;
  for (size_t bytes = lo; bytes <= hi; bytes *= factor) {
    size_t count = bytes / sizeof(float);
    float *send = malloc(count * sizeof(float)), *recv = malloc(count * sizeof(float));
    if (!send || !recv) MPI_Abort(MPI_COMM_WORLD, 3);
    for (size_t i = 0; i < count; i++) send[i] = (float)(rank + 1 + i % 7);
    for (int w = 0; w < warmup; w++)
      MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t = MPI_Wtime();
    for (int i = 0; i < iters; i++)
      MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double us = (MPI_Wtime() - t) / iters * 1e6, worst;
    MPI_Reduce(&us, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    long wrong = 0;
    for (size_t i = 0; i < count; i++) {
      /* sum over ranks k of (k + 1 + i % 7), small integers: exact in float */
      float want = (float)(n * (n + 1) / 2 + n * (int)(i % 7));
      wrong += recv[i] != want;
    }
    long all_wrong;
    MPI_Reduce(&wrong, &all_wrong, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("%zu %.3f %ld\n", bytes, worst, all_wrong);
    total_wrong += all_wrong;
    free(send);
    free(recv);
  }
  MPI_Finalize();
  return rank == 0 && total_wrong ? 1 : 0;
}
