/* Cache elements of any dtype widened to f32, bit-exact with convert.h: one element for the ragged edges,
 * eight in a vector (bf16 a shift, f16 F16C, fp8 widen8_fp8); and fp8 codes 32 at a time as four vectors of
 * their quarters, each times a power of two (fp8_quarter, fp8_special, fp8_patch), for the loops that widen
 * every code they read. */
#ifndef UATTN_COMMON_WIDEN_H
#define UATTN_COMMON_WIDEN_H

#include "common/vec8.h"

/* One element, for the ragged edges. F16C agrees with uattn_f16_to_f32 on every non-NaN value. */
static inline float widen1(uattn_dtype t, const void *src, size_t i) {
  if (t == UATTN_F32) {
    float f;
    memcpy(&f, (const char *)src + 4 * i, 4);
    return f;
  }
  if (uattn_dtype_is_fp8(t)) return uattn_fp8_to_f32(t, ((const uint8_t *)src)[i]);
  uint16_t h;
  memcpy(&h, (const char *)src + 2 * i, 2);
  return t == UATTN_BF16 ? uattn_bf16_to_f32(h) : uattn_f16_to_f32(h);
}

/* Eight fp8 elements, exactly (convert.h's tables), by F16C rather than a gather (a decode widens every key
 * and value it reads, and Zen's gathers cost several times these few operations). E5M2 is the upper byte of
 * an f16, infinities and NaN included. E4M3fn's exponent and mantissa, moved into an f16's, read as the same
 * number times 2^(7 - 15) (subnormals too: both formats' subnormals are the exponent field 0), so the f16 is
 * scaled by 2^8, exactly; S.1111.111, which would read 480, is NaN. */
AVX2_INLINE __m256 widen8_fp8(uattn_dtype t, const void *src) {
  const __m128i h = _mm_cvtepu8_epi16(_mm_loadl_epi64(src));
  if (t == UATTN_FP8_E5M2) return _mm256_cvtph_ps(_mm_slli_epi16(h, 8));
  const __m128i mag = _mm_and_si128(h, _mm_set1_epi16(0x7f));
  const __m128i f16 = _mm_or_si128(_mm_slli_epi16(mag, 7), _mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi16(0x80)), 8));
  const __m256 x = _mm256_mul_ps(_mm256_cvtph_ps(f16), _mm256_set1_ps(256.0f));
  const __m256 nan = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f))));
  return _mm256_blendv_ps(x, _mm256_or_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000))), nan);
}

/* Eight elements: bf16 is the upper half of an f32, so widening is a shift; f16 is F16C's; fp8 widen8_fp8. */
AVX2_INLINE __m256 widen8(uattn_dtype t, const void *src) {
  if (t == UATTN_F32) return _mm256_loadu_ps(src);
  if (uattn_dtype_is_fp8(t)) return widen8_fp8(t, src);
  const __m128i h = _mm_loadu_si128(src);
  if (t == UATTN_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}

/* ---- fp8, 32 codes at a time, a quarter of them a vector ------------------------------------------------- */

/* The rebias R of fp8 dtype t: a code's exponent and mantissa moved under an f32's read as its value times
 * 2^-R (E4M3's exponent bias 7 against f32's 127: R = 120; E5M2's 15: R = 112). */
static inline int fp8_rebias(uattn_dtype t) { return t == UATTN_FP8_E4M3 ? 120 : 112; }

/* The constants of fp8_quarter and fp8_special (E4M3's row, E5M2's), read from memory by the helpers below:
 * held in registers (as GCC chooses for a constant used in a loop) they crowd out the scores' 8
 * accumulators, which it then spills. */
static const uint32_t fp8_keep[2][8] __attribute__((aligned(32))) = {
    {0x87f00000u, 0x87f00000u, 0x87f00000u, 0x87f00000u, 0x87f00000u, 0x87f00000u, 0x87f00000u, 0x87f00000u},
    {0x8fe00000u, 0x8fe00000u, 0x8fe00000u, 0x8fe00000u, 0x8fe00000u, 0x8fe00000u, 0x8fe00000u, 0x8fe00000u}};
static const uint32_t fp8_exponent[2][8] __attribute__((aligned(32))) = {
    {0x7f7f7f7fu, 0x7f7f7f7fu, 0x7f7f7f7fu, 0x7f7f7f7fu, 0x7f7f7f7fu, 0x7f7f7f7fu, 0x7f7f7f7fu, 0x7f7f7f7fu},
    {0x7c7c7c7cu, 0x7c7c7c7cu, 0x7c7c7c7cu, 0x7c7c7c7cu, 0x7c7c7c7cu, 0x7c7c7c7cu, 0x7c7c7c7cu, 0x7c7c7c7cu}};
AVX2_INLINE __m256i and_from_memory(__m256i x, const uint32_t m[8]) {
  __asm__("vpand %1, %0, %0" : "+x"(x) : "m"(*(const uint32_t(*)[8])m));
  return x;
}
AVX2_INLINE __m256i cmpeq8_from_memory(__m256i x, const uint32_t m[8]) {
  __asm__("vpcmpeqb %1, %0, %0" : "+x"(x) : "m"(*(const uint32_t(*)[8])m));
  return x;
}

/* Quarter c of 32 fp8 codes x (the codes at byte c of its 32-bit lanes) as f32 times 2^-R, R = fp8_rebias(t):
 * the code moved to the lane's top byte, an arithmetic shift that puts its exponent and mantissa under an
 * f32's (E4M3 4 bits, E5M2 3) and smears its sign over the top of the exponent, a mask that keeps the sign
 * and the code's bits. Subnormal codes become f32 subnormals of the same value (so a product by 2^R is the
 * code's value exactly, as every f32 operation on subnormals is with MXCSR's default, no flush to zero);
 * codes with every exponent bit set (E4M3's NaN, E5M2's infinities and NaN) do not read right: fp8_special
 * finds them, fp8_patch mends them. */
AVX2_INLINE __m256 fp8_quarter(uattn_dtype t, __m256i x, int c) {
  const __m256i y = c == 3 ? x : _mm256_slli_epi32(x, 24 - 8 * c);
  const bool e4m3 = t == UATTN_FP8_E4M3;
  return _mm256_castsi256_ps(and_from_memory(_mm256_srai_epi32(y, e4m3 ? 4 : 3), fp8_keep[!e4m3]));
}

/* The bytes of x that are codes with every exponent bit set, as 0xff. */
AVX2_INLINE __m256i fp8_special(uattn_dtype t, __m256i x) {
  const uint32_t *e = fp8_exponent[t != UATTN_FP8_E4M3];
  return cmpeq8_from_memory(and_from_memory(x, e), e);
}

/* fp8_quarter's quarter c (f) of codes x with its special codes made what they are: the exponent's top bits
 * set (E4M3's NaN S.1111.111 reads 0x07f00000 | sign, E5M2's 0x0f800000 | sign and up), which makes an
 * infinity of E5M2's S.11111.00 and a NaN of every other; a power of two leaves them so. Registers only
 * (a call in the loop would have every accumulator spilled around it), taken where fp8_special found one. */
AVX2_INLINE __m256 fp8_patch(uattn_dtype t, __m256 f, __m256i x, int c) {
  const __m256i sp = fp8_special(t, x);
  const __m256i lane = _mm256_srai_epi32(c == 3 ? sp : _mm256_slli_epi32(sp, 24 - 8 * c), 24);
  const __m256i top = _mm256_set1_epi32(t == UATTN_FP8_E4M3 ? 0x78000000 : 0x70000000);
  return _mm256_or_ps(f, _mm256_castsi256_ps(_mm256_and_si256(lane, top)));
}

#endif
