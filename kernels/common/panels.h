/* The fp32 panels of the avx2 and avx512 sets (panel_floats says how much they need) and their load; the
 * avx512bf16 load takes its pieces (the layout's strides, transpose8_32, load_prefetch).
 *
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
 * Loads are prefetched into L2 LOAD_AHEAD rows ahead where rows lie apart (NHD), since cold cache blocks are
 * the common case, and a group's key rows are staged in L1 before their transposes so the panels' stores do
 * not stall the rows' loads (docs/performance.md). */
#ifndef UATTN_COMMON_PANELS_H
#define UATTN_COMMON_PANELS_H

#include "common/widen.h"

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

/* ---- load: transposing ---------------------------------------------------------------------------- */

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
 * L2: a request for L1 holds one of the core's few L1 miss buffers until its line comes, which caps the
 * lines in flight. */
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

/* Keys and values [0, count) into the panels, a group of 8 at a time: two streams in flight. */
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

/* ---- load: a TILED cache's blocks as they lie --------------------------------------------------------- */

/* 16 element pairs at x (32 elements of dtype t: a TILED key line, one dim pair of 16 keys, or a value line,
 * 16 dims of a key pair) widened exactly, the pairs' first elements into a[0..1] and their second into
 * b[0..1] (8 floats each, in the pairs' order). bf16: a shift and a mask a vector. fp8: the 32 codes' quarters
 * (a 32-bit lane holds two pairs, so quarters 0 and 2 are the first elements of the even and the odd pairs, 1
 * and 3 the second), their special codes mended where the line has one, times 2^R, then the even and odd
 * pairs interleaved: under half of widen8_fp8's operations for the same values. The others: widen8, then
 * the pairs' two elements parted by a shuffle and a swap of 64-bit quarters. */
AVX2_INLINE void tiled_pairs16(uattn_dtype t, const char *x, __m256 a[2], __m256 b[2]) {
  if (uattn_dtype_is_fp8(t)) {
    const __m256i c = _mm256_loadu_si256((const __m256i *)x);
    const __m256i sp = fp8_special(t, c);
    const bool patch = !_mm256_testz_si256(sp, sp);
    const __m256 up = _mm256_set1_ps(ldexpf(1.0f, fp8_rebias(t)));
    __m256 q[4];
    for (int k = 0; k < 4; k++) {
      q[k] = fp8_quarter(t, c, k);
      if (patch) q[k] = fp8_patch(t, q[k], c, k);
      q[k] = _mm256_mul_ps(up, q[k]);
    }
    for (int e = 0; e < 2; e++) { /* e: the pairs' first elements (quarters 0, 2), then their second (1, 3) */
      const __m256 u0 = _mm256_unpacklo_ps(q[e], q[2 + e]), u1 = _mm256_unpackhi_ps(q[e], q[2 + e]);
      __m256 *out = e ? b : a;
      out[0] = _mm256_permute2f128_ps(u0, u1, 0x20), out[1] = _mm256_permute2f128_ps(u0, u1, 0x31);
    }
    return;
  }
  const size_t esz = uattn_dtype_size(t);
  for (int h = 0; h < 2; h++) {
    const char *p = x + (size_t)h * 16 * esz;
    if (t == UATTN_BF16) {
      const __m256i v = _mm256_loadu_si256((const __m256i *)p);
      a[h] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      b[h] = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
      continue;
    }
    const __m256 lo = widen8(t, p), hi = widen8(t, p + 8 * esz); /* pairs 0-3, 4-7 */
    a[h] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0))),
                                                  _MM_SHUFFLE(3, 1, 2, 0)));
    b[h] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1))),
                                                  _MM_SHUFFLE(3, 1, 2, 0)));
  }
}

/* n floats (0 < n <= 16) of a widened half-line pair (a: 16 floats in two vectors) from element l0 to dst. */
AVX2_INLINE void store_part16(const __m256 a[2], int32_t l0, int32_t n, float *dst) {
  if (l0 == 0 && n == 16) {
    _mm256_storeu_ps(dst, a[0]), _mm256_storeu_ps(dst + 8, a[1]);
    return;
  }
  _Alignas(32) float tmp[16];
  _mm256_store_ps(tmp, a[0]), _mm256_store_ps(tmp + 8, a[1]);
  memcpy(dst, tmp + l0, sizeof(float) * (size_t)n);
}

/* kernels.h's load_tiled for the avx2 and avx512 sets: avx2_load_body's panels, to the bit and the pad, from
 * keys [first, first + count) of a TILED block (uattn.h) of one KV head. A key line of the cache (a dim pair
 * of a tile's 16 keys) widens into pieces of two rows of the transposed key panel, a value line (16 dims of a
 * key pair) into pieces of two value rows: no transposes, where rows need 8 x 8 ones. k_src, v_src: the head's
 * share of the block's first tile; stride: elements from one tile's share to the next's. Each line read asks
 * for the same line of the next tile's share. Keys outside the range (NaN for all anyone knows) are not read
 * into the panels. */
AVX2_INLINE void avx2_load_tiled_body(uattn_dtype t, const void *k_src, const void *v_src, size_t stride, int32_t first,
                                      int32_t count, const int32_t D, int32_t panel_keys, float *keys, float *values) {
  enum { T = 16 /* UATTN_TILED_KEYS */ };
  const size_t esz = uattn_dtype_size(t), tile_bytes = stride * esz, line = 2 * T * esz, pair = 2 * (size_t)D * esz;
  const int32_t P = key_stride(panel_keys), Dv = value_stride(D), D16 = D & ~15;
  float *kt = align64(keys), *vp = align64(values);
  for (int32_t c0 = 0, n; c0 < count; c0 += n) { /* keys: a tile's part at a time */
    const int32_t j = first + c0, l0 = j % T;
    n = T - l0 < count - c0 ? T - l0 : count - c0;
    const char *tile = (const char *)k_src + (size_t)(j / T) * tile_bytes;
    for (int32_t p = 0; p < D / 2; p++) {
      const char *x = tile + (size_t)p * line;
      _mm_prefetch(x + tile_bytes, _MM_HINT_T0);
      __m256 a[2], b[2];
      tiled_pairs16(t, x, a, b);
      store_part16(a, l0, n, kt + (size_t)(2 * p) * P + c0);
      store_part16(b, l0, n, kt + (size_t)(2 * p + 1) * P + c0);
    }
  }
  const int32_t end = (count + 7) & ~7;
  for (int32_t d = 0; d < D; d++)
    for (int32_t i = count; i < end; i++) kt[(size_t)d * P + i] = 0.0f;
  for (int32_t j = first & ~1; j < first + count; j += 2) { /* values: a key pair's row at a time */
    const char *r = (const char *)v_src + (size_t)(j / T) * tile_bytes + (size_t)(j % T / 2) * pair;
    float *va = j >= first ? vp + (size_t)(j - first) * Dv : NULL; /* the pair's first key, if loaded */
    float *vb = j + 1 < first + count ? vp + (size_t)(j + 1 - first) * Dv : NULL;
    for (int32_t d = 0; d < D16; d += 16) {
      _mm_prefetch(r + 2 * (size_t)d * esz + tile_bytes, _MM_HINT_T0);
      __m256 a[2], b[2];
      tiled_pairs16(t, r + 2 * (size_t)d * esz, a, b);
      if (va) _mm256_store_ps(va + d, a[0]), _mm256_store_ps(va + d + 8, a[1]);
      if (vb) _mm256_store_ps(vb + d, b[0]), _mm256_store_ps(vb + d + 8, b[1]);
    }
    for (int32_t d = D16; d < ((D + 7) & ~7); d++) {
      if (va) va[d] = d < D ? widen1(t, r, 2 * (size_t)d) : 0.0f;
      if (vb) vb[d] = d < D ? widen1(t, r, 2 * (size_t)d + 1) : 0.0f;
    }
  }
}

#endif
