/* uattn-experiments pipes: which instructions the decode kernels use beside vdpbf16ps compete with it for
 * the core's pipes. Each loop issues 12 independent vdpbf16ps zmm (enough chains to run them at their
 * throughput) and 6 of one other instruction, whose 6 results feed each other in a ring (so none is dead and
 * its latency stays below the dot products' time); against the loop of dot products alone, the time one of
 * them adds, in dot-product slots (0: it runs on pipes of its own; 1: it takes a dot product's place). A
 * machine without a PMU (a VM) says no more than this about where a kernel's cycles go. */
#include "experiments/pipes.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>

#define PIPES_TARGET __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi"), noinline))

typedef __m512 v;
typedef __m512i vi;

/* Six ops in a ring (r_d = OP(r_d, r_d+1)) beside the dot products (DOTS_EACH, below), and the compiler
 * barrier that keeps all 24 values live, in registers (named one by one: arrays stayed in memory). */
#define RING(r, OP)                                                                                                    \
  r##0 = OP(r##0, r##1, 0), r##1 = OP(r##1, r##2, 1), r##2 = OP(r##2, r##3, 2), r##3 = OP(r##3, r##4, 3),              \
  r##4 = OP(r##4, r##5, 4), r##5 = OP(r##5, r##0, 5)
#define KEEP()                                                                                                         \
  __asm__ volatile(""                                                                                                  \
                   : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7), "+v"(a8),         \
                     "+v"(a9), "+v"(a10), "+v"(a11));                                                                  \
  __asm__ volatile(""                                                                                                  \
                   : "+v"(f0), "+v"(f1), "+v"(f2), "+v"(f3), "+v"(f4), "+v"(f5), "+v"(s0), "+v"(s1), "+v"(s2),         \
                     "+v"(s3), "+v"(s4), "+v"(s5))

static float line[16] __attribute__((aligned(64))) = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static int32_t pairs[12]
    __attribute__((aligned(64))) = {0x3f803f80, 0x3f803f80, 0x3f803f80, 0x3f803f80, 0x3f803f80, 0x3f803f80,
                                    0x3f803f80, 0x3f803f80, 0x3f803f80, 0x3f803f80, 0x3f803f80, 0x3f803f80};

/* One function a kind. */
#define PIPES_FN(name, STEP)                                                                                           \
  PIPES_TARGET static void name(long iters, float *sink) {                                                             \
    v a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0,       \
      a10 = a0, a11 = a0;                                                                                              \
    v f0 = _mm512_set1_ps(1.0f), f1 = _mm512_set1_ps(2.0f), f2 = _mm512_set1_ps(3.0f), f3 = _mm512_set1_ps(4.0f),      \
      f4 = _mm512_set1_ps(5.0f), f5 = _mm512_set1_ps(6.0f);                                                            \
    vi s0 = _mm512_set1_epi32(1), s1 = _mm512_set1_epi32(2), s2 = _mm512_set1_epi32(3), s3 = _mm512_set1_epi32(4),     \
       s4 = _mm512_set1_epi32(5), s5 = _mm512_set1_epi32(6);                                                           \
    const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = x;                                                 \
    const vi w = _mm512_set1_epi16(3), b = _mm512_set1_epi8(5);                                                        \
    (void)w, (void)b;                                                                                                  \
    for (long i = 0; i < iters; i++) {                                                                                 \
      STEP;                                                                                                            \
      KEEP();                                                                                                          \
    }                                                                                                                  \
    v t = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),                                   \
                        _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));                                  \
    t = _mm512_add_ps(t, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));                               \
    t = _mm512_add_ps(                                                                                                 \
        t, _mm512_add_ps(_mm512_add_ps(f0, f1), _mm512_add_ps(f2, _mm512_add_ps(f3, _mm512_add_ps(f4, f5)))));         \
    t = _mm512_add_ps(t, _mm512_castsi512_ps(_mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(s0, s1), s2),          \
                                                              _mm512_add_epi32(_mm512_add_epi32(s3, s4), s5))));       \
    _mm512_storeu_ps(sink, t);                                                                                         \
  }

/* the ring's ops (d: the ring's place) */
#define PERMT2W(p, q, d) _mm512_permutex2var_epi16(p, w, q)
#define UNPACK(p, q, d) _mm512_unpacklo_epi16(p, q)
#define PERMB(p, q, d) _mm512_permutexvar_epi8(p, q)
#define PERMT2B(p, q, d) _mm512_permutex2var_epi8(p, b, q)
#define SHUF128(p, q, d) _mm512_shuffle_f32x4(p, q, 0x4e)
#define SHUFPS(p, q, d) _mm512_shuffle_ps(p, q, 0x4e)
#define BLEND(p, q, d) _mm512_mask_blend_ps(0xf0f0, p, q)
#define ADD(p, q, d) _mm512_add_ps(p, q)
#define MAXPS(p, q, d) _mm512_max_ps(p, q)
#define MUL(p, q, d) _mm512_mul_ps(p, q)
#define FMADD(p, q, d) _mm512_fmadd_ps(p, q, p)
#define CVT(p, q, d) _mm512_castsi512_ps((vi)_mm512_cvtne2ps_pbh(p, q))
#define SCALEF(p, q, d) _mm512_scalef_ps(p, q)
#define ROUND(p, q, d) _mm512_add_ps(_mm512_roundscale_ps(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), q)
#define BCAST_ADD(p, q, d) _mm512_add_ps(p, _mm512_set1_ps(line[(i + d) & 15])) /* vbroadcastss m32 into an add */
/* The 12 dot products of every loop, whose first operand is X(d): a register (IN_REG), or the query pair or P
 * broadcast by vdpbf16ps itself ({1to16}, BCAST), or by its own vpbroadcastd (LOADED, in asm: the compiler
 * would fold it into the product) */
#define DOTS_EACH(X, y)                                                                                                \
  a0 = _mm512_dpbf16_ps(a0, X(0), y), a1 = _mm512_dpbf16_ps(a1, X(1), y), a2 = _mm512_dpbf16_ps(a2, X(2), y),          \
  a3 = _mm512_dpbf16_ps(a3, X(3), y), a4 = _mm512_dpbf16_ps(a4, X(4), y), a5 = _mm512_dpbf16_ps(a5, X(5), y),          \
  a6 = _mm512_dpbf16_ps(a6, X(6), y), a7 = _mm512_dpbf16_ps(a7, X(7), y), a8 = _mm512_dpbf16_ps(a8, X(8), y),          \
  a9 = _mm512_dpbf16_ps(a9, X(9), y), a10 = _mm512_dpbf16_ps(a10, X(10), y), a11 = _mm512_dpbf16_ps(a11, X(11), y)
#define IN_REG(d) x
#define BCAST(d) (__m512bh) _mm512_set1_epi32(pairs[d])
#define LOADED(d)                                                                                                      \
  ({                                                                                                                   \
    vi r_;                                                                                                             \
    __asm__("vpbroadcastd %1, %0" : "=v"(r_) : "m"(pairs[d]));                                                         \
    (__m512bh) r_;                                                                                                     \
  })

PIPES_FN(dot, DOTS_EACH(IN_REG, y))
PIPES_FN(dot_bcast, DOTS_EACH(BCAST, y))
PIPES_FN(dot_loaded, DOTS_EACH(LOADED, y))
PIPES_FN(permt2w, DOTS_EACH(IN_REG, y); RING(s, PERMT2W))
PIPES_FN(unpack, DOTS_EACH(IN_REG, y); RING(s, UNPACK))
PIPES_FN(permb, DOTS_EACH(IN_REG, y); RING(s, PERMB))
PIPES_FN(permt2b, DOTS_EACH(IN_REG, y); RING(s, PERMT2B))
PIPES_FN(shuf128, DOTS_EACH(IN_REG, y); RING(f, SHUF128))
PIPES_FN(shufps, DOTS_EACH(IN_REG, y); RING(f, SHUFPS))
PIPES_FN(blend, DOTS_EACH(IN_REG, y); RING(f, BLEND))
PIPES_FN(add, DOTS_EACH(IN_REG, y); RING(f, ADD))
PIPES_FN(vmax, DOTS_EACH(IN_REG, y); RING(f, MAXPS))
PIPES_FN(mul, DOTS_EACH(IN_REG, y); RING(f, MUL))
PIPES_FN(fmadd, DOTS_EACH(IN_REG, y); RING(f, FMADD))
PIPES_FN(cvt, DOTS_EACH(IN_REG, y); RING(f, CVT))
PIPES_FN(scalef, DOTS_EACH(IN_REG, y); RING(f, SCALEF))
PIPES_FN(roundscale, DOTS_EACH(IN_REG, y); RING(f, ROUND))
PIPES_FN(bcast_add, DOTS_EACH(IN_REG, y); RING(f, BCAST_ADD))

static void (*const pipes_fn[PIPES_KINDS])(long, float *) = {
    [PIPES_DOT] = dot,
    [PIPES_DOT_BCAST] = dot_bcast,
    [PIPES_DOT_LOADED] = dot_loaded,
    [PIPES_PERMT2W] = permt2w,
    [PIPES_UNPACK] = unpack,
    [PIPES_PERMB] = permb,
    [PIPES_PERMT2B] = permt2b,
    [PIPES_SHUF128] = shuf128,
    [PIPES_SHUFPS] = shufps,
    [PIPES_BLEND] = blend,
    [PIPES_ADD] = add,
    [PIPES_MAX] = vmax,
    [PIPES_MUL] = mul,
    [PIPES_FMA] = fmadd,
    [PIPES_CVT] = cvt,
    [PIPES_SCALEF] = scalef,
    [PIPES_ROUND] = roundscale,
    [PIPES_BCAST_ADD] = bcast_add,
};

const char *const pipes_names[PIPES_KINDS] = {
    [PIPES_DOT] = "vdpbf16ps alone (12 a loop)",
    [PIPES_DOT_BCAST] = "vdpbf16ps {1to16} alone (12 a loop)",
    [PIPES_DOT_LOADED] = "vpbroadcastd m32, vdpbf16ps (12 a loop)",
    [PIPES_PERMT2W] = "vpermt2w",
    [PIPES_UNPACK] = "vpunpcklwd",
    [PIPES_PERMB] = "vpermb",
    [PIPES_PERMT2B] = "vpermt2b",
    [PIPES_SHUF128] = "vshuff32x4",
    [PIPES_SHUFPS] = "vshufps",
    [PIPES_BLEND] = "vblendmps",
    [PIPES_ADD] = "vaddps",
    [PIPES_MAX] = "vmaxps",
    [PIPES_MUL] = "vmulps",
    [PIPES_FMA] = "vfmadd",
    [PIPES_CVT] = "vcvtne2ps2bf16",
    [PIPES_SCALEF] = "vscalefps",
    [PIPES_ROUND] = "vrndscaleps + vaddps",
    [PIPES_BCAST_ADD] = "vbroadcastss m32 + vaddps",
};

void pipes_loop(int kind, long iters, float sink[16]) { pipes_fn[kind](iters, sink); }
#else
const char *const pipes_names[PIPES_KINDS] = {0};
void pipes_loop(int kind, long iters, float sink[16]) { /* never reached: the caller checks for AVX512-BF16 */
  (void)kind, (void)iters;
  sink[0] = 0.0f;
}
#endif
