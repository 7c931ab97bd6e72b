#include "bench_limits.h"

#include <pthread.h>
#include <stdlib.h>

#include "timing.h"
#include "uattn.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define UATTN_BENCH_X86 1
#endif

#ifdef UATTN_BENCH_X86
__attribute__((target("avx2"))) static double read_sum(const float *x, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(x + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(x + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(x + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(x + i + 24));
  }
  float t[8];
  _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

/* 12 independent FMA chains: enough to cover the FMA latency on two ports. */
__attribute__((target("avx2,fma"))) static double fma_loop(long iters) {
  __m256 a[12], b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int k = 0; k < 12; k++) a[k] = _mm256_set1_ps((float)k);
  for (long i = 0; i < iters; i++)
    for (int k = 0; k < 12; k++) a[k] = _mm256_fmadd_ps(a[k], b, c);
  float t[8];
  __m256 s = a[0];
  for (int k = 1; k < 12; k++) s = _mm256_add_ps(s, a[k]);
  _mm256_storeu_ps(t, s);
  return t[0];
}
#else
static double read_sum(const float *x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += x[i];
  return s;
}
static double fma_loop(long iters) {
  float a[12] = {0};
  for (long i = 0; i < iters; i++)
    for (int k = 0; k < 12; k++) a[k] = a[k] * 0.999999f + 1e-7f;
  return a[0];
}
#endif

enum { FMA_ITERS = 20000000 };
#define FMA_FLOPS_PER_ITER (12.0 * 8 * 2) /* 12 chains of 8 lanes, 2 flops per FMA */

typedef struct limit_job {
  const float *data;
  size_t n;
  int threads;
  double result[BENCH_LIMITS_MAX_THREADS]; /* keeps the work from being optimized away */
} limit_job;

typedef struct limit_arg {
  limit_job *job;
  int id;
} limit_arg;

static void *read_thread(void *p) {
  limit_arg *a = p;
  const size_t part = a->job->n / (size_t)a->job->threads;
  a->job->result[a->id] = read_sum(a->job->data + part * (size_t)a->id, part);
  return NULL;
}

static void *fma_thread(void *p) {
  limit_arg *a = p;
  a->job->result[a->id] = fma_loop(FMA_ITERS);
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

int bench_measure_limits(int threads, int runs, bench_limits *out) {
  const size_t n = (size_t)64 << 20; /* 256 MiB: far past the caches */
  limit_job *job = calloc(1, sizeof *job);
  double *t = malloc(sizeof(double) * (size_t)runs);
  float *x = NULL; /* the read runs on the memory the caches get: 2 MiB pages where the system has them */
  if (!job || !t || uattn_cache_alloc(n * sizeof(float), (void **)&x)) {
    free(job), free(t);
    return -1;
  }
  for (size_t i = 0; i < n; i++) x[i] = (float)(i & 7);
  job->data = x;
  job->n = n;
  out->threads = threads;
  for (int k = 0; k < 2; k++) {
    const int th = k == 0 ? 1 : threads;
    for (int r = 0; r < runs; r++) t[r] = run_threads(read_thread, job, th);
    const double gbs = (double)(n / (size_t)th * (size_t)th) * sizeof(float) / fastest(t, runs) * 1e-9;
    for (int r = 0; r < runs; r++) t[r] = run_threads(fma_thread, job, th);
    const double gflops = FMA_ITERS * FMA_FLOPS_PER_ITER * th / fastest(t, runs) * 1e-9;
    *(k == 0 ? &out->read_gbs_1 : &out->read_gbs_all) = gbs;
    *(k == 0 ? &out->fma_gflops_1 : &out->fma_gflops_all) = gflops;
  }
  uattn_cache_free(x, n * sizeof(float)), free(t), free(job);
  return 0;
}

int bench_flush_init(bench_flush *f, size_t bytes) {
  f->n = (bytes / sizeof(float) + 31) / 32 * 32;
  f->data = aligned_alloc(64, f->n * sizeof(float));
  if (!f->data) return -1;
  for (size_t i = 0; i < f->n; i++) f->data[i] = 1.0f;
  return 0;
}

double bench_flush_caches(const bench_flush *f) { return read_sum(f->data, f->n); }

void bench_flush_free(bench_flush *f) {
  free(f->data);
  f->data = NULL;
}
