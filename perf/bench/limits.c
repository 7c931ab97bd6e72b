#include "bench/limits.h"
#include "common/probe.h"

#include <pthread.h>
#include <stdlib.h>

#include "common/timing.h"
#include "uattn.h"

enum { FMA_ITERS = 20000000, BF16_ITERS = 10000000, AMX_ITERS = 2000000 };
/* Each kind of loop runs untimed this long first, so that a core that changes its clock or powers a unit up for
 * that kind (zmm FMAs, AMX tiles) is timed at its speed. */
#define WARM_SECONDS 0.2

typedef struct limit_job {
  const float *data;
  size_t n;
  int threads;
  int fma_lanes;                           /* bench_probe_fma's width */
  double result[BENCH_LIMITS_MAX_THREADS]; /* keeps the work from being optimized away */
} limit_job;

typedef struct limit_arg {
  limit_job *job;
  int id;
} limit_arg;

static void *read_thread(void *p) {
  limit_arg *a = p;
  const size_t part = a->job->n / (size_t)a->job->threads;
  a->job->result[a->id] = bench_probe_read(a->job->data + part * (size_t)a->id, part);
  return NULL;
}

static void *fma_thread(void *p) {
  limit_arg *a = p;
  a->job->result[a->id] = bench_probe_fma(FMA_ITERS, a->job->fma_lanes);
  return NULL;
}

static void *bf16_thread(void *p) {
  limit_arg *a = p;
  a->job->result[a->id] = bench_probe_bf16_dot(BF16_ITERS);
  return NULL;
}

static void *amx_thread(void *p) {
  limit_arg *a = p;
  a->job->result[a->id] = bench_probe_amx(AMX_ITERS);
  return NULL;
}

/* Runs fn on `threads` threads at once (the caller is thread 0); returns the wall time. */
static double run_threads(void *(*fn)(void *), limit_job *job, int threads) {
  pthread_t t[BENCH_LIMITS_MAX_THREADS];
  limit_arg args[BENCH_LIMITS_MAX_THREADS];
  job->threads = threads;
  const double t0 = perf_seconds();
  int started = 1;
  for (int i = 0; i < threads; i++) args[i] = (limit_arg){job, i};
  for (int i = 1; i < threads; i++, started++)
    if (pthread_create(&t[i], NULL, fn, &args[i])) break;
  fn(&args[0]);
  for (int i = 1; i < started; i++) pthread_join(t[i], NULL);
  /* a thread that could not start leaves its share undone; the caller does it, late but counted */
  for (int i = started; i < threads; i++) fn(&args[i]);
  return perf_seconds() - t0;
}

static double fastest(const double *t, int n) {
  double m = t[0];
  for (int i = 1; i < n; i++) m = t[i] < m ? t[i] : m;
  return m;
}

int bench_reader_init(bench_reader *r, size_t bytes) {
  r->n = (bytes / sizeof(float) + 31) / 32 * 32;
  r->job = calloc(1, sizeof *r->job);
  r->data = NULL;
  if (!r->job || uattn_cache_alloc(r->n * sizeof(float), (void **)&r->data)) {
    free(r->job);
    return -1;
  }
  for (size_t i = 0; i < r->n; i++) r->data[i] = (float)(i & 7);
  r->job->data = r->data;
  r->job->n = r->n;
  return 0;
}

double bench_read_gbs(bench_reader *r, int threads) {
  const double s = run_threads(read_thread, r->job, threads);
  return (double)(r->n / (size_t)threads * (size_t)threads) * sizeof(float) / s * 1e-9;
}

void bench_reader_free(bench_reader *r) {
  uattn_cache_free(r->data, r->n * sizeof(float));
  free(r->job);
  r->data = NULL, r->job = NULL;
}

/* GFLOP/s of `fn`'s `flops` a thread on th threads: the fastest of `runs`. */
static double best_gflops(void *(*fn)(void *), limit_job *job, int th, int runs, double flops, double *t) {
  for (const double t0 = perf_seconds(); perf_seconds() - t0 < WARM_SECONDS;) run_threads(fn, job, th);
  for (int i = 0; i < runs; i++) t[i] = run_threads(fn, job, th);
  return flops * th / fastest(t, runs) * 1e-9;
}

int bench_measure_limits(bench_reader *r, int threads, int runs, bench_limits *out) {
  double *t = malloc(sizeof(double) * (size_t)runs);
  if (!t) return -1;
  out->threads = threads;
  out->bf16_dot = bench_probe_has_bf16_dot();
  out->amx = bench_probe_has_amx(); /* asks the OS for the tiles before any thread of the probe runs */
  out->fma_lanes = r->job->fma_lanes = bench_probe_fma_lanes();
  out->bf16_gflops_1 = out->bf16_gflops_all = out->amx_gflops_1 = out->amx_gflops_all = 0;
  for (int k = 0; k < 2; k++) {
    const int th = k == 0 ? 1 : threads;
    double gbs = 0;
    for (int i = 0; i < runs; i++) {
      const double g = bench_read_gbs(r, th);
      gbs = g > gbs ? g : gbs;
    }
    *(k == 0 ? &out->read_gbs_1 : &out->read_gbs_all) = gbs;
    *(k == 0 ? &out->fma_gflops_1 : &out->fma_gflops_all) =
        best_gflops(fma_thread, r->job, th, runs, FMA_ITERS * BENCH_PROBE_FMA_FLOPS(out->fma_lanes), t);
    if (out->bf16_dot)
      *(k == 0 ? &out->bf16_gflops_1 : &out->bf16_gflops_all) =
          best_gflops(bf16_thread, r->job, th, runs, BF16_ITERS * BENCH_PROBE_BF16_FLOPS, t);
    if (out->amx)
      *(k == 0 ? &out->amx_gflops_1 : &out->amx_gflops_all) =
          best_gflops(amx_thread, r->job, th, runs, AMX_ITERS * BENCH_PROBE_AMX_FLOPS, t);
  }
  free(t);
  return 0;
}
