#include "bench/limits.h"

#include <pthread.h>
#include <stdlib.h>

#include "common/timing.h"
#include "uattn.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define UATTN_BENCH_X86 1
/* compilers that know the avx512bf16 target and its intrinsics; older ones report the peak as absent */
#if defined(__clang__) ? __clang_major__ >= 9 : __GNUC__ >= 10
#define UATTN_BENCH_BF16 1
#endif
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
__attribute__((target("avx2,fma"))) static double fma_loop_ymm(long iters) {
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

/* The same on zmm: a Zen 5 or an Intel server core issues two zmm FMAs a cycle, twice its ymm peak (a Zen 4
 * splits each zmm FMA over its two 256-bit pipes: the same flops either way). Unrolled as bf16_dot_loop. */
__attribute__((target("avx512f"))) static double fma_loop_zmm(long iters) {
  __m512 a[12], b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int k = 0; k < 12; k++) a[k] = _mm512_set1_ps((float)k);
  for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
    for (int k = 0; k < 12; k++) a[k] = _mm512_fmadd_ps(a[k], b, c);
  }
  __m512 s = a[0];
  for (int k = 1; k < 12; k++) s = _mm512_add_ps(s, a[k]);
  return _mm512_reduce_add_ps(s);
}

/* CPUID leaf 7's EBX has every bit of `need` (AVX-512 features), and the OS saves the opmask and zmm
 * registers (XCR0 bits 5-7, with SSE and AVX state, bits 1-2), without which the first zmm instruction
 * faults. *subleaves: leaf 7's last subleaf. */
static int has_zmm(unsigned need, unsigned *subleaves) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return 0;
  unsigned xcr0_lo, xcr0_hi;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0xe6) != 0xe6) return 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
  *subleaves = a;
  return (b & need) == need;
}

/* The widest FMA this CPU runs: 16 lanes with AVX-512F, else 8. */
static int fma_lanes(void) {
  unsigned sub;
  return has_zmm(1u << 16, &sub) ? 16 : 8;
}

static double fma_loop(long iters, int lanes) { return lanes == 16 ? fma_loop_zmm(iters) : fma_loop_ymm(iters); }

#ifdef UATTN_BENCH_BF16
int bench_has_bf16_dot(void) {
  const unsigned avx512f = 1u << 16, avx512bw = 1u << 30; /* the loop's broadcasts of 16-bit words need BW */
  unsigned sub, a, b, c, d;
  if (!has_zmm(avx512f | avx512bw, &sub) || sub < 1 || !__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
  return (int)(a >> 5 & 1); /* AVX512_BF16 */
}

/* 12 independent vdpbf16ps chains: Zen 4 issues one zmm vdpbf16ps a cycle at a latency of about 6 (6 chains
 * reach its peak; 4 give two thirds), so 12 leave room for a core that issues two. The unroll keeps the
 * accumulators in registers at -O2 too, where GCC 12 would leave the loop rolled over an array in memory
 * (half the rate). */
enum { BF16_CHAINS = 12 };
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static double bf16_dot_loop(long iters) {
  __m512 a[BF16_CHAINS];
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3380); /* 1, 2^-24 */
  for (int k = 0; k < BF16_CHAINS; k++) a[k] = _mm512_set1_ps((float)k);
  for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
    for (int k = 0; k < BF16_CHAINS; k++) a[k] = _mm512_dpbf16_ps(a[k], x, y);
  }
  __m512 s = a[0];
  for (int k = 1; k < BF16_CHAINS; k++) s = _mm512_add_ps(s, a[k]);
  return _mm512_reduce_add_ps(s);
}
#endif
#else
static double read_sum(const float *x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += x[i];
  return s;
}
static int fma_lanes(void) { return 1; }
static double fma_loop(long iters, int lanes) {
  (void)lanes;
  float a[12] = {0};
  for (long i = 0; i < iters; i++)
    for (int k = 0; k < 12; k++) a[k] = a[k] * 0.999999f + 1e-7f;
  return a[0];
}
#endif

#ifndef UATTN_BENCH_BF16
int bench_has_bf16_dot(void) { return 0; }
static double bf16_dot_loop(long iters) {
  (void)iters;
  return 0.0;
}
#define BF16_CHAINS 12
#endif

enum { FMA_ITERS = 20000000, BF16_ITERS = 10000000 };
#define BF16_FLOPS_PER_ITER (BF16_CHAINS * 16.0 * 4) /* chains of 16 lanes, 2 products and 2 adds per lane */

typedef struct limit_job {
  const float *data;
  size_t n;
  int threads;
  int fma_lanes;                           /* fma_loop's width */
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
  a->job->result[a->id] = fma_loop(FMA_ITERS, a->job->fma_lanes);
  return NULL;
}

static void *bf16_thread(void *p) {
  limit_arg *a = p;
  a->job->result[a->id] = bf16_dot_loop(BF16_ITERS);
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

int bench_measure_limits(bench_reader *r, int threads, int runs, bench_limits *out) {
  double *t = malloc(sizeof(double) * (size_t)runs);
  if (!t) return -1;
  out->threads = threads;
  out->bf16_dot = bench_has_bf16_dot();
  out->fma_lanes = r->job->fma_lanes = fma_lanes();
  out->bf16_gflops_1 = out->bf16_gflops_all = 0;
  for (int k = 0; k < 2; k++) {
    const int th = k == 0 ? 1 : threads;
    double gbs = 0;
    for (int i = 0; i < runs; i++) {
      const double g = bench_read_gbs(r, th);
      gbs = g > gbs ? g : gbs;
    }
    for (int i = 0; i < runs; i++) t[i] = run_threads(fma_thread, r->job, th);
    const double gflops =
        FMA_ITERS * 12.0 * 2 * out->fma_lanes * th / fastest(t, runs) * 1e-9; /* 12 chains, 2 flops a lane */
    *(k == 0 ? &out->read_gbs_1 : &out->read_gbs_all) = gbs;
    *(k == 0 ? &out->fma_gflops_1 : &out->fma_gflops_all) = gflops;
    if (out->bf16_dot) {
      for (int i = 0; i < runs; i++) t[i] = run_threads(bf16_thread, r->job, th);
      const double bf16 = BF16_ITERS * BF16_FLOPS_PER_ITER * th / fastest(t, runs) * 1e-9;
      *(k == 0 ? &out->bf16_gflops_1 : &out->bf16_gflops_all) = bf16;
    }
  }
  free(t);
  return 0;
}
