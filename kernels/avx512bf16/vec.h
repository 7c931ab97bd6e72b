/* bf16 pairs for the avx512bf16 set: 16 lanes of 32 bits, each a pair of bf16 (element 0 in the low half),
 * and the dot product of two such vectors into 16 fp32 accumulators, in common/vec16.h's two forms:
 *   AVX512_VEC_ZMM defined: a zmm register and vdpbf16ps (AVX512-BF16);
 *   otherwise, the twin: a pair of ymm registers and an exact emulation of vdpbf16ps with AVX2 + FMA.
 * vdpbf16ps computes, per lane, acc + a1 b1, then + a0 b0 (the odd elements first: Intel's pseudocode, and
 * what a Zen 4 does, checked on 32 million random lanes with normal, tiny and denormal inputs), each step an
 * fp32 FMA rounded to nearest even, with denormal inputs (accumulator included) taken as zero and denormal
 * results flushed to zero, whatever MXCSR says. A product of two bf16 (8-bit significands) is exact in
 * fp32, so each step is one IEEE FMA: the twin does exactly those two FMAs per lane, with the flushes, and
 * computes the zmm kernel's bits (tests/kernels/test_kernels/avx512.c holds one to the other where AVX512-BF16
 * runs). Its one assumption: MXCSR with neither DAZ nor FTZ set (the default), so its own FMAs round denormals
 * as IEEE does before it flushes them. (A result that is denormal before rounding and FLT_MIN after it is left at
 * FLT_MIN; attention's scores and weights are nowhere near that range.)
 * Rounding fp32 to bf16 (the query and P, vdpbf16ps's operands) is vcvtneps2bf16's: to nearest even, NaN
 * quieted, denormal inputs taken as a zero of their sign (vdpbf16ps would read a denormal bf16 as zero anyway;
 * only an fp32 just under FLT_MIN, which convert.h's rounding takes up to FLT_MIN, comes out otherwise). One
 * instruction for 16 floats in the zmm form, where convert.h's rounding took 9; the twin emulates it, and the
 * tests hold the two to each other. round8_bf16 below (convert.h's rounding) serves P kept as floats.
 * Include after common/vec16.h's decision (AVX512_VEC_ZMM or not). */
#ifndef UATTN_AVX512BF16_VEC_H
#define UATTN_AVX512BF16_VEC_H

#include "common/vec16.h"

#if defined(AVX512_VEC_ZMM)

#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,avx512bf16,avx2,fma,f16c")))
#define BF16_INLINE                                                                                                    \
  static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512vbmi,avx512bf16,avx2,fma,"       \
                                                     "f16c")))

typedef __m512i v16i;

BF16_INLINE v16i v16i_load(const void *p) { return _mm512_loadu_si512(p); }
BF16_INLINE v16i v16i_set1(uint32_t x) { return _mm512_set1_epi32((int)x); }
/* per lane: acc + a1 b1 + a0 b0, vdpbf16ps's rounding (see above) */
BF16_INLINE v16 v16_dpbf16(v16 acc, v16i a, v16i b) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }
/* v16_dpbf16(acc, v16i_set1(*b), a), bit for bit (each lane's products commute), with the pair at b broadcast
 * by the instruction itself ({1to16}): one instruction where GCC 12 emits a broadcast load and the product
 * (it does not fold the broadcast into vdpbf16ps), which lets a stream hold more lines in flight
 * (decode_tiled.h). Written in asm for that reason alone. */
BF16_INLINE v16 v16_dpbf16_bcast(v16 acc, v16i a, const uint32_t *b) {
  __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*b));
  return acc;
}
/* the pairs' elements 0 (lo) and 1 (hi) as f32 */
BF16_INLINE v16 v16i_lo(v16i x) { return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)); }
BF16_INLINE v16 v16i_hi(v16i x) {
  return _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
}
/* 16-bit elements of a and b interleaved into pairs within each 128-bit lane (the lane's low 4, high 4) */
BF16_INLINE v16i v16i_unpacklo16(v16i a, v16i b) { return _mm512_unpacklo_epi16(a, b); }
BF16_INLINE v16i v16i_unpackhi16(v16i a, v16i b) { return _mm512_unpackhi_epi16(a, b); }
/* 16 floats rounded to bf16 by vcvtneps2bf16 (see the top), as 8 pairs in order (element 2k in the low half of
 * pair k) */
BF16_INLINE __m256i v16_pairs_bf16(v16 x) { return (__m256i)_mm512_cvtneps_pbh(x); }
BF16_INLINE v16i v16i_unpacklo8(v16i a, v16i b) { return _mm512_unpacklo_epi8(a, b); }
BF16_INLINE v16i v16i_unpackhi8(v16i a, v16i b) { return _mm512_unpackhi_epi8(a, b); }
/* 64 fp8 codes (bytes of x) as bf16, by two vpermi2b lookups on the 7-bit magnitude (vpermi2b ignores index
 * bit 7) into tab (fp8_bf16_table: the low bytes, then the high bytes, 128 each), the sign OR'd into the
 * high byte, the bytes then unpacked within each 128-bit lane: *a holds codes 16 j + [0, 8) of lane j, *b
 * codes 16 j + [8, 16), as pairs (lane 4 j + m of *a: codes 16 j + 2 m, + 1; of *b: 16 j + 8 + 2 m, + 1). */
BF16_INLINE void v16i_fp8_widen(v16i x, const uint8_t *tab, v16i *a, v16i *b) {
  const __m512i lo = _mm512_permutex2var_epi8(_mm512_load_si512(tab), x, _mm512_load_si512(tab + 64));
  __m512i hi = _mm512_permutex2var_epi8(_mm512_load_si512(tab + 128), x, _mm512_load_si512(tab + 192));
  hi = _mm512_ternarylogic_epi32(hi, x, _mm512_set1_epi8((char)0x80), 0xf8); /* hi | (x & 0x80) */
  *a = _mm512_unpacklo_epi8(lo, hi), *b = _mm512_unpackhi_epi8(lo, hi);
}

/* For the TILED layout's decode (avx512bf16/decode_tiled.h): */
/* 64 fp8 codes in their order as bf16 (v16i_fp8_widen's lookups), the words then put in order by two
 * vpermt2b (where v16i_fp8_widen's unpacks leave them in each 128-bit lane's order): *a codes 0-31, *b 32-63 */
BF16_INLINE void v16i_fp8_widen_in_order(v16i x, const uint8_t *tab, v16i *a, v16i *b) {
  static const uint8_t order[2][64] __attribute__((aligned(64))) = {
#define FP8_WORD(i) i, 64 + i /* the low byte from the low bytes' lookup, the high from the high bytes' */
      {FP8_WORD(0),  FP8_WORD(1),  FP8_WORD(2),  FP8_WORD(3),  FP8_WORD(4),  FP8_WORD(5),  FP8_WORD(6),  FP8_WORD(7),
       FP8_WORD(8),  FP8_WORD(9),  FP8_WORD(10), FP8_WORD(11), FP8_WORD(12), FP8_WORD(13), FP8_WORD(14), FP8_WORD(15),
       FP8_WORD(16), FP8_WORD(17), FP8_WORD(18), FP8_WORD(19), FP8_WORD(20), FP8_WORD(21), FP8_WORD(22), FP8_WORD(23),
       FP8_WORD(24), FP8_WORD(25), FP8_WORD(26), FP8_WORD(27), FP8_WORD(28), FP8_WORD(29), FP8_WORD(30), FP8_WORD(31)},
      {FP8_WORD(32), FP8_WORD(33), FP8_WORD(34), FP8_WORD(35), FP8_WORD(36), FP8_WORD(37), FP8_WORD(38), FP8_WORD(39),
       FP8_WORD(40), FP8_WORD(41), FP8_WORD(42), FP8_WORD(43), FP8_WORD(44), FP8_WORD(45), FP8_WORD(46), FP8_WORD(47),
       FP8_WORD(48), FP8_WORD(49), FP8_WORD(50), FP8_WORD(51), FP8_WORD(52), FP8_WORD(53), FP8_WORD(54), FP8_WORD(55),
       FP8_WORD(56), FP8_WORD(57), FP8_WORD(58), FP8_WORD(59), FP8_WORD(60), FP8_WORD(61), FP8_WORD(62), FP8_WORD(63)}};
#undef FP8_WORD
  const __m512i lo = _mm512_permutex2var_epi8(_mm512_load_si512(tab), x, _mm512_load_si512(tab + 64));
  __m512i hi = _mm512_permutex2var_epi8(_mm512_load_si512(tab + 128), x, _mm512_load_si512(tab + 192));
  hi = _mm512_ternarylogic_epi32(hi, x, _mm512_set1_epi8((char)0x80), 0xf8); /* hi | (x & 0x80) */
  *a = _mm512_permutex2var_epi8(lo, _mm512_load_si512(order[0]), hi);
  *b = _mm512_permutex2var_epi8(lo, _mm512_load_si512(order[1]), hi);
}
/* x AND m in every lane */
BF16_INLINE v16i v16i_and32(v16i x, uint32_t m) { return _mm512_and_si512(x, _mm512_set1_epi32((int)m)); }
/* the lanes of x whose bit is set in mask to p (the others' memory untouched) */
BF16_INLINE void v16_store_lanes(float *p, v16 x, uint32_t mask) { _mm512_mask_storeu_ps(p, (__mmask16)mask, x); }

#else /* the twin */

#define BF16_TARGET AVX2_TARGET
#define BF16_INLINE AVX2_INLINE

typedef struct v16i {
  __m256i lo, hi;
} v16i;

BF16_INLINE v16i v16i_load(const void *p) {
  return (v16i){_mm256_loadu_si256(p), _mm256_loadu_si256((const __m256i *)p + 1)};
}
BF16_INLINE v16i v16i_set1(uint32_t x) { return (v16i){_mm256_set1_epi32((int)x), _mm256_set1_epi32((int)x)}; }

/* x with denormals replaced by a zero of their sign */
BF16_INLINE __m256 daz8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i tiny = _mm256_cmpeq_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7f800000)), _mm256_setzero_si256());
  return _mm256_castsi256_ps(_mm256_blendv_epi8(u, _mm256_and_si256(u, _mm256_set1_epi32((int)0x80000000u)), tiny));
}

/* vdpbf16ps on 8 lanes: the odd pair's FMA, then the even pair's, each with its flushes */
BF16_INLINE __m256 dpbf16_8(__m256 acc, __m256i a, __m256i b) {
  const __m256i top = _mm256_set1_epi32((int)0xffff0000u);
  const __m256 a1 = daz8(_mm256_castsi256_ps(_mm256_and_si256(a, top)));
  const __m256 b1 = daz8(_mm256_castsi256_ps(_mm256_and_si256(b, top)));
  const __m256 a0 = daz8(_mm256_castsi256_ps(_mm256_slli_epi32(a, 16)));
  const __m256 b0 = daz8(_mm256_castsi256_ps(_mm256_slli_epi32(b, 16)));
  acc = daz8(_mm256_fmadd_ps(a1, b1, daz8(acc)));
  return daz8(_mm256_fmadd_ps(a0, b0, acc));
}

BF16_INLINE v16 v16_dpbf16(v16 acc, v16i a, v16i b) {
  return (v16){dpbf16_8(acc.lo, a.lo, b.lo), dpbf16_8(acc.hi, a.hi, b.hi)};
}
BF16_INLINE v16 v16_dpbf16_bcast(v16 acc, v16i a, const uint32_t *b) { return v16_dpbf16(acc, v16i_set1(*b), a); }
BF16_INLINE v16 v16i_lo(v16i x) {
  return (v16){_mm256_castsi256_ps(_mm256_slli_epi32(x.lo, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(x.hi, 16))};
}
BF16_INLINE v16 v16i_hi(v16i x) {
  const __m256i top = _mm256_set1_epi32((int)0xffff0000u);
  return (v16){_mm256_castsi256_ps(_mm256_and_si256(x.lo, top)), _mm256_castsi256_ps(_mm256_and_si256(x.hi, top))};
}
BF16_INLINE v16i v16i_unpacklo16(v16i a, v16i b) {
  return (v16i){_mm256_unpacklo_epi16(a.lo, b.lo), _mm256_unpacklo_epi16(a.hi, b.hi)};
}
BF16_INLINE v16i v16i_unpackhi16(v16i a, v16i b) {
  return (v16i){_mm256_unpackhi_epi16(a.lo, b.lo), _mm256_unpackhi_epi16(a.hi, b.hi)};
}
BF16_INLINE v16i v16i_unpacklo8(v16i a, v16i b) {
  return (v16i){_mm256_unpacklo_epi8(a.lo, b.lo), _mm256_unpacklo_epi8(a.hi, b.hi)};
}
BF16_INLINE v16i v16i_unpackhi8(v16i a, v16i b) {
  return (v16i){_mm256_unpackhi_epi8(a.lo, b.lo), _mm256_unpackhi_epi8(a.hi, b.hi)};
}
/* the zmm form's lookups as table indexing, its lane order written out: word 8 j + w of *a is code 16 j + w,
 * of *b code 16 j + 8 + w */
BF16_INLINE void v16i_fp8_widen(v16i v, const uint8_t *tab, v16i *a, v16i *b) {
  _Alignas(32) uint8_t x[64];
  _mm256_store_si256((__m256i *)x, v.lo), _mm256_store_si256((__m256i *)x + 1, v.hi);
  _Alignas(32) uint16_t w[2][32];
  for (int j = 0; j < 4; j++)
    for (int h = 0; h < 2; h++)
      for (int k = 0; k < 8; k++) {
        const uint8_t c = x[16 * j + 8 * h + k];
        w[h][8 * j + k] = (uint16_t)(tab[c & 0x7f] | (tab[128 + (c & 0x7f)] | (c & 0x80)) << 8);
      }
  *a = v16i_load(w[0]), *b = v16i_load(w[1]);
}

/* the zmm form's v16i_fp8_widen_in_order: word w of *a is code w, of *b code 32 + w */
BF16_INLINE void v16i_fp8_widen_in_order(v16i v, const uint8_t *tab, v16i *a, v16i *b) {
  _Alignas(32) uint8_t x[64];
  _mm256_store_si256((__m256i *)x, v.lo), _mm256_store_si256((__m256i *)x + 1, v.hi);
  _Alignas(32) uint16_t w[64];
  for (int k = 0; k < 64; k++) w[k] = (uint16_t)(tab[x[k] & 0x7f] | (tab[128 + (x[k] & 0x7f)] | (x[k] & 0x80)) << 8);
  *a = v16i_load(w), *b = v16i_load(w + 32);
}
BF16_INLINE v16i v16i_and32(v16i x, uint32_t m) {
  const __m256i y = _mm256_set1_epi32((int)m);
  return (v16i){_mm256_and_si256(x.lo, y), _mm256_and_si256(x.hi, y)};
}
BF16_INLINE void v16_store_lanes(float *p, v16 x, uint32_t mask) {
  _Alignas(32) float t[16];
  v16_store(t, x);
  for (int i = 0; i < 16; i++)
    if (mask >> i & 1) p[i] = t[i];
}

#endif

/* ---- rounding to bf16: one code for both forms ---------------------------------------------------------- */

/* x rounded to bf16, as the f32 bits of that bf16 (low halves zero): uattn_f32_to_bf16's rounding */
AVX2_INLINE __m256i round8_bf16(__m256 x) {
  const __m256i u = _mm256_castps_si256(x), top = _mm256_set1_epi32((int)0xffff0000u);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  const __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
  return _mm256_and_si256(_mm256_blendv_epi8(r, quiet, nan), top);
}

#if !defined(AVX512_VEC_ZMM)
/* the zmm form's v16_pairs_bf16 (vcvtneps2bf16): each half's denormals to zeros, rounded, its high halves
 * packed, the 128-bit lanes put in order */
AVX2_INLINE __m256i v16_pairs_bf16(v16 x) {
  const __m256i p = _mm256_packus_epi32(_mm256_srli_epi32(round8_bf16(daz8(x.lo)), 16),
                                        _mm256_srli_epi32(round8_bf16(daz8(x.hi)), 16));
  return _mm256_permute4x64_epi64(p, 0xd8);
}
#endif

/* One float rounded as v16_pairs_bf16 rounds (vcvtneps2bf16), for ragged ends. */
static inline uint16_t bf16_of_daz(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return (u & 0x7f800000u) ? uattn_f32_to_bf16(x) : (uint16_t)(u >> 16 & 0x8000u);
}

/* The pair of two floats, each rounded as above. */
static inline uint32_t pair_bf16(float e, float o) { return (uint32_t)bf16_of_daz(e) | (uint32_t)bf16_of_daz(o) << 16; }

/* n floats (n even) to n / 2 pairs. */
BF16_INLINE void pairs_bf16(const float *a, int32_t n, uint32_t *out) {
  int32_t i = 0;
  for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(out + i / 2), v16_pairs_bf16(v16_load(a + i)));
  for (; i < n; i += 2) out[i / 2] = pair_bf16(a[i], a[i + 1]);
}

/* The tables of v16i_fp8_widen: the low bytes of the bf16 of each fp8 magnitude code c (0-127), then the high
 * bytes. Every fp8 value is exact in bf16 (3 or 2 mantissa bits; exponents and subnormals within bf16's normal
 * range), so each entry is a constant expression of c, as convert.c's fp32 tables are: data from the start,
 * since building them in each decode call (128 conversions) costs a visible share of a short HND call.
 *   E4M3 (bias 7): e = 1..15: exponent e + 120, mantissa m << 4; e = 0: m * 2^-9; S.1111.111 NaN (0x7fc0).
 *   E5M2 (bias 15): e = 1..30: exponent e + 112, mantissa m << 5; e = 0: m * 2^-16; e = 31: inf (m = 0),
 *   else NaN. A subnormal m * 2^-s is 2^lg(m) * (m / 2^lg(m)): exponent 127 - s + lg(m), mantissa m's bits
 *   below its leading one. The test avx512bf16_fp8_widening_is_exact_for_every_code holds them to convert.h. */
#define FP8_LG(m) ((m) >= 4 ? 2 : (m) >= 2 ? 1 : 0)
#define FP8_SUB_BF16(m, s) ((m) ? (127 - (s) + FP8_LG(m)) << 7 | (((m) << (7 - FP8_LG(m))) & 0x7f) : 0)
#define E4M3_BF16(c) ((c) == 0x7f ? 0x7fc0 : (c) >> 3 ? (((c) >> 3) + 120) << 7 | ((c)&7) << 4 : FP8_SUB_BF16((c)&7, 9))
#define E5M2_BF16(c)                                                                                                   \
  ((c) >> 2 == 31 ? ((c)&3 ? 0x7fc0 : 0x7f80)                                                                          \
   : (c) >> 2     ? (((c) >> 2) + 112) << 7 | ((c)&3) << 5                                                             \
                  : FP8_SUB_BF16((c)&3, 16))
#define FP8_LO(F, c) (uint8_t)(F(c) & 0xff)
#define FP8_HI(F, c) (uint8_t)(F(c) >> 8)
#define FP8_BYTES4(B, F, c) B(F, c), B(F, (c) + 1), B(F, (c) + 2), B(F, (c) + 3)
#define FP8_BYTES16(B, F, c)                                                                                           \
  FP8_BYTES4(B, F, c), FP8_BYTES4(B, F, (c) + 4), FP8_BYTES4(B, F, (c) + 8), FP8_BYTES4(B, F, (c) + 12)
#define FP8_BYTES64(B, F, c)                                                                                           \
  FP8_BYTES16(B, F, c), FP8_BYTES16(B, F, (c) + 16), FP8_BYTES16(B, F, (c) + 32), FP8_BYTES16(B, F, (c) + 48)
#define FP8_TABLE(F)                                                                                                   \
  FP8_BYTES64(FP8_LO, F, 0), FP8_BYTES64(FP8_LO, F, 64), FP8_BYTES64(FP8_HI, F, 0), FP8_BYTES64(FP8_HI, F, 64)
static const uint8_t fp8_bf16_e4m3[256] __attribute__((aligned(64))) = {FP8_TABLE(E4M3_BF16)};
static const uint8_t fp8_bf16_e5m2[256] __attribute__((aligned(64))) = {FP8_TABLE(E5M2_BF16)};
#undef FP8_LG
#undef FP8_SUB_BF16
#undef E4M3_BF16
#undef E5M2_BF16
#undef FP8_LO
#undef FP8_HI
#undef FP8_BYTES4
#undef FP8_BYTES16
#undef FP8_BYTES64
#undef FP8_TABLE
/* v16i_fp8_widen's table for fp8 dtype t */
static inline const uint8_t *fp8_bf16_table(uattn_dtype t) {
  return t == UATTN_FP8_E4M3 ? fp8_bf16_e4m3 : fp8_bf16_e5m2;
}

/* n floats rounded to bf16 in place (P kept as floats for a P V in fp32 FMAs, common/decode16.h's). */
AVX2_INLINE void round_bf16_in_place(float *a, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(a + i, _mm256_castsi256_ps(round8_bf16(_mm256_loadu_ps(a + i))));
  for (; i < n; i++) a[i] = uattn_bf16_to_f32(uattn_f32_to_bf16(a[i]));
}

#endif
