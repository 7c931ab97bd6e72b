/* uattn-experiments overlap: how much of a compute load a cold walk over memory hides, measured with a
 * synthetic load so that only the walk's reading differs. A decode kernel reads a share of keys then a share
 * of values and computes on every line; on one core its time is the memory's only where the compute hides
 * behind the reads. The walks here read as the decode kernels do, in 4 KB shares, keys then values, with
 * each line fed to a fixed number of FMAs:
 *   two streams   keys and values in two regions far apart (NHD, HND and TILED caches: two tensors);
 *   + asks        the same, each line asking for its place in the next share into L1 (the kernels' way);
 *   one stream    each share's values right after its keys, the walk one ascending stream.
 * Hot (the same 4 shares again and again) says what the compute costs alone; a cold walk's time against the
 * plain read's says what share of the bandwidth a kernel with that much compute can reach at best. */
#include "experiments/overlap.h"

/* The compute loads, each X(W, FMAS): W FMAs a line, written out as FMAS (FMA4(g): 4 of them into group g of
 * the 12 accumulators, below; the groups taken in turn). With none, each line is folded into a sum (a multiply
 * and an add), so that nothing read is dead. */
#define OVERLAP_LOADS(X)                                                                                               \
  X(0, a00 = _mm256_add_ps(a00, _mm256_add_ps(_mm256_mul_ps(x0, c), x1)))                                              \
  X(8, FMA4(0); FMA4(1))                                                                                               \
  X(12, FMA12)                                                                                                         \
  X(16, FMA12; FMA4(0))                                                                                                \
  X(20, FMA12; FMA4(0); FMA4(1))                                                                                       \
  X(24, FMA12; FMA12)                                                                                                  \
  X(36, FMA12; FMA12; FMA12)

#define OVERLAP_WORK(W, FMAS) W,
const int overlap_work[OVERLAP_WORKS] = {OVERLAP_LOADS(OVERLAP_WORK)};

#if defined(__x86_64__)
#include <immintrin.h>

#define OVERLAP_TARGET __attribute__((target("avx2,fma"), noinline))

/* 12 accumulators as named values (an array stayed in memory) in three groups of four, FMA4(g) feeding group g
 * from both halves of a line: a line's FMAs go round the groups, so that 12 chains run side by side */
#define FMA4(g)                                                                                                        \
  a##g##0 = _mm256_fmadd_ps(x0, c, a##g##0), a##g##1 = _mm256_fmadd_ps(x1, c, a##g##1),                                \
  a##g##2 = _mm256_fmadd_ps(x0, c, a##g##2), a##g##3 = _mm256_fmadd_ps(x1, c, a##g##3)

/* One walk a compute load, its FMAs written out around the line's loads. */
#define OVERLAP_WALK_FN(W, FMAS)                                                                                       \
  OVERLAP_TARGET static void walk_##W(const char *k, const char *v, size_t step, size_t shares, size_t mask, bool ask, \
                                      float sink[8]) {                                                                 \
    /* 12 different values, or the compiler sees equal chains and keeps one */                                         \
    __m256 a00 = _mm256_set1_ps(0), a01 = _mm256_set1_ps(1), a02 = _mm256_set1_ps(2), a03 = _mm256_set1_ps(3),         \
           a10 = _mm256_set1_ps(4), a11 = _mm256_set1_ps(5), a12 = _mm256_set1_ps(6), a13 = _mm256_set1_ps(7),         \
           a20 = _mm256_set1_ps(8), a21 = _mm256_set1_ps(9), a22 = _mm256_set1_ps(10), a23 = _mm256_set1_ps(11);       \
    const __m256 c = _mm256_set1_ps(0x1p-20f);                                                                         \
    for (size_t s = 0; s < shares; s++)                                                                                \
      for (int half = 0; half < 2; half++) {                                                                           \
        const char *p = (half ? v : k) + (s & mask) * step;                                                            \
        for (size_t o = 0; o < OVERLAP_SHARE; o += 64) {                                                               \
          if (ask) _mm_prefetch(p + step + o, _MM_HINT_T0);                                                            \
          const __m256 x0 = _mm256_load_ps((const float *)(p + o)), x1 = _mm256_load_ps((const float *)(p + o + 32));  \
          FMAS;                                                                                                        \
        }                                                                                                              \
      }                                                                                                                \
    const __m256 g0 = _mm256_add_ps(_mm256_add_ps(a00, a01), _mm256_add_ps(a02, a03));                                 \
    const __m256 g1 = _mm256_add_ps(_mm256_add_ps(a10, a11), _mm256_add_ps(a12, a13));                                 \
    const __m256 g2 = _mm256_add_ps(_mm256_add_ps(a20, a21), _mm256_add_ps(a22, a23));                                 \
    _mm256_storeu_ps(sink, _mm256_add_ps(g0, _mm256_add_ps(g1, g2)));                                                  \
  }
#define FMA12 FMA4(0), FMA4(1), FMA4(2)
OVERLAP_LOADS(OVERLAP_WALK_FN)
#define OVERLAP_WALK_NAME(W, FMAS) walk_##W,

void overlap_walk(int w, const char *k, const char *v, size_t step, size_t shares, size_t mask, bool ask,
                  float sink[8]) {
  static void (*const walk[OVERLAP_WORKS])(const char *, const char *, size_t, size_t, size_t, bool,
                                           float *) = {OVERLAP_LOADS(OVERLAP_WALK_NAME)};
  walk[w](k, v, step, shares, mask, ask, sink);
}

#else /* builds anywhere; main() refuses a CPU without AVX2 before any walk */
void overlap_walk(int w, const char *k, const char *v, size_t step, size_t shares, size_t mask, bool ask,
                  float sink[8]) {
  (void)w, (void)v, (void)step, (void)shares, (void)mask, (void)ask;
  sink[0] = (float)k[0];
}
#endif
