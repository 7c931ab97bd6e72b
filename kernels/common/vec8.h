/* 8-float vectors (AVX2 + FMA + F16C) under every x86 set, the twins included: the target attributes, the
 * exp and tanh whose bits the 16-lane forms reproduce, and horizontal sums and maxima in one stated order.
 * Everything here carries the AVX2 target attribute: nothing may run before uattn_avx2_runs_here() says yes
 * (the library itself is built for baseline x86-64). Include only on x86. */
#ifndef UATTN_COMMON_VEC8_H
#define UATTN_COMMON_VEC8_H

#include <immintrin.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "convert.h"
#include "kernels.h"

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
/* always_inline: the block size NB must be a compile-time constant in every kernel body for the tiles to
 * live in registers; the dispatch switches (ATTEND_BLOCKS, DECODE_BY_NB) instantiate one copy per NB. */
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* x, kept in a register where it is used: the empty asm hides where x came from and where it goes, so GCC can
 * neither fold the load that made it into every instruction that uses it (a memory operand, read again each
 * time: decode8.h's scores) nor keep it on the stack through a loop (softmax_row's sum). */
AVX2_INLINE __m256 in_register(__m256 x) {
  __asm__("" : "+x"(x));
  return x;
}
AVX2_INLINE __m256i in_register_si(__m256i x) {
  __asm__("" : "+x"(x));
  return x;
}

/* e^x in fp32, Cephes' expf: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so r is exact enough),
 * e^r by its degree-7 minimax form 1 + r + r^2 P(r), then 2^n. 2^n is applied in two halves so results down
 * to the subnormals are right (a single 2^n would need an exponent field below 1). Inputs below -110 give 0
 * (so do -inf, the masked scores), inputs above 88 are taken as 88; a NaN stays NaN (max_ps and min_ps give
 * their second operand where either is NaN: x is that operand), as the portable set's expf keeps it: a NaN
 * key's score must make its row NaN, not e^-110. */
AVX2_INLINE __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-110.0f), x));
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x); /* exact: the high part has 9 bits */
  r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i n = _mm256_cvtps_epi32(fx), n1 = _mm256_srai_epi32(n, 1), n2 = _mm256_sub_epi32(n, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
}

/* exp2_fms8's polynomial: 2^f on [-1/2, 1/2], fitted for relative error */
#define EXP2_C0 1.0000001192092896f
#define EXP2_C1 0.6931469440460205f
#define EXP2_C2 0.24022120237350464f
#define EXP2_C3 0.05550713092088699f
#define EXP2_C4 0.009675540961325169f
#define EXP2_C5 0.001327647129073739f
#define LOG2E_F 1.44269504088896341f
/* that polynomial at f by Horner's rule, for either vector width (FMADD and SET1 its operations) */
#define EXP2_POLY(FMADD, SET1, f)                                                                                      \
  FMADD(FMADD(FMADD(FMADD(FMADD(SET1(EXP2_C5), f, SET1(EXP2_C4)), f, SET1(EXP2_C3)), f, SET1(EXP2_C2)), f,             \
              SET1(EXP2_C1)),                                                                                          \
        f, SET1(EXP2_C0))

/* 2^(x c - mc) for the softmax's weights, from one FMA: the exponent t clamped to [-151, 128] (below, 0: every
 * result under 2^-150 rounds to it; a NaN stays NaN, min and max giving their second operand), t = n + f with n
 * the nearest integer, 2^f by a degree-5 polynomial on [-1/2, 1/2] (relative error 1.6e-7; 2.2e-7 with the fp32
 * evaluation and the rounding: test_kernels exp2_fms_is_within_its_stated_error_of_exp2), then times 2^n
 * rounded once, as AVX-512's vscalefps does: 2^n is two factors of at most 2^64 each, the first product exact. */
AVX2_INLINE __m256 exp2_fms8(__m256 x, __m256 c, __m256 mc) {
  __m256 t = _mm256_min_ps(_mm256_set1_ps(128.0f), _mm256_max_ps(_mm256_set1_ps(-151.0f), _mm256_fmsub_ps(x, c, mc)));
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(t, n);
  const __m256 p = EXP2_POLY(_mm256_fmadd_ps, _mm256_set1_ps, f);
  const __m256i k = _mm256_cvtps_epi32(n), k1 = _mm256_srai_epi32(k, 1), k2 = _mm256_sub_epi32(k, k1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

/* e^y in fp64 for y in [0, 40]: y = n ln2 + r, Taylor to degree 11 (error < 1e-14 on |r| <= ln2 / 2),
 * then 2^n built from n's bits (n + 1023 lands in the low mantissa bits of n + 1.5 * 2^52). */
AVX2_INLINE __m256d exp4d(__m256d y) {
  const __m256d n = _mm256_round_pd(_mm256_mul_pd(y, _mm256_set1_pd(1.4426950408889634)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(6.93147180369123816490e-01), y);
  r = _mm256_fnmadd_pd(n, _mm256_set1_pd(1.90821492927058770002e-10), r);
  static const double inv_fact[12] = {1.0,       1.0,        1.0 / 2,     1.0 / 6,      1.0 / 24,      1.0 / 120,
                                      1.0 / 720, 1.0 / 5040, 1.0 / 40320, 1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800};
  __m256d p = _mm256_set1_pd(inv_fact[11]);
  for (int k = 10; k >= 0; k--) p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(inv_fact[k]));
  const __m256i bits =
      _mm256_slli_epi64(_mm256_castpd_si256(_mm256_add_pd(n, _mm256_set1_pd(6755399441055744.0 + 1023.0))), 52);
  return _mm256_mul_pd(p, _mm256_castsi256_pd(bits));
}

/* tanh in fp64, rounded once to fp32: within half an ulp of the true value but for the rare near-ties,
 * so the soft cap is as exact as the scores it caps. |x| < 2^-10: the series to x^5 (next term < 1e-19
 * relative); otherwise 1 - 2 / (e^2|x| + 1), whose cancellation costs at most ~1e-13 there; |x| is capped at
 * 20, where tanh is 1 in fp64 already. */
AVX2_INLINE __m256d tanh4d(__m256d x) {
  const __m256d sign = _mm256_set1_pd(-0.0);
  /* min_pd's second operand where either is NaN: |x|, so a NaN score stays NaN (exp8's comment) */
  const __m256d a = _mm256_min_pd(_mm256_set1_pd(20.0), _mm256_andnot_pd(sign, x));
  const __m256d one = _mm256_set1_pd(1.0), two = _mm256_set1_pd(2.0);
  const __m256d big = _mm256_sub_pd(one, _mm256_div_pd(two, _mm256_add_pd(exp4d(_mm256_add_pd(a, a)), one)));
  const __m256d a2 = _mm256_mul_pd(a, a);
  const __m256d series = _mm256_fmadd_pd(
      _mm256_mul_pd(a, a2), _mm256_fmadd_pd(a2, _mm256_set1_pd(2.0 / 15.0), _mm256_set1_pd(-1.0 / 3.0)), a);
  const __m256d t = _mm256_blendv_pd(big, series, _mm256_cmp_pd(a, _mm256_set1_pd(0x1p-10), _CMP_LT_OQ));
  return _mm256_or_pd(t, _mm256_and_pd(sign, x));
}

AVX2_INLINE __m256 tanh8(__m256 x) {
  const __m128 lo = _mm256_cvtpd_ps(tanh4d(_mm256_cvtps_pd(_mm256_castps256_ps128(x))));
  const __m128 hi = _mm256_cvtpd_ps(tanh4d(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1))));
  return _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
}

AVX2_INLINE float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

AVX2_INLINE float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* Masked-off lanes: the last n % 8 elements of a vector op over n. */
AVX2_INLINE __m256i tail_mask(int32_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The 8 sums of a[0..7], in order: each level halves the vectors, adding 128-bit halves, then pairs of
 * lanes, then lanes. One operand of each add at the first two levels is a blend (any FP pipe): 8 shuffles in
 * all, where a hadd tree takes 14 (two a hadd, two to cross the halves). The tree puts input k's sum in lane
 * slot[k] (its own inverse), so input k is a[slot[k]]. */
AVX2_INLINE __m256 hsum8x8(const __m256 a[8]) {
  static const int slot[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  __m256 b[4], c[2];
  for (int k = 0; k < 4; k++) {
    const __m256 x = a[slot[k]], y = a[slot[k + 4]];
    b[k] = _mm256_add_ps(_mm256_blend_ps(x, y, 0xf0), _mm256_permute2f128_ps(x, y, 0x21));
  }
  for (int k = 0; k < 2; k++)
    c[k] = _mm256_add_ps(_mm256_blend_ps(b[k], b[k + 2], 0xcc),
                         _mm256_shuffle_ps(b[k], b[k + 2], _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm256_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

#endif
