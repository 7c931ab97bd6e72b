/* Cache elements of any dtype widened to f32, bit-exact with convert.h: one element for the ragged edges,
 * eight in a vector (bf16 a shift, f16 F16C, fp8 widen8_fp8). */
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

#endif
