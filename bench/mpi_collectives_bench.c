/* The Open MPI anchor for bench/collectives_bench: the same operations, sizes, iteration
 * counts and float32 buffers, timed the same way (three warm-up operations, a barrier, then
 * the mean time of back-to-back operations on rank 0), and printed as the same JSON lines,
 * so that bench/compare.py can set the two side by side.
 *
 *   mpirun --allow-run-as-root --oversubscribe -np 2 build/release/bench/mpi_collectives_bench \
 *       --min 4096 --max 67108864 --ops allreduce,broadcast,allgather,reduce_scatter
 *
 * `bytes` means what it means in collectives_bench (and nccl-tests): the buffer reduced,
 * broadcast, or gathered in total; for reduce_scatter the input, of which each rank keeps
 * 1/n. Options: --min BYTES, --max BYTES, --iters N (0: 500 up to 64 KiB, 50 up to 1 MiB,
 * 10 up to 16 MiB, else 4, as collectives_bench), --ops LIST, --fresh (each rank rewrites the input
 * of every operation just before it, inside the timed loop, as collectives_bench --fresh does). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static double bus_factor(const char* op, int n) {
  if (strcmp(op, "allreduce") == 0) return 2.0 * (n - 1) / n;
  if (strcmp(op, "allgather") == 0 || strcmp(op, "reduce_scatter") == 0) return (double)(n - 1) / n;
  return 1.0;
}

static double process_cpu_us(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec * 1e6 + (double)ru.ru_utime.tv_usec +
         (double)ru.ru_stime.tv_sec * 1e6 + (double)ru.ru_stime.tv_usec;
}

static int run_op(const char* op, float* in, float* out, size_t count, int n) {
  int c = (int)count;
  if (strcmp(op, "allreduce") == 0)
    return MPI_Allreduce(MPI_IN_PLACE, in, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  if (strcmp(op, "broadcast") == 0) return MPI_Bcast(in, c, MPI_FLOAT, 0, MPI_COMM_WORLD);
  if (strcmp(op, "allgather") == 0)
    return MPI_Allgather(in, c / n, MPI_FLOAT, out, c / n, MPI_FLOAT, MPI_COMM_WORLD);
  if (strcmp(op, "reduce_scatter") == 0)
    return MPI_Reduce_scatter_block(in, out, c / n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  return -1;
}

/* --fresh: rewrites the first `bytes` of `dst` with the float (i & 7), copied from one of
 * eight 4 KiB blocks made once, as collectives_bench does: a plain loop of 4-byte stores
 * runs at a speed that depends on where its code falls (64-byte boundaries). */
static void rewrite(float* dst, size_t bytes, int i) {
  enum { block = 4096 };
  static float blocks[8 * block / sizeof(float)];
  static int made = 0;
  if (!made) {
    for (size_t k = 0; k < sizeof(blocks) / sizeof(float); ++k)
      blocks[k] = (float)(k / (block / sizeof(float)));
    made = 1;
  }
  const char* from = (const char*)blocks + (size_t)(i & 7) * block;
  char* to = (char*)dst;
  for (size_t off = 0; off < bytes; off += block)
    memcpy(to + off, from, bytes - off < block ? bytes - off : block);
}

static int usage(const char* why) {
  fprintf(stderr,
          "mpi_collectives_bench: %s\nusage: mpi_collectives_bench [--min BYTES] [--max BYTES] "
          "[--iters N] [--ops allreduce,broadcast,allgather,reduce_scatter] [--fresh]\n",
          why);
  return 2;
}

int main(int argc, char** argv) {
  size_t min_bytes = 4096, max_bytes = (size_t)64 << 20;
  int fixed_iters = 0;
  int fresh = 0;
  char ops[256] = "allreduce,broadcast,allgather,reduce_scatter";
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--json") == 0) continue; /* accepted for symmetry; always JSON */
    if (strcmp(argv[i], "--fresh") == 0) {
      fresh = 1;
      continue;
    }
    if (i + 1 >= argc) return usage("every option but --json takes a value");
    if (strcmp(argv[i], "--min") == 0)
      min_bytes = strtoull(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--max") == 0)
      max_bytes = strtoull(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--iters") == 0)
      fixed_iters = atoi(argv[++i]);
    else if (strcmp(argv[i], "--ops") == 0)
      snprintf(ops, sizeof ops, "%s", argv[++i]);
    else
      return usage("unknown option");
  }
  if (min_bytes < 4 || max_bytes < min_bytes) return usage("--min must be >= 4 and <= --max");
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  float* in = malloc(max_bytes);
  float* out = malloc(max_bytes);
  if (!in || !out) {
    fprintf(stderr, "rank %d: cannot allocate %zu bytes\n", rank, max_bytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  char* save = NULL;
  for (char* op = strtok_r(ops, ",", &save); op; op = strtok_r(NULL, ",", &save)) {
    for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
      size_t count = bytes / sizeof(float);
      for (size_t i = 0; i < count; ++i) in[i] = 1.0f;
      int iters = fixed_iters > 0               ? fixed_iters
                  : bytes <= ((size_t)64 << 10) ? 500
                  : bytes <= ((size_t)1 << 20)  ? 50
                  : bytes <= ((size_t)16 << 20) ? 10
                                                : 4;
      for (int i = 0; i < 3; ++i)
        if (run_op(op, in, out, count, n) != MPI_SUCCESS) {
          fprintf(stderr, "unknown or failed operation '%s'\n", op);
          MPI_Abort(MPI_COMM_WORLD, 2);
        }
      MPI_Barrier(MPI_COMM_WORLD);
      double cpu0 = process_cpu_us();
      double t0 = MPI_Wtime();
      /* The input each rank hands over (allgather: its block; the others: the buffer). */
      size_t input = strcmp(op, "allgather") == 0 ? count / (size_t)n : count;
      for (int i = 0; i < iters; ++i) {
        if (fresh) rewrite(in, input * sizeof(float), i);
        run_op(op, in, out, count, n);
      }
      double us = (MPI_Wtime() - t0) * 1e6 / iters;
      double cpu_us = (process_cpu_us() - cpu0) / iters;
      double algbw = (double)bytes / us / 1e3; /* GB/s */
      if (rank == 0)
        printf(
            "{\"impl\": \"mpi\", \"bench\": \"%s\", \"world\": %d, \"bytes\": %zu, "
            "\"time_us\": %.2f, \"busbw_GBps\": %.4f, \"cpu_us\": %.1f}\n",
            op, n, bytes, us, algbw * bus_factor(op, n), cpu_us);
      fflush(stdout);
    }
  }
  free(in);
  free(out);
  MPI_Finalize();
  return 0;
}
