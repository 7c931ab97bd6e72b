/* 16-float vectors for the avx512 set's decode kernel (avx512/decode.h), in one of two forms:
 *   AVX512_VEC_ZMM defined: a zmm register (__m512), every operation an AVX-512F instruction;
 *   otherwise, the twin: a pair of ymm registers (lanes 0-7, 8-15), every operation the same IEEE operation
 *   on each half with AVX2 + FMA + F16C.
 * Every operation here is lane-wise and exact to the bit in both forms (loads, FMA, multiply, the bf16 and
 * f16 widenings), and the one horizontal step, v16_fold, adds lane i + 8 to lane i in both. So the twin
 * computes bit for bit what an AVX-512 CPU computes: the tests run the kernel's arithmetic through it on
 * machines without AVX-512 (this project's), and where AVX-512 is present compare the two
 * (tests/kernels/test_kernels.c). What the twin cannot check is this file's zmm half: one intrinsic per line.
 * Include after avx2/body.h (the twin's widenings are its widen8). */
#ifndef UATTN_AVX512_VEC_H
#define UATTN_AVX512_VEC_H

#include "avx2/body.h"

#if defined(AVX512_VEC_ZMM)

#define AVX512_TARGET __attribute__((target("avx512f,avx2,fma,f16c")))
#define V16_INLINE static inline __attribute__((always_inline, target("avx512f,avx2,fma,f16c")))

typedef __m512 v16;

V16_INLINE v16 v16_zero(void) { return _mm512_setzero_ps(); }
V16_INLINE v16 v16_set1(float x) { return _mm512_set1_ps(x); }
V16_INLINE v16 v16_load(const float *p) { return _mm512_loadu_ps(p); }
V16_INLINE void v16_store(float *p, v16 a) { _mm512_storeu_ps(p, a); }
V16_INLINE v16 v16_fmadd(v16 a, v16 b, v16 c) { return _mm512_fmadd_ps(a, b, c); }
V16_INLINE v16 v16_mul(v16 a, v16 b) { return _mm512_mul_ps(a, b); }
/* 32 bf16 elements: e = elements 0, 2, .., 30 as f32, o = 1, 3, .., 31 */
V16_INLINE void v16_widen_bf16_eo(const void *src, v16 *e, v16 *o) {
  const __m512i x = _mm512_loadu_si512(src);
  *e = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
  *o = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
}
/* 16 elements of dtype t as f32, in order (fp8 as avx2/body.h's widen8_fp8, by F16C: exact) */
V16_INLINE v16 v16_widen(uattn_dtype t, const void *src) {
  if (t == UATTN_F32) return _mm512_loadu_ps(src);
  if (uattn_dtype_is_fp8(t)) {
    const __m256i h = _mm256_cvtepu8_epi16(_mm_loadu_si128(src));
    if (t == UATTN_FP8_E5M2) return _mm512_cvtph_ps(_mm256_slli_epi16(h, 8));
    const __m256i mag = _mm256_and_si256(h, _mm256_set1_epi16(0x7f));
    const __m256i f16 =
        _mm256_or_si256(_mm256_slli_epi16(mag, 7), _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x80)), 8));
    const __m512 x = _mm512_mul_ps(_mm512_cvtph_ps(f16), _mm512_set1_ps(256.0f));
    /* AVX-512F only (the set's target): the NaN codes compared as 32-bit lanes, the quiet NaN bits or'ed in */
    const __mmask16 nan = _mm512_cmpeq_epi32_mask(_mm512_cvtepu16_epi32(mag), _mm512_set1_epi32(0x7f));
    return _mm512_castsi512_ps(
        _mm512_mask_or_epi32(_mm512_castps_si512(x), nan, _mm512_castps_si512(x), _mm512_set1_epi32(0x7fc00000)));
  }
  const __m256i h = _mm256_loadu_si256(src);
  if (t == UATTN_F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
/* lanes i + 8 added to lanes i */
V16_INLINE __m256 v16_fold(v16 a) {
  return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

#else /* the twin */

#define AVX512_TARGET AVX2_TARGET
#define V16_INLINE AVX2_INLINE

typedef struct v16 {
  __m256 lo, hi;
} v16;

V16_INLINE v16 v16_zero(void) { return (v16){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
V16_INLINE v16 v16_set1(float x) { return (v16){_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
V16_INLINE v16 v16_load(const float *p) { return (v16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
V16_INLINE void v16_store(float *p, v16 a) { _mm256_storeu_ps(p, a.lo), _mm256_storeu_ps(p + 8, a.hi); }
V16_INLINE v16 v16_fmadd(v16 a, v16 b, v16 c) {
  return (v16){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
V16_INLINE v16 v16_mul(v16 a, v16 b) { return (v16){_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
V16_INLINE void v16_widen_bf16_eo(const void *src, v16 *e, v16 *o) {
  const __m256i mask = _mm256_set1_epi32((int)0xffff0000u);
  const __m256i x0 = _mm256_loadu_si256(src), x1 = _mm256_loadu_si256((const __m256i *)src + 1);
  *e = (v16){_mm256_castsi256_ps(_mm256_slli_epi32(x0, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(x1, 16))};
  *o = (v16){_mm256_castsi256_ps(_mm256_and_si256(x0, mask)), _mm256_castsi256_ps(_mm256_and_si256(x1, mask))};
}
V16_INLINE v16 v16_widen(uattn_dtype t, const void *src) {
  return (v16){widen8(t, src), widen8(t, (const char *)src + 8 * uattn_dtype_size(t))};
}
V16_INLINE __m256 v16_fold(v16 a) { return _mm256_add_ps(a.lo, a.hi); }

#endif

#endif
