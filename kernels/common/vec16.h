/* 16-float vectors for the avx512 set's kernels and the avx512bf16 (and so amx) set's, in one of two forms:
 *   AVX512_VEC_ZMM defined: a zmm register (__m512), every operation an AVX-512F instruction;
 *   otherwise, the twin: a pair of ymm registers (lanes 0-7, 8-15), every operation the same IEEE operation
 *   on each half with AVX2 + FMA + F16C.
 * Every operation here is exact to the bit in both forms: lane-wise IEEE operations (loads, FMA, add,
 * multiply, max, the bf16 and f16 widenings, exp8's steps), pure moves of lanes (shuffles, blends, permutes),
 * and horizontal steps that add or compare in one stated order (v16_fold adds lane i + 8 to lane i). So the twin
 * computes bit for bit what an AVX-512 CPU computes: the tests run the kernel's arithmetic through it on
 * machines without AVX-512, and where AVX-512 is present compare the two
 * (tests/kernels/test_kernels/avx512.c). What the twin cannot check is this file's zmm half: one intrinsic per
 * line.
 * Define AVX512_VEC_ZMM or not before the first include: it decides which form every 16-lane header takes. */
#ifndef UATTN_COMMON_VEC16_H
#define UATTN_COMMON_VEC16_H

#include "common/widen.h"

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
/* The first n lanes of p (all 16 from n = 16 on), zeros in the others, which are not read (they may lie past the
 * end of an array: the ragged end of a head dim or of a tile); the first n lanes of a stored to p; a with its
 * lanes from n on zeroed. */
V16_INLINE __mmask16 v16_mask_n(int32_t n) {
  return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1u);
}
V16_INLINE v16 v16_load_n(const float *p, int32_t n) { return _mm512_maskz_loadu_ps(v16_mask_n(n), p); }
V16_INLINE void v16_store_n(float *p, v16 a, int32_t n) { _mm512_mask_storeu_ps(p, v16_mask_n(n), a); }
V16_INLINE v16 v16_keep_n(v16 a, int32_t n) { return _mm512_maskz_mov_ps(v16_mask_n(n), a); }
/* lanes [lo, hi) of a, fill in the others */
V16_INLINE v16 v16_keep_range(v16 a, int32_t lo, int32_t hi, float fill) {
  return _mm512_mask_blend_ps(v16_mask_n(hi) & (__mmask16)~v16_mask_n(lo), _mm512_set1_ps(fill), a);
}
/* 32 bf16 elements: e = elements 0, 2, .., 30 as f32, o = 1, 3, .., 31 */
V16_INLINE void v16_widen_bf16_eo(const void *src, v16 *e, v16 *o) {
  const __m512i x = _mm512_loadu_si512(src);
  *e = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
  *o = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
}
/* 16 elements of dtype t as f32, in order (fp8 as common/widen.h's widen8_fp8, by F16C: exact) */
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

/* Moves for the decode kernels' reduction tree (common/decode_walk.h's v16_sum16) and avx512bf16/decode.h's order
 * of dims, each a pure move of lanes (the add an IEEE add), so the twin's copies below are exact. */
V16_INLINE v16 v16_add(v16 a, v16 b) { return _mm512_add_ps(a, b); }
/* 128-bit quarters: a's (IMM & 3), a's (IMM >> 2 & 3), b's (IMM >> 4 & 3), b's (IMM >> 6 & 3) (vshuff32x4) */
#define V16_SHUF128(a, b, IMM) _mm512_shuffle_f32x4(a, b, IMM)
/* within each 128-bit quarter: a's elements (IMM & 3), (IMM >> 2 & 3), b's (IMM >> 4 & 3), (IMM >> 6 & 3) */
#define V16_SHUFPS(a, b, IMM) _mm512_shuffle_ps(a, b, IMM)
/* lane i: b's where bit i of MASK is set, else a's (vblendmps, cheaper than a shuffle: avx512bf16/decode.h's
 * bf16_sum16) */
#define V16_BLEND(a, b, MASK) _mm512_mask_blend_ps((__mmask16)(MASK), a, b)
/* quarter K (lanes 4 K to 4 K + 3) of a to p */
#define V16_STORE_QUARTER(p, a, K) _mm_storeu_ps(p, _mm512_extractf32x4_ps(a, K))
/* lane i: element idx[i] of the 32 lanes lo, hi (vpermt2ps) */
V16_INLINE v16 v16_perm2(v16 lo, v16 hi, const int32_t *idx) {
  return _mm512_permutex2var_ps(lo, _mm512_loadu_si512(idx), hi);
}
/* For the softmax on 16 lanes (common/softmax16.h's, avx512/body.h's, avx512bf16/body.h's tiles'): lane-wise IEEE
 * operations. */
V16_INLINE v16 v16_sub(v16 a, v16 b) { return _mm512_sub_ps(a, b); }
V16_INLINE v16 v16_max(v16 a, v16 b) { return _mm512_max_ps(a, b); }
/* e^x: common/vec8.h's exp8 on 16 lanes, to the bit. Its 2^n as two multiplies (y 2^n1, exact, then 2^n2)
 * rounds once, which is what vscalefps does in one: the same result down to the subnormals. */
V16_INLINE v16 v16_exp(v16 x) {
  x = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(_mm512_set1_ps(-110.0f), x)); /* NaN stays NaN, as exp8 */
  const __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, fx);
}
/* exp2_fms8's function, 16 lanes: vrndscaleps and vscalefps (one rounding) */
V16_INLINE v16 v16_exp2_fms(v16 x, v16 c, v16 mc) {
  const v16 t =
      _mm512_min_ps(_mm512_set1_ps(128.0f), _mm512_max_ps(_mm512_set1_ps(-151.0f), _mm512_fmsub_ps(x, c, mc)));
  const v16 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const v16 f = _mm512_sub_ps(t, n);
  return _mm512_scalef_ps(EXP2_POLY(_mm512_fmadd_ps, _mm512_set1_ps, f), n);
}
/* the 16 lanes' maximum and sum (lane i + 8 with lane i first, then hmax8 / hsum8's order) */
V16_INLINE float v16_hmax(v16 a) {
  return hmax8(
      _mm256_max_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1))));
}
V16_INLINE float v16_hsum(v16 a) { return hsum8(v16_fold(a)); }

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
V16_INLINE v16 v16_load_n(const float *p, int32_t n) {
  return (v16){_mm256_maskload_ps(p, tail_mask(n)), _mm256_maskload_ps(p + 8, tail_mask(n - 8))};
}
V16_INLINE void v16_store_n(float *p, v16 a, int32_t n) {
  _mm256_maskstore_ps(p, tail_mask(n), a.lo), _mm256_maskstore_ps(p + 8, tail_mask(n - 8), a.hi);
}
V16_INLINE v16 v16_keep_n(v16 a, int32_t n) {
  return (v16){_mm256_and_ps(a.lo, _mm256_castsi256_ps(tail_mask(n))),
               _mm256_and_ps(a.hi, _mm256_castsi256_ps(tail_mask(n - 8)))};
}
V16_INLINE v16 v16_keep_range(v16 a, int32_t lo, int32_t hi, float fill) {
  const __m256 f = _mm256_set1_ps(fill);
  const __m256i in_lo = _mm256_andnot_si256(tail_mask(lo), tail_mask(hi));
  const __m256i in_hi = _mm256_andnot_si256(tail_mask(lo - 8), tail_mask(hi - 8));
  return (v16){_mm256_blendv_ps(f, a.lo, _mm256_castsi256_ps(in_lo)),
               _mm256_blendv_ps(f, a.hi, _mm256_castsi256_ps(in_hi))};
}
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
V16_INLINE v16 v16_add(v16 a, v16 b) { return (v16){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
/* vshuff32x4's quarters: lo = quarters 0, 1, hi = 2, 3 */
V16_INLINE __m128 v16_quarter(v16 a, int k) {
  const __m256 h = k < 2 ? a.lo : a.hi;
  return k % 2 ? _mm256_extractf128_ps(h, 1) : _mm256_castps256_ps128(h);
}
V16_INLINE v16 v16_shuf128(v16 a, v16 b, int imm) {
  return (v16){_mm256_set_m128(v16_quarter(a, imm >> 2 & 3), v16_quarter(a, imm & 3)),
               _mm256_set_m128(v16_quarter(b, imm >> 6 & 3), v16_quarter(b, imm >> 4 & 3))};
}
#define V16_SHUF128(a, b, IMM) v16_shuf128(a, b, IMM)
#define V16_STORE_QUARTER(p, a, K) _mm_storeu_ps(p, v16_quarter(a, K))
/* vshufps works within 128-bit lanes, the same on ymm halves */
#define V16_SHUFPS(a, b, IMM) ((v16){_mm256_shuffle_ps((a).lo, (b).lo, IMM), _mm256_shuffle_ps((a).hi, (b).hi, IMM)})
#define V16_BLEND(a, b, MASK)                                                                                          \
  ((v16){_mm256_blend_ps((a).lo, (b).lo, 0xff & (MASK)), _mm256_blend_ps((a).hi, (b).hi, 0xff & (MASK) >> 8)})
V16_INLINE v16 v16_perm2(v16 lo, v16 hi, const int32_t *idx) {
  _Alignas(32) float t[32], r[16];
  v16_store(t, lo), v16_store(t + 16, hi);
  for (int i = 0; i < 16; i++) r[i] = t[idx[i] & 31];
  return v16_load(r);
}
V16_INLINE v16 v16_sub(v16 a, v16 b) { return (v16){_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
V16_INLINE v16 v16_max(v16 a, v16 b) { return (v16){_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
V16_INLINE v16 v16_exp(v16 x) { return (v16){exp8(x.lo), exp8(x.hi)}; }
V16_INLINE v16 v16_exp2_fms(v16 x, v16 c, v16 mc) {
  return (v16){exp2_fms8(x.lo, c.lo, mc.lo), exp2_fms8(x.hi, c.hi, mc.hi)};
}
V16_INLINE float v16_hmax(v16 a) { return hmax8(_mm256_max_ps(a.lo, a.hi)); }
V16_INLINE float v16_hsum(v16 a) { return hsum8(v16_fold(a)); }

#endif

#endif
