/* The AVX2 + FMA + F16C kernels, as always-inline bodies: kernels/avx2/set.c instantiates them for any shape
 * (the generic set) and each generated bucket source (gen/) for its own constant block size, head dim and
 * dtype, so the compiler unrolls and folds what the constants decide. Include only on x86.
 *
 * Panels (this set's own layout; panel_floats says how much it needs):
 *   keys   transposed, kt[d * P + i] for key i and dim d, P = key_stride(panel_keys). Scores of a block of
 *          query vectors against 8 or 16 keys are then FMAs of a broadcast query element with contiguous key
 *          vectors, and no horizontal sums. Columns [count, count rounded up to 8) are zero, so a score tile
 *          may run past the last key without reading anything unset.
 *   values row-major, vp[i * Dv + d], Dv = value_stride(head_dim) >= head_dim rounded up to 8; the columns
 *          past head_dim up to the next multiple of 8 are zero, so the last partial vector of a row can be
 *          loaded whole.
 *   Both strides are odd multiples of 16 floats (64-byte lines): a power-of-two stride would map a walk
 *   down a column of the panel onto a few L1 sets and evict it while it is being read.
 *   Both panels start at the first 64-byte boundary of the buffer (panel_floats includes the slack), so the
 *   16-float vectors of a tile never straddle two cache lines.
 *
 * attend: the job's query vectors x = row * group + head (each with its own visible range, window, slope)
 * are taken in blocks of up to QB (as even as they go); the keys a block sees are taken KC at a time (a
 * chunk of the panel that stays in L1/L2 while every block of queries passes over it). Per (chunk, block):
 *   S = Q K^T in register tiles of NB vectors x 16 keys (2 NB accumulators; 2 or 4 chains each below 4
 *   vectors), over keys from the first any vector sees to the last, DB dims per partial sum;
 *   per vector: mask (visible count, window), soft cap, ALiBi, max, exp, sum, the online rescale of m, l;
 *   O = alpha * O + P V in register tiles of NB vectors x 16 dims (alpha folded into loading O).
 * The group's heads of a row are adjacent vectors, so they share every key and value load. Numerics are
 * fp32 throughout, like the portable set; only the summation order and FMA contraction differ (the
 * max |error| against an fp64 evaluation is the portable set's, tests/kernels/test_kernels.c).
 *
 * Everything here carries the AVX2 target attribute: nothing may run before uattn_avx2_runs_here() says
 * yes (the library itself is built for baseline x86-64). */
#ifndef UATTN_AVX2_BODY_H
#define UATTN_AVX2_BODY_H

#include <immintrin.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "convert.h"
#include "kernels.h"

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
/* always_inline: the block size NB must be a compile-time constant in every kernel body for the tiles to
 * live in registers; the dispatch switches below instantiate one copy per NB. */
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

enum {
  QB = 6,   /* query vectors per block: 6 x 16 keys = 12 accumulators, + 2 key vectors + 1 broadcast */
  KC = 128, /* keys per chunk: the chunk's scores of a block fit a small stack tile */
  DB = 32,  /* dims per partial dot product (see score_tile) */
};

/* ---- layout ----------------------------------------------------------------------------------------- */

/* An odd number of 64-byte lines (see the header comment). */
static inline int32_t odd_lines(int32_t floats) {
  int32_t p = (floats + 15) & ~15;
  if (!((p / 16) & 1)) p += 16;
  return p;
}
static inline int32_t key_stride(int32_t panel_keys) { return odd_lines(panel_keys); }
static inline int32_t value_stride(int32_t head_dim) { return odd_lines(head_dim); }

static inline float *align64(float *p) { return (float *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }
static inline const float *align64c(const float *p) { return (const float *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

/* ---- load: widening (bit-exact with convert.h) and transposing --------------------------------------- */

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

/* Two rows' 8 halves in one register: [row a | row b]. */
AVX2_INLINE __m256i pair16(const void *a, const void *b) {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(a)), _mm_loadu_si128(b), 1);
}

/* 8 keys x 8 dims of 16-bit elements (row i at r + i * step bytes) to dst[t * P + i] for dim t. The 16-bit
 * transpose goes first, on half the bytes; it leaves each 128-bit lane with 4 rows of two dims, rows 0-3 in
 * the low lane and 4-7 in the high one, which is exactly what the widening then needs. */
AVX2_INLINE void transpose8_16(uattn_dtype t, const char *r, size_t step, float *dst, int32_t P) {
  const __m256i a0 = pair16(r, r + 4 * step), a1 = pair16(r + step, r + 5 * step);
  const __m256i a2 = pair16(r + 2 * step, r + 6 * step), a3 = pair16(r + 3 * step, r + 7 * step);
  const __m256i b0 = _mm256_unpacklo_epi16(a0, a1), b1 = _mm256_unpackhi_epi16(a0, a1);
  const __m256i b2 = _mm256_unpacklo_epi16(a2, a3), b3 = _mm256_unpackhi_epi16(a2, a3);
  /* c[k]: dims 2k (low 64 bits of each lane) and 2k + 1 (high 64 bits), rows 0-3 | rows 4-7 */
  const __m256i c[4] = {_mm256_unpacklo_epi32(b0, b2), _mm256_unpackhi_epi32(b0, b2), _mm256_unpacklo_epi32(b1, b3),
                        _mm256_unpackhi_epi32(b1, b3)};
  if (t == UATTN_BF16) {
    const __m256i z = _mm256_setzero_si256();
    for (int k = 0; k < 4; k++) { /* interleaving with zeros puts each bf16 in the top half of an f32 */
      _mm256_store_ps(dst + (2 * k) * P, _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, c[k])));
      _mm256_store_ps(dst + (2 * k + 1) * P, _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, c[k])));
    }
  } else {
    for (int k = 0; k < 4; k++) { /* gather each dim's 8 halves into 128 bits, then F16C */
      const __m256i p = _mm256_permute4x64_epi64(c[k], _MM_SHUFFLE(3, 1, 2, 0));
      _mm256_store_ps(dst + (2 * k) * P, _mm256_cvtph_ps(_mm256_castsi256_si128(p)));
      _mm256_store_ps(dst + (2 * k + 1) * P, _mm256_cvtph_ps(_mm256_extracti128_si256(p, 1)));
    }
  }
}

/* The same for f32: rows i and i + 4 share a register from the start (two half loads), which leaves two
 * in-lane 4 x 4 transposes and no lane crossing. */
AVX2_INLINE void transpose8_32(const char *r, size_t step, float *dst, int32_t P) {
  for (int half = 0; half < 2; half++) { /* dims 0-3, then 4-7 */
    __m256 t[4];
    for (int i = 0; i < 4; i++)
      t[i] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps((const float *)(r + i * step) + 4 * half)),
                                  _mm_loadu_ps((const float *)(r + (i + 4) * step) + 4 * half), 1);
    const __m256 u0 = _mm256_unpacklo_ps(t[0], t[1]), u1 = _mm256_unpackhi_ps(t[0], t[1]);
    const __m256 u2 = _mm256_unpacklo_ps(t[2], t[3]), u3 = _mm256_unpackhi_ps(t[2], t[3]);
    float *d = dst + 4 * half * P;
    _mm256_store_ps(d, _mm256_shuffle_ps(u0, u2, _MM_SHUFFLE(1, 0, 1, 0)));
    _mm256_store_ps(d + P, _mm256_shuffle_ps(u0, u2, _MM_SHUFFLE(3, 2, 3, 2)));
    _mm256_store_ps(d + 2 * P, _mm256_shuffle_ps(u1, u3, _MM_SHUFFLE(1, 0, 1, 0)));
    _mm256_store_ps(d + 3 * P, _mm256_shuffle_ps(u1, u3, _MM_SHUFFLE(3, 2, 3, 2)));
  }
}

/* The same for fp8: the 8 rows' 8 bytes widened (widen8) into an 8 x 8 fp32 tile, then transposed as f32. */
AVX2_INLINE void transpose8_8(uattn_dtype t, const char *r, size_t step, float *dst, int32_t P) {
  _Alignas(32) float tile[8][8];
  for (int k = 0; k < 8; k++) _mm256_store_ps(tile[k], widen8(t, r + k * step));
  transpose8_32((const char *)tile, sizeof tile[0], dst, P);
}

/* Keys [i, i + 8) into the transposed panel, row k of the group at r + k * step (a ragged last group, and
 * columns up to the next multiple of 8 zeroed, when fewer than 8 are left). */
AVX2_INLINE void load_key_group(uattn_dtype t, const char *r, size_t step, int32_t i, int32_t count, int32_t D,
                                int32_t P, float *kt) {
  const size_t esz = uattn_dtype_size(t);
  if (count - i < 8) {
    for (int32_t d = 0; d < D; d++)
      for (int32_t k = 0; k < 8; k++)
        kt[(size_t)d * P + i + k] = i + k < count ? widen1(t, r + (size_t)k * step, (size_t)d) : 0.0f;
    return;
  }
  const int32_t d8 = D & ~7;
  for (int32_t d = 0; d < d8; d += 8) {
    if (t == UATTN_F32)
      transpose8_32(r + (size_t)d * esz, step, kt + (size_t)d * P + i, P);
    else if (uattn_dtype_is_fp8(t))
      transpose8_8(t, r + (size_t)d * esz, step, kt + (size_t)d * P + i, P);
    else
      transpose8_16(t, r + (size_t)d * esz, step, kt + (size_t)d * P + i, P);
  }
  for (int32_t d = d8; d < D; d++) /* dims past the last 8 */
    for (int32_t k = 0; k < 8; k++) kt[(size_t)d * P + i + k] = widen1(t, r + (size_t)k * step, (size_t)d);
}

/* Values [i, min(i + 8, count)) into the row-major panel, each row zero-padded to a multiple of 8 dims. */
AVX2_INLINE void load_value_group(uattn_dtype t, const char *src, size_t step, int32_t i, int32_t count, int32_t D,
                                  int32_t Dv, float *vp) {
  const size_t esz = uattn_dtype_size(t);
  const int32_t d8 = D & ~7, end = count - i < 8 ? count : i + 8;
  for (; i < end; i++) {
    const char *r = src + (size_t)i * step;
    float *o = vp + (size_t)i * Dv;
    int32_t d = 0;
    for (; d + 16 <= D; d += 16) {
      _mm256_store_ps(o + d, widen8(t, r + (size_t)d * esz));
      _mm256_store_ps(o + d + 8, widen8(t, r + (size_t)(d + 8) * esz));
    }
    if (d < d8) _mm256_store_ps(o + d, widen8(t, r + (size_t)d * esz)), d += 8;
    for (; d < D; d++) o[d] = widen1(t, r, (size_t)d);
    for (; d < ((D + 7) & ~7); d++) o[d] = 0.0f;
  }
}

/* Asks for the cache lines of rows [i, min(i + 8, count)) of a source, in address order within each row, into
 * L2: a request for L1 holds one of the core's few L1 miss buffers until its line comes, which capped the
 * lines in flight (the decode kernel's finding, avx2/decode.h). */
AVX2_INLINE void prefetch_group(const char *src, size_t step, int32_t i, int32_t count, size_t row_bytes) {
  const int32_t end = count - i < 8 ? count : i + 8;
  for (; i < end; i++) {
    const char *r = src + (size_t)i * step;
    for (size_t b = 0; b < row_bytes; b += 64) _mm_prefetch(r + b, _MM_HINT_T1);
    _mm_prefetch(r + row_bytes - 1, _MM_HINT_T1); /* a row need not start on a line */
  }
}

enum { LOAD_AHEAD = 32 }; /* rows a load asks for ahead of the group it reads (a multiple of 8) */

/* A load's prefetches as it reads rows [i, i + 8) of keys k and values v: the first LOAD_AHEAD rows at the
 * start, then the group LOAD_AHEAD rows on. */
AVX2_INLINE void load_prefetch(const char *k, const char *v, size_t step, int32_t i, int32_t count, size_t row_bytes) {
  for (int32_t j = 0; i == 0 && j < LOAD_AHEAD && j < count; j += 8)
    prefetch_group(k, step, j, count, row_bytes), prefetch_group(v, step, j, count, row_bytes);
  if (i + LOAD_AHEAD < count)
    prefetch_group(k, step, i + LOAD_AHEAD, count, row_bytes),
        prefetch_group(v, step, i + LOAD_AHEAD, count, row_bytes);
}

/* Copies 8 rows of a group next to each other (row k at buf + k * row_bytes). */
AVX2_INLINE void stage_group(const char *r, size_t step, size_t row_bytes, char *buf) {
  for (int k = 0; k < 8; k++, r += step, buf += row_bytes) {
    size_t b = 0;
    for (; b + 32 <= row_bytes; b += 32)
      _mm256_storeu_si256((__m256i *)(buf + b), _mm256_loadu_si256((const __m256i *)(r + b)));
    if (b < row_bytes) memcpy(buf + b, r + b, row_bytes - b);
  }
}

enum { STAGE_BYTES = 4096 }; /* the staging buffer: 8 rows of up to 512 bytes (D 256 in bf16, 128 in f32) */

/* Cache blocks are mostly cold (a decode reads each once), and in NHD their rows are a whole row of heads
 * apart. Measured here on one head of a cold 128-key, D 128 bf16 block (keys and values; best of 15
 * interleaved runs, about +-10% from one session to the next):
 *  - prefetching each group of 8 keys and values two groups ahead, in address order, when rows are apart
 *    (NHD): 20 -> 15 us. With contiguous rows (HND) the hardware prefetcher does better alone (7.7 us with
 *    the prefetches, 6.5 without). Later, into L2 and LOAD_AHEAD (32) rows ahead instead of into L1 and 16
 *    ahead: cold NHD loads 3.4 -> 7.7 GB/s (bf16), 2.8-3.5 -> 4.3-6.8 (f16; uattn-kernel-bench, Zen 4);
 *  - copying a group's 8 key rows into an L1 buffer before transposing them, rather than transposing
 *    straight from memory (the transposes touch 8 rows at once, 16 bytes of each, while their stores to
 *    panels larger than L1 fill the store buffer and stall the loads behind them): HND 7.4 -> 6.2 us,
 *    NHD 15.9 -> 14.9 us; 10% slower when the block is already in cache.
 * The portable set: NHD 22-25 us, HND 5-5.5 us (plain row copies stream best there; the transposes cost
 * that 20%). Keys and values go a group at a time: two streams in flight. */
AVX2_INLINE void avx2_load_body(uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride, int32_t count,
                                int32_t head_dim, int32_t panel_keys, float *keys, float *values) {
  const size_t esz = uattn_dtype_size(dtype), step = stride * esz; /* bytes from one key to the next */
  const size_t row_bytes = (size_t)head_dim * esz;
  const int32_t P = key_stride(panel_keys), Dv = value_stride(head_dim);
  const char *k = k_src, *v = v_src;
  float *kt = align64(keys), *vp = align64(values);
  const int stage = row_bytes * 8 <= STAGE_BYTES, prefetch = step != row_bytes;
  _Alignas(64) char buf[STAGE_BYTES];
  for (int32_t i = 0; i < count; i += 8) {
    if (prefetch) load_prefetch(k, v, step, i, count, row_bytes);
    if (stage && count - i >= 8) {
      stage_group(k + (size_t)i * step, step, row_bytes, buf);
      load_key_group(dtype, buf, row_bytes, i, count, head_dim, P, kt);
    } else {
      load_key_group(dtype, k + (size_t)i * step, step, i, count, head_dim, P, kt);
    }
    load_value_group(dtype, v, step, i, count, head_dim, Dv, vp);
  }
}

/* ---- vector math -------------------------------------------------------------------------------------- */

/* x, kept in a register where it is used: the empty asm hides where x came from and where it goes, so GCC can
 * neither fold the load that made it into every instruction that uses it (a memory operand, read again each
 * time: decode.h's scores) nor keep it on the stack through a loop (softmax_row's sum). */
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

/* ---- attend --------------------------------------------------------------------------------------------- */

/* Independent FMA chains per accumulator: Zen 3 runs two 4-cycle FMAs a cycle, so a tile needs 8 chains in
 * flight. From 4 vectors up, the 2 NB accumulators of a tile are enough; smaller blocks (a decode with
 * fewer than 4 heads a KV head, MHA) split each sum over 2 or 4 chains (dims for scores, keys for P V)
 * and add them at the end. */
#define CHAINS(NB) ((NB) >= 4 ? 1 : (NB) == 1 ? 4 : 2)

/* Each accumulator's C = CHAINS(NB) chains (a[c][i][w] for NB vectors and W vectors of 8) summed into
 * a[0][i][w], in the one order every split sum of the set uses: (a0 + a1) + (a2 + a3). */
AVX2_INLINE void sum_chains(const int C, const int NB, const int W, __m256 (*a)[QB][2]) {
  for (int i = 0; i < NB; i++)
    for (int w = 0; w < W; w++) {
      if (C == 4)
        a[0][i][w] = _mm256_add_ps(_mm256_add_ps(a[0][i][w], a[1][i][w]), _mm256_add_ps(a[2][i][w], a[3][i][w]));
      if (C == 2) a[0][i][w] = _mm256_add_ps(a[0][i][w], a[1][i][w]);
    }
}

/* Dims [d0, d1) of the scores of NB vectors (q_i at q + i * D) against 8 W keys at kt (W = 1 or 2): per
 * dim, W key loads serve NB broadcasts and W NB FMAs. */
AVX2_INLINE void score_part(const int NB, const int W, const float *q, int32_t D, const float *k, int32_t P, int32_t d0,
                            int32_t d1, __m256 (*out)[2]) {
  const int C = CHAINS(NB);
  __m256 a[4][QB][2];
  for (int c = 0; c < C; c++)
    for (int i = 0; i < NB; i++)
      for (int w = 0; w < W; w++) a[c][i][w] = _mm256_setzero_ps();
  int32_t d = d0;
  k += (size_t)d0 * P;
  for (; d + C <= d1; d += C, k += (size_t)C * P)
    for (int c = 0; c < C; c++) {
      __m256 kv[2];
      for (int w = 0; w < W; w++) kv[w] = _mm256_load_ps(k + (size_t)c * P + 8 * w);
      for (int i = 0; i < NB; i++) {
        const __m256 b = _mm256_broadcast_ss(q + (size_t)i * D + d + c);
        for (int w = 0; w < W; w++) a[c][i][w] = _mm256_fmadd_ps(b, kv[w], a[c][i][w]);
      }
    }
  for (; d < d1; d++, k += P)
    for (int i = 0; i < NB; i++) {
      const __m256 b = _mm256_broadcast_ss(q + (size_t)i * D + d);
      for (int w = 0; w < W; w++) a[0][i][w] = _mm256_fmadd_ps(b, _mm256_load_ps(k + 8 * w), a[0][i][w]);
    }
  sum_chains(C, NB, W, a);
  for (int i = 0; i < NB; i++)
    for (int w = 0; w < W; w++) out[i][w] = a[0][i][w];
}

/* S[i][j - j0] = <q_i, k_j> for NB vectors and keys [j0, j1) (j1 - j0 a multiple of 8), 16 keys at a time
 * (8 at the end). Each dot product is summed DB dims at a time and the partial sums added up in S: one FMA
 * chain over all of D would lose about twice the bits the portable set's eight partial sums lose (a chain's
 * error grows with its length and the size of its running sum). */
AVX2_INLINE void score_tile(const int NB, const float *q, int32_t D, const float *kt, int32_t P, int32_t j0, int32_t j1,
                            float (*S)[KC]) {
  for (int32_t j = j0; j < j1; j += 16) {
    const int W = j1 - j >= 16 ? 2 : 1;
    for (int32_t d0 = 0; d0 < D; d0 += DB) {
      const int32_t d1 = D - d0 < DB ? D : d0 + DB;
      __m256 a[QB][2];
      if (W == 2)
        score_part(NB, 2, q, D, kt + j, P, d0, d1, a);
      else
        score_part(NB, 1, q, D, kt + j, P, d0, d1, a);
      for (int i = 0; i < NB; i++)
        for (int w = 0; w < W; w++) {
          float *s = S[i] + (j - j0) + 8 * w;
          if (d0) a[i][w] = _mm256_add_ps(a[i][w], _mm256_load_ps(s));
          _mm256_store_ps(s, a[i][w]);
        }
    }
  }
}

/* 8 W dims (from d, masked by m when W = 1) of o_i = alpha_i o_i + sum_{j in [klo, khi)} P[i][j - j0] v_j:
 * per key, W value loads serve NB broadcasts and W NB FMAs. The value panel is zero-padded to a multiple of
 * 8 dims, so only o needs the mask. */
AVX2_INLINE void pv_part(const int NB, const int W, float (*S)[KC], int32_t j0, int32_t klo, int32_t khi,
                         const float *v, int32_t Dv, float *o, int32_t D, const float *alpha, __m256i m) {
  const int C = CHAINS(NB);
  __m256 a[4][QB][2];
  for (int i = 0; i < NB; i++)
    for (int w = 0; w < W; w++) {
      const __m256 x = W == 2 ? _mm256_loadu_ps(o + (size_t)i * D + 8 * w) : _mm256_maskload_ps(o + (size_t)i * D, m);
      a[0][i][w] = _mm256_mul_ps(_mm256_set1_ps(alpha[i]), x);
      for (int c = 1; c < C; c++) a[c][i][w] = _mm256_setzero_ps();
    }
  int32_t j = klo;
  v += (size_t)klo * Dv;
  for (; j + C <= khi; j += C, v += (size_t)C * Dv)
    for (int c = 0; c < C; c++) {
      __m256 vv[2];
      for (int w = 0; w < W; w++) vv[w] = _mm256_load_ps(v + (size_t)c * Dv + 8 * w);
      for (int i = 0; i < NB; i++) {
        const __m256 p = _mm256_broadcast_ss(S[i] + (j + c - j0));
        for (int w = 0; w < W; w++) a[c][i][w] = _mm256_fmadd_ps(p, vv[w], a[c][i][w]);
      }
    }
  for (; j < khi; j++, v += Dv)
    for (int i = 0; i < NB; i++) {
      const __m256 p = _mm256_broadcast_ss(S[i] + (j - j0));
      for (int w = 0; w < W; w++) a[0][i][w] = _mm256_fmadd_ps(p, _mm256_load_ps(v + 8 * w), a[0][i][w]);
    }
  sum_chains(C, NB, W, a);
  for (int i = 0; i < NB; i++)
    for (int w = 0; w < W; w++) {
      if (W == 2)
        _mm256_storeu_ps(o + (size_t)i * D + 8 * w, a[0][i][w]);
      else
        _mm256_maskstore_ps(o + (size_t)i * D, m, a[0][i][w]);
    }
}

/* o_i = alpha_i o_i + P V over keys [klo, khi) for NB vectors (o_i at o + i * D), 16 dims at a time, then
 * 8 (masked in the last vector when D is not a multiple of 8). Each o_i is read and written once per chunk
 * (alpha folded into that read), and each value load serves NB broadcasts. */
AVX2_INLINE void pv_tile(const int NB, float (*S)[KC], int32_t j0, int32_t klo, int32_t khi, const float *vp,
                         int32_t Dv, float *o, int32_t D, const float *alpha) {
  int32_t d = 0;
  const __m256i all = _mm256_set1_epi32(-1);
  for (; d + 16 <= D; d += 16) pv_part(NB, 2, S, j0, klo, khi, vp + d, Dv, o + d, D, alpha, all);
  for (; d < D; d += 8) pv_part(NB, 1, S, j0, klo, khi, vp + d, Dv, o + d, D, alpha, tail_mask(D - d));
}

/* What one query vector of a block sees of the current chunk. */
typedef struct vec_rule {
  int32_t lo, hi; /* keys [lo, hi) of the panel; empty when lo >= hi */
  int32_t rel;    /* key_pos0 - query position: key j is at distance j + rel */
  float slope;    /* ALiBi, 0 = none */
} vec_rule;

/* softmax_row's first pass, shared with avx512bf16/body.h's: the rule (mask, soft cap, ALiBi) applied to the
 * scores S[j0, j1) of one vector, and their maximum. */
AVX2_INLINE float row_rules_max(float *s, int32_t j0, int32_t j1, const vec_rule *v, float cap) {
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i lo = _mm256_set1_epi32(v->lo - 1), hi = _mm256_set1_epi32(v->hi);
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  const bool rule = cap > 0.0f || v->slope != 0.0f;
  __m256 vmax = ninf;
  for (int32_t j = j0; j < j1; j += 8) {
    __m256 x = _mm256_load_ps(s + (j - j0));
    if (cap > 0.0f) { /* the portable order: s / cap, tanh, * cap */
      const __m256 c = _mm256_set1_ps(cap);
      x = _mm256_mul_ps(c, tanh8(_mm256_div_ps(x, c)));
    }
    if (v->slope != 0.0f) {
      const __m256 dist = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_set1_epi32(j + v->rel), iota));
      x = _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(v->slope), dist));
    }
    const bool cut = j < v->lo || j + 8 > v->hi;
    if (cut) {
      const __m256i jv = _mm256_add_epi32(_mm256_set1_epi32(j), iota);
      const __m256i in = _mm256_and_si256(_mm256_cmpgt_epi32(jv, lo), _mm256_cmpgt_epi32(hi, jv));
      x = _mm256_blendv_ps(ninf, x, _mm256_castsi256_ps(in));
    }
    if (cut || rule) _mm256_store_ps(s + (j - j0), x);
    vmax = _mm256_max_ps(vmax, x);
  }
  return hmax8(vmax);
}

/* A row's running max after a chunk whose max is block_max, and in *alpha the factor its o and l are rescaled
 * by: as the portable rescale, 1 when the max stays, 0 from an empty state. */
static inline float row_new_max(float block_max, float m_old, float *alpha) {
  const float m_new = block_max > m_old ? block_max : m_old;
  *alpha = m_new == m_old ? 1.0f : (m_old == -INFINITY ? 0.0f : expf(m_old - m_new));
  return m_new;
}

/* One vector's row of the tile: the score rule, then the online softmax. Turns S[j0, j1) into
 * P = e^(s - m_new) (0 where masked), updates m and l, and returns the factor o must be rescaled by. Only
 * the vectors of 8 scores that [lo, hi) cuts are masked, and scores are written back only where a rule
 * (mask, cap, slope) changed them: a row that sees its whole tile (all but the causal diagonal in a
 * prefill) is a max pass and an exp pass. The softmax of a 32 x 128 tile of such rows: 17.3 -> 13.9 TSC
 * ticks per 8 scores; it is 10-15% of a prefill tile's time, so the attend gains 1-2%. */
AVX2_INLINE float softmax_row(float *s, int32_t j0, int32_t j1, const vec_rule *v, float cap, float *m, float *l) {
  float alpha;
  const float m_new = row_new_max(row_rules_max(s, j0, j1, v, cap), *m, &alpha);
  const __m256 mv = _mm256_set1_ps(m_new);
  __m256 sum = _mm256_setzero_ps();
  for (int32_t j = j0; j < j1; j += 8) {
    const __m256 p = exp8(_mm256_sub_ps(_mm256_load_ps(s + (j - j0)), mv));
    _mm256_store_ps(s + (j - j0), p);
    /* in_register: without it GCC kept the sum on the stack (and exp8's constants in registers) in 5-6 of a
     * bucket's 19 copies of this loop, a store-to-load chain through every step (a row of 128 scores alone:
     * 69 ns with the sum in a register, 83 on the stack) */
    sum = in_register(sum);
    sum = _mm256_add_ps(sum, p);
  }
  *l = *l * alpha + hsum8(sum);
  *m = m_new;
  return alpha;
}

typedef struct attend_ctx {
  const uattn_panel_job *job;
  const float *kt, *vp;
  int32_t P, Dv;
} attend_ctx;

/* The rules of query vectors [x0, x0 + nb) of the job for keys [c0, c1) of the panel, and the range of keys
 * any of them sees, [*klo, *khi) (empty when *klo >= *khi). Shared with the libxsmm body (xsmm.c). */
AVX2_INLINE void block_rules(const uattn_panel_job *job, int32_t x0, const int nb, int32_t c0, int32_t c1,
                             vec_rule *rule, int32_t *klo_out, int32_t *khi_out) {
  const int32_t G = job->group;
  int32_t klo = INT32_MAX, khi = INT32_MIN;
  for (int i = 0; i < nb; i++) {
    const int32_t x = x0 + i, r = x / G, h = x - r * G;
    int32_t lo = c0, hi = job->visible[r] < job->num_keys ? job->visible[r] : job->num_keys;
    if (hi > c1) hi = c1;
    if (job->window > 0) { /* keys at positions <= query position - window are outside */
      const int32_t first = job->query_pos[r] - job->window + 1 - job->key_pos0;
      if (first > lo) lo = first;
    }
    rule[i] = (vec_rule){lo, hi, job->key_pos0 - job->query_pos[r], job->alibi ? job->alibi[h] : 0.0f};
    if (lo < hi) {
      if (lo < klo) klo = lo;
      if (hi > khi) khi = hi;
    }
  }
  *klo_out = klo, *khi_out = khi;
}

/* The scores of vectors [x0, x0 + nb) (row i at S + i * ld, columns [j0, j1)) to probabilities with
 * softmax_row, and alpha[i], the factor each o_i must be rescaled by. A vector that sees none of the chunk
 * keeps its state exactly: alpha 1 and a row of zeros. Shared with the libxsmm body (xsmm.c). */
AVX2_INLINE void block_softmax(const uattn_panel_job *job, int32_t x0, const int nb, const vec_rule *rule, float *S,
                               int32_t ld, int32_t j0, int32_t j1, float *alpha) {
  for (int i = 0; i < nb; i++) {
    const size_t x = (size_t)x0 + i;
    float *s = S + (size_t)i * ld;
    if (rule[i].lo < rule[i].hi) {
      alpha[i] = softmax_row(s, j0, j1, &rule[i], job->soft_cap, &job->m[x], &job->l[x]);
    } else { /* this vector sees none of the chunk: o stays exactly as it is */
      alpha[i] = 1.0f;
      memset(s, 0, sizeof(float) * (size_t)(j1 - j0));
    }
  }
}

/* Query vectors [x0, x0 + NB) of the job against keys [c0, c1) of the panel. */
AVX2_INLINE void attend_block(const int NB, const int32_t D, const attend_ctx *c, int32_t x0, int32_t c0, int32_t c1) {
  const uattn_panel_job *job = c->job;
  vec_rule rule[QB];
  int32_t klo, khi;
  block_rules(job, x0, NB, c0, c1, rule, &klo, &khi);
  if (klo >= khi) return; /* a fully masked tile */
  /* the tile's columns: from a 64-byte line (c0 is one, so the tile stays within the chunk's KC columns) to
   * the next multiple of 8 (the panel is zero there) */
  const int32_t j0 = klo & ~15, j1 = (khi + 7) & ~7;
  _Alignas(32) float S[QB][KC];
  const float *q = job->q + (size_t)x0 * D;
  score_tile(NB, q, D, c->kt, c->P, j0, j1, S);
  float alpha[QB];
  block_softmax(job, x0, NB, rule, S[0], KC, j0, j1, alpha);
  pv_tile(NB, S, j0, klo, khi, c->vp, c->Dv, job->o + (size_t)x0 * D, D, alpha);
}

/* Keys [0, the returned count) are all that the first `rows` rows of the job see of its panel. */
AVX2_INLINE int32_t keys_seen(const uattn_panel_job *job, int32_t rows) {
  int32_t kmax = 0;
  for (int32_t r = 0; r < rows; r++) {
    const int32_t hi = job->visible[r] < job->num_keys ? job->visible[r] : job->num_keys;
    if (hi > kmax) kmax = hi;
  }
  return kmax;
}

/* The plan of the fused attend bodies (this one's and avx512bf16/body.h's) for n query vectors against the
 * kmax keys they see: chunks of KC keys in turn, and in each, blocks of at most QB vectors, as even as they
 * go (8 heads are 4 + 4, not 6 + 2: a block of 2 reloads every key for a quarter of the FMAs):
 * BLOCK(NB, D, ctx, x0, c0, c1) for vectors [x0, x0 + NB) and keys [c0, c1), NB a constant (one instance
 * per block size, each with its tiles in registers). */
#define ATTEND_BLOCKS(n, kmax, BLOCK, D, ctx)                                                                          \
  do {                                                                                                                 \
    const int32_t n_ = (n), blocks_ = (n_ + QB - 1) / QB, small_ = n_ / blocks_, big_ = n_ % blocks_;                  \
    for (int32_t c0_ = 0; c0_ < (kmax); c0_ += KC) {                                                                   \
      const int32_t c1_ = (kmax)-c0_ < KC ? (kmax) : c0_ + KC;                                                         \
      for (int32_t b_ = 0, x0_ = 0; b_ < blocks_; b_++) {                                                              \
        const int32_t nb_ = small_ + (b_ < big_);                                                                      \
        switch (nb_) {                                                                                                 \
        case 1: BLOCK(1, D, ctx, x0_, c0_, c1_); break;                                                                \
        case 2: BLOCK(2, D, ctx, x0_, c0_, c1_); break;                                                                \
        case 3: BLOCK(3, D, ctx, x0_, c0_, c1_); break;                                                                \
        case 4: BLOCK(4, D, ctx, x0_, c0_, c1_); break;                                                                \
        case 5: BLOCK(5, D, ctx, x0_, c0_, c1_); break;                                                                \
        default: BLOCK(QB, D, ctx, x0_, c0_, c1_); break;                                                              \
        }                                                                                                              \
        x0_ += nb_;                                                                                                    \
      }                                                                                                                \
    }                                                                                                                  \
  } while (0)

/* The job's vectors against its panel. D is the job's head dim and ROWS its rows (0: job->rows), constants
 * where the caller is specialized. */
AVX2_INLINE void avx2_attend_body(const uattn_panel_job *job, int32_t panel_keys, const int32_t D, const int32_t ROWS) {
  const int32_t rows = ROWS ? ROWS : job->rows, kmax = keys_seen(job, rows);
  if (kmax <= 0) return;
  const attend_ctx c = {job, align64c(job->keys), align64c(job->values), key_stride(panel_keys), value_stride(D)};
  ATTEND_BLOCKS(rows * job->group, kmax, attend_block, D, &c);
}

#endif
