/* The machine's own limits for uattn-bench, measured in the same run as the cases they judge: read
 * bandwidth, fp32 FMA peak and, where the CPU has them, the bf16 dot-product peak (AVX512-BF16) and the AMX
 * bf16 tile peak, with one thread and with all. They run probe.h's loops on plain threads, so they measure the
 * machine rather than the library. */
#ifndef UATTN_PERF_BENCH_LIMITS_H
#define UATTN_PERF_BENCH_LIMITS_H

#include <stddef.h>

/* The most threads the limits are measured with. */
#define BENCH_LIMITS_MAX_THREADS 256

typedef struct bench_limits {
  int threads;                     /* what "all" means */
  double read_gbs_1, read_gbs_all; /* GB/s of a streaming read of 256 MiB */
  /* fp32 FMA, 2 flops a lane, on the widest vectors the CPU runs (fma_lanes: 16 with AVX-512F, 8 with
   * AVX2, 1 elsewhere): the machine's peak, whether or not a kernel uses that width */
  double fma_gflops_1, fma_gflops_all;
  int fma_lanes;
  /* bf16 pair products into fp32 (vdpbf16ps zmm: 32 products and 32 adds, 64 flops): what bounds bf16
   * vector work on such a CPU. Both 0 where bf16_dot is 0. */
  int bf16_dot; /* bench_probe_has_bf16_dot() */
  double bf16_gflops_1, bf16_gflops_all;
  /* bf16 tile products into fp32 (AMX tdpbf16ps: 16 x 16 outputs, 32 pairs deep): what bounds bf16 work done
   * in tiles. Both 0 where amx is 0. */
  int amx; /* bench_probe_has_amx(): the CPU has AMX-BF16 and the OS grants this process the tiles */
  double amx_gflops_1, amx_gflops_all;
} bench_limits;

/* A buffer far past the caches that 1 to BENCH_LIMITS_MAX_THREADS plain threads stream through: the read
 * bandwidth limit, and the cold caches each timed run starts from (a layer's KV cache is cold in an engine:
 * every other layer ran in between). */
typedef struct bench_reader {
  float *data; /* on 2 MiB pages where the system has them, as the caches the cases read */
  size_t n;
  struct limit_job *job;
} bench_reader;

/* bytes: at least 256 MiB and a few times the last-level cache. Returns 0, or -1 when out of memory. */
int bench_reader_init(bench_reader *r, size_t bytes);
/* One streaming read of the whole buffer on `threads` threads at once; returns its GB/s. */
double bench_read_gbs(bench_reader *r, int threads);
void bench_reader_free(bench_reader *r);

/* Each limit is the best of `runs` runs: a busy neighbour only ever lowers what the machine can do.
 * Returns 0, or -1 when out of memory. threads in [1, BENCH_LIMITS_MAX_THREADS]. */
int bench_measure_limits(bench_reader *r, int threads, int runs, bench_limits *out);

#endif
