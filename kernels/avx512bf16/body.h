/* The avx512bf16 set's bodies (load, attend, decode), always inline, in avx512bf16/vec.h's two forms:
 * avx512bf16/set.c instantiates them with vdpbf16ps, avx512bf16/twin.c with its emulation, each generated
 * bucket (avx512bf16/bucket.h) with a constant head dim.
 *
 * Arithmetic (docs/design.md: scores and outputs accumulated in fp32):
 *   S = Q K^T   products of bf16 pairs, fp32 accumulation (vdpbf16ps). The query is rounded to bf16
 *               *unscaled* (uattn_kernel_caps.unscaled_q: the forward hands it the query as widened), and each fp32
 *               score is then multiplied by job->scale. A bf16 model's query is bf16, so its rounding is
 *               exact and the score is round(scale * <q, k>) of an fp32 dot product: the seed's formula with
 *               no rounding added. Scaling first would round scale * q, an extra relative 2^-9 per element.
 *   softmax     bf16_softmax_row: common/softmax.h's rules (mask, soft cap, ALiBi; a row that only a mask cuts
 *               masked lane by lane, its scores unscaled) and online rescale, 16 lanes at a time, in fp32, the
 *               weights as 2^(s c - m log2 e) from one FMA (v16_exp2_fms: fewer vector operations than
 *               e^(s scale - m)), P written straight into bf16 pairs; l sums the unrounded weights.
 *   P V         default: P rounded to bf16 (relative 2^-9 each), pairs of keys multiplied by vdpbf16ps with
 *               fp32 accumulation. job->probs_fp32 (the layer's option): P stays fp32 and V, exact in
 *               fp32, goes through fp32 FMAs, the other sets' arithmetic for this product.
 * Keys and values of another dtype (this step's, in an f32 layer; a cache forced onto this set) are rounded
 * to bf16 when loaded.
 *
 * Panels (this set's own layout, 32-bit pairs stored in the float panels; panel_floats says how much):
 *   keys    pairs along the head dim: pair p (dims 2p, 2p + 1) of key i at kp[p * P + i], P = key_stride
 *           (an odd number of 64-byte lines, see common/panels.h), for Dh = head dim rounded up to 16 / 2 pair
 *           rows. One vdpbf16ps then takes one broadcast pair of a query against 16 keys. Keys from count up
 *           to the next multiple of 16 and dims past the head dim are zero.
 *   values  pairs along the keys: pair r (keys 2r, 2r + 1), dim d at vp[r * Dv + d], Dv = value_stride. One
 *           vdpbf16ps takes a broadcast pair of P against 16 dims. Keys from count to the next multiple of
 *           16 and dims past the head dim up to the next 16 are zero.
 *   Both start at the first 64-byte boundary of their buffer.
 *
 * attend: common/attend_plan.h's plan (blocks of up to QB query vectors, chunks of KC keys, block_rules shared),
 * with register tiles of NB vectors x 64 keys (scores) and NB vectors x 64 dims
 * (P V): 4 NB accumulators of 16 lanes, 24 for NB = 6, each broadcast pair serving 4 vdpbf16ps (32 keys or
 * dims a tile, 2 a pair, timed slower). Hand-written, not libxsmm's bf16 GEMM: the fused tile keeps S and P in
 * L1, and what it leaves of the vdpbf16ps peak is mostly the fp32 softmax, which bf16 products do not speed
 * up (uattn-kernel-bench; docs/performance.md).
 *
 * decode: avx512bf16/decode.h; on a TILED cache, avx512bf16/decode_tiled.h. */
#ifndef UATTN_AVX512BF16_BODY_H
#define UATTN_AVX512BF16_BODY_H

#include "avx512bf16/decode.h"
#include "avx512bf16/decode_tiled.h"
#include "avx512bf16/vec.h"
#include "common/attend_plan.h"
#include "common/panels.h"
#include "common/softmax.h"

enum {
  BF16_STAGE_DIMS = 256, /* dims of the rows staged at a time by the load */
  BF16_Q_PAIRS = 256,    /* query pairs rounded at a time: head dims up to 512 in one pass, a 6 KB tile */
};

/* ---- layout --------------------------------------------------------------------------------------------- */

static inline int32_t bf16_key_pair_rows(int32_t head_dim) { return ((head_dim + 15) & ~15) / 2; }

static inline size_t bf16_panel_floats(int32_t panel_keys, int32_t head_dim) {
  const int32_t P = key_stride(panel_keys);
  const size_t k = (size_t)bf16_key_pair_rows(head_dim) * P, v = (size_t)(P / 2) * value_stride(head_dim);
  return (k > v ? k : v) + 16; /* + the slack the 64-byte alignment may skip */
}

/* ---- load ------------------------------------------------------------------------------------------------ */

/* Rows [i, i + 8) (those below count; zeros past it), dims [d0, d0 + n), as bf16 rows of BF16_STAGE_DIMS
 * elements zero-padded to n rounded up to 16. fp8 rows are widened exactly (widen8_fp8: the bf16 is the
 * f32's upper half) 8 dims of every row at a time, so the rows' lines are read together: row after row, a
 * cold cache (2 lines a row) kept one or two misses in flight and the load took 3x the attend. */
AVX2_INLINE void bf16_stage(uattn_dtype t, const char *src, size_t step, int32_t i, int32_t count, int32_t d0,
                            int32_t n, uint16_t (*buf)[BF16_STAGE_DIMS]) {
  const size_t esz = uattn_dtype_size(t);
  const int32_t padded = (n + 15) & ~15, rows = count - i < 0 ? 0 : count - i < 8 ? count - i : 8;
  const int32_t n8 = uattn_dtype_is_fp8(t) ? n & ~7 : 0;
  for (int32_t d = 0; d < n8; d += 8)
    for (int k = 0; k < rows; k++) {
      const __m256i x =
          _mm256_srli_epi32(_mm256_castps_si256(widen8_fp8(t, src + (size_t)(i + k) * step + (size_t)(d0 + d))), 16);
      _mm_storeu_si128((__m128i *)(buf[k] + d),
                       _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1)));
    }
  for (int k = 0; k < 8; k++) {
    uint16_t *row = buf[k];
    int32_t d = 0;
    if (k < rows) {
      const char *r = src + (size_t)(i + k) * step + (size_t)d0 * esz;
      if (t == UATTN_BF16) {
        memcpy(row, r, 2 * (size_t)n), d = n;
      } else {
        for (d = n8; d < n; d++) row[d] = uattn_f32_to_bf16(widen1(t, r, (size_t)d));
      }
    }
    for (; d < padded; d++) row[d] = 0;
  }
}

#if defined(AVX512_VEC_ZMM)
/* 16 rows of 16 32-bit elements (a[k]: row k) transposed in place: a[j] then holds element j of every row.
 * Pairs within 128-bit lanes (unpacks of 32 and of 64 bits), then the lanes across rows (vshufi32x4). */
BF16_INLINE void transpose16_32(v16i a[16]) {
  v16i t[16];
  for (int k = 0; k < 16; k += 2) /* lane q of t[k]: elements 4q, 4q + 1 of rows k, k + 1; t[k + 1]: 4q + 2, 4q + 3 */
    t[k] = _mm512_unpacklo_epi32(a[k], a[k + 1]), t[k + 1] = _mm512_unpackhi_epi32(a[k], a[k + 1]);
  for (int k = 0; k < 16; k += 4) { /* lane q of a[k + e]: element 4q + e of rows k to k + 3 */
    a[k] = _mm512_unpacklo_epi64(t[k], t[k + 2]), a[k + 1] = _mm512_unpackhi_epi64(t[k], t[k + 2]);
    a[k + 2] = _mm512_unpacklo_epi64(t[k + 1], t[k + 3]), a[k + 3] = _mm512_unpackhi_epi64(t[k + 1], t[k + 3]);
  }
  for (int e = 0; e < 4; e++) { /* element 4q + e: lane q of a[e], a[4 + e], a[8 + e], a[12 + e] */
    const v16i t0 = _mm512_shuffle_i32x4(a[e], a[4 + e], 0x88), t1 = _mm512_shuffle_i32x4(a[e], a[4 + e], 0xdd);
    const v16i t2 = _mm512_shuffle_i32x4(a[8 + e], a[12 + e], 0x88),
               t3 = _mm512_shuffle_i32x4(a[8 + e], a[12 + e], 0xdd);
    t[e] = _mm512_shuffle_i32x4(t0, t2, 0x88), t[8 + e] = _mm512_shuffle_i32x4(t0, t2, 0xdd);
    t[4 + e] = _mm512_shuffle_i32x4(t1, t3, 0x88), t[12 + e] = _mm512_shuffle_i32x4(t1, t3, 0xdd);
  }
  for (int j = 0; j < 16; j++) a[j] = t[j];
}

/* 32 dims of a row from p as bf16, in order: bf16 codes, or (tab: fp8_bf16_table's) fp8 ones widened exactly */
BF16_INLINE v16i bf16_dims32(const uint8_t *tab, const char *p) {
  if (!tab) return v16i_load(p);
  v16i a, b; /* b: codes 32-63, zeros here, unused */
  v16i_fp8_widen_in_order(_mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)p)), tab, &a, &b);
  return a;
}

/* bf16_load_body for bf16 or fp8 rows (tab: fp8_bf16_table's) of a head dim that is a multiple of 32, in zmm,
 * without staging: 16 keys at a time, each 32 dims of the 16 rows (16 pairs; fp8 codes widened by
 * v16i_fp8_widen_in_order's lookups) one 16 x 16 transpose of pairs into 16 key-pair lines, and each two value
 * rows' 32 dims interleaved into pairs by two vpermt2w: the same panels as the staged path, an fp8 NaN
 * another NaN of its sign (tests/kernels: avx512bf16_load_is_its_twins). Faster than the staged path, which
 * widens 8 dims of a row at a time through F16C, on bf16 and most of all on fp8 rows (uattn-kernel-bench
 * --bucket DTYPE:128:D:0 times the load). */
BF16_INLINE void bf16_load_rows_zmm(const uint8_t *tab, const char *k_src, const char *v_src, size_t step,
                                    int32_t count, const int32_t D, int32_t P, int32_t Dv, uint32_t *kp, uint32_t *vp) {
  static const uint16_t pair_lo[32]
      __attribute__((aligned(64))) = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                      8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  static const uint16_t pair_hi[32]
      __attribute__((aligned(64))) = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                      24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const v16i lo = _mm512_load_si512(pair_lo), hi = _mm512_load_si512(pair_hi);
  const size_t esz = tab ? 1 : 2, row_bytes = esz * (size_t)D;
  const bool prefetch = step != row_bytes; /* bf16_load_body's prefetches, where rows are apart (NHD) */
  const bool latent = k_src == v_src;
  const int32_t end = (count + 15) & ~15;
  const v16i zero = _mm512_setzero_si512();
  for (int32_t i = 0; i < end; i += 16) {
    if (prefetch)
      load_prefetch(k_src, v_src, step, i, count, row_bytes),
          load_prefetch(k_src, v_src, step, i + 8, count, row_bytes);
    const int32_t rows = count - i < 16 ? count - i : 16; /* rows past count are zeros */
    for (int32_t d = 0; d < D; d += 32) {
      v16i a[16];
      for (int k = 0; k < 16; k++) a[k] = k < rows ? bf16_dims32(tab, k_src + (size_t)(i + k) * step + esz * d) : zero;
      for (int r = 0; r < 8; r++) {
        /* a latent's values are its keys' rows (uattn_layer.kv_latent): the ones just read, not read again */
        const v16i x = latent         ? a[2 * r]
                       : 2 * r < rows ? bf16_dims32(tab, v_src + (size_t)(i + 2 * r) * step + esz * d)
                                      : zero;
        const v16i y = latent             ? a[2 * r + 1]
                       : 2 * r + 1 < rows ? bf16_dims32(tab, v_src + (size_t)(i + 2 * r + 1) * step + esz * d)
                                          : zero;
        uint32_t *o = vp + (size_t)(i / 2 + r) * Dv + d;
        _mm512_storeu_si512(o, _mm512_permutex2var_epi16(x, lo, y));
        _mm512_storeu_si512(o + 16, _mm512_permutex2var_epi16(x, hi, y));
      }
      transpose16_32(a);
      for (int j = 0; j < 16; j++) _mm512_store_si512(kp + (size_t)(d / 2 + j) * P + i, a[j]);
    }
  }
}
#endif

/* keys and values [0, count) of head_dim D into the panels (see the header comment), count rounded up to 16
 * with zeros. */
BF16_INLINE void bf16_load_body(uattn_dtype t, const void *k_src, const void *v_src, size_t stride, int32_t count,
                                const int32_t D, int32_t panel_keys, float *keys, float *values) {
  const size_t step = stride * uattn_dtype_size(t);
  const int32_t P = key_stride(panel_keys), Dv = value_stride(D), end = (count + 15) & ~15;
  uint32_t *kp = (uint32_t *)align64(keys), *vp = (uint32_t *)align64(values);
#if defined(AVX512_VEC_ZMM)
  if (t == UATTN_BF16 && D % 32 == 0) { /* a constant NULL: the bf16 instance has no widening */
    bf16_load_rows_zmm(NULL, k_src, v_src, step, count, D, P, Dv, kp, vp);
    return;
  }
  if (uattn_dtype_is_fp8(t) && D % 32 == 0) {
    bf16_load_rows_zmm(fp8_bf16_table(t), k_src, v_src, step, count, D, P, Dv, kp, vp);
    return;
  }
#endif
  _Alignas(64) uint16_t kb[8][BF16_STAGE_DIMS], vb[8][BF16_STAGE_DIMS];
  /* avx2_load_body's prefetches, where rows are apart (NHD). On a cold NHD block (uattn-kernel-bench):
   * 4.3 GB/s (this bucket) and 6.3 (the set's generic load), against 3.6 and 2.7 with the same prefetches
   * into L1 and 16 rows ahead; spec-decode 16x8 on one core 79% -> 100% of the fp32 FMA peak */
  const size_t row_bytes = (size_t)D * uattn_dtype_size(t);
  const bool prefetch = step != row_bytes;
  for (int32_t i = 0; i < end; i += 8) {
    if (prefetch) load_prefetch(k_src, v_src, step, i, count, row_bytes);
    for (int32_t d0 = 0; d0 < D; d0 += BF16_STAGE_DIMS) {
      const int32_t n = D - d0 < BF16_STAGE_DIMS ? D - d0 : BF16_STAGE_DIMS, padded = (n + 15) & ~15;
      bf16_stage(t, k_src, step, i, count, d0, n, kb);
      bf16_stage(t, v_src, step, i, count, d0, n, vb);
      /* keys: the 8 rows' pairs transposed 8 at a time, pairs being 32-bit elements (transpose8_32 moves bits) */
      for (int32_t p = 0; p < padded / 2; p += 8)
        transpose8_32((const char *)&kb[0][2 * p], sizeof kb[0], (float *)kp + (size_t)(d0 / 2 + p) * P + i, P);
      /* values: rows 2r and 2r + 1 interleaved element by element into pairs */
      for (int r = 0; r < 4; r++) {
        uint32_t *o = vp + (size_t)(i / 2 + r) * Dv + d0;
        for (int32_t d = 0; d < padded; d += 8) {
          const __m128i a = _mm_loadu_si128((const __m128i *)&vb[2 * r][d]);
          const __m128i b = _mm_loadu_si128((const __m128i *)&vb[2 * r + 1][d]);
          _mm_storeu_si128((__m128i *)(o + d), _mm_unpacklo_epi16(a, b));
          _mm_storeu_si128((__m128i *)(o + d + 4), _mm_unpackhi_epi16(a, b));
        }
      }
    }
  }
}

/* n bf16 or fp8 codes at src as bf16: fp8 exactly, as bf16_stage widens them. */
AVX2_INLINE void bf16_from_codes(uattn_dtype t, const char *src, int32_t n, uint16_t *out) {
  if (t == UATTN_BF16) {
    memcpy(out, src, 2 * (size_t)n);
    return;
  }
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_srli_epi32(_mm256_castps_si256(widen8_fp8(t, src + i)), 16);
    _mm_storeu_si128((__m128i *)(out + i), _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1)));
  }
  for (; i < n; i++) out[i] = uattn_f32_to_bf16(widen1(t, src, (size_t)i));
}

/* Where the values of the key pair holding block key j start in a head's shares of a TILED block (vs: the
 * first tile's share). */
static inline const char *tiled_value_pair(const char *vs, size_t tile_bytes, size_t pair_bytes, int32_t j) {
  return vs + (size_t)(j / UATTN_TILED_KEYS) * tile_bytes + (size_t)(j % UATTN_TILED_KEYS / 2) * pair_bytes;
}

/* kernels.h's load_tiled: bf16_load_body's panels from keys [first, first + count) of a TILED block (uattn.h)
 * of one KV head, as the block lies. A key line of the cache (a dim pair of a tile's 16 keys) is a piece of
 * a key row of the panel, and a value line (16 dims of a key pair) a piece of a value row, so both are
 * copies (fp8: widened), with no transposes; only a call from an odd key pairs its values anew, each panel
 * pair taking its halves from two of the tile's. k_src, v_src: the head's share of the block's first tile;
 * stride: elements from one tile's share to the next's. Nothing outside the call's keys reaches the panels
 * (the pads are zeros), so a slot never written, NaN for all anyone knows, cannot reach the output. */
AVX2_INLINE void bf16_load_tiled_body(uattn_dtype t, const void *k_src, const void *v_src, size_t stride, int32_t first,
                                      int32_t count, const int32_t D, int32_t panel_keys, float *keys, float *values) {
  enum { T = UATTN_TILED_KEYS, DC = 128 /* dims per pass where an odd first pairs the values anew */ };
  const size_t esz = uattn_dtype_size(t), tile_bytes = stride * esz, pair_bytes = 2 * (size_t)D * esz;
  const int32_t P = key_stride(panel_keys), Dv = value_stride(D), end = (count + 15) & ~15, padded = (D + 15) & ~15;
  uint32_t *kp = (uint32_t *)align64(keys), *vp = (uint32_t *)align64(values);
  const char *ks = k_src, *vs = v_src;
  for (int32_t c0 = 0, n; c0 < count; c0 += n) {
    const int32_t j = first + c0, l0 = j % T;
    n = T - l0 < count - c0 ? T - l0 : count - c0;
    const char *tile = ks + (size_t)(j / T) * tile_bytes;
    for (int32_t p = 0; p < D / 2; p++) {
      const char *line = tile + (size_t)p * 2 * T * esz;
      uint32_t *dst = kp + (size_t)p * P + c0;
      if (n == T) {
        bf16_from_codes(t, line, 2 * T, (uint16_t *)dst);
      } else {
        uint16_t w[2 * T];
        bf16_from_codes(t, line, 2 * T, w);
        memcpy(dst, w + 2 * l0, 4 * (size_t)n);
      }
    }
  }
  for (int32_t p = 0; p < padded / 2; p++) {
    const int32_t from = p < D / 2 ? count : 0;
    memset(kp + (size_t)p * P + from, 0, 4 * (size_t)(end - from));
  }
  const int32_t pairs = (count + 1) / 2;
  for (int32_t r = 0; r < pairs; r++) {
    uint32_t *dst = vp + (size_t)r * Dv;
    const int32_t a = first + 2 * r; /* the panel pair's first key in the block */
    const bool second = 2 * r + 1 < count;
    if (a % 2 == 0) {
      bf16_from_codes(t, tiled_value_pair(vs, tile_bytes, pair_bytes, a), 2 * D, (uint16_t *)dst);
      if (!second)
        for (int32_t d = 0; d < D; d++) dst[d] &= 0xffff; /* the first key is the low half */
    } else { /* key a is the high half of the tile's pair (a - 1, a), key a + 1 the low half of the next */
      for (int32_t d0 = 0; d0 < D; d0 += DC) {
        const int32_t n = D - d0 < DC ? D - d0 : DC;
        uint32_t lo[DC], hi[DC] = {0};
        bf16_from_codes(t, tiled_value_pair(vs, tile_bytes, pair_bytes, a - 1) + 2 * (size_t)d0 * esz, 2 * n,
                        (uint16_t *)lo);
        if (second)
          bf16_from_codes(t, tiled_value_pair(vs, tile_bytes, pair_bytes, a + 1) + 2 * (size_t)d0 * esz, 2 * n,
                          (uint16_t *)hi);
        for (int32_t d = 0; d < n; d++) dst[d0 + d] = lo[d] >> 16 | hi[d] << 16;
      }
    }
    memset(dst + D, 0, 4 * (size_t)(padded - D));
  }
  for (int32_t r = pairs; r < end / 2; r++) memset(vp + (size_t)r * Dv, 0, 4 * (size_t)padded);
}

/* ---- attend -------------------------------------------------------------------------------------------- */

/* S[i][j - j0] += <q_i, k_j> over np pairs of dims for NB vectors (pairs at qp + i * np, the keys' from kp)
 * and keys [j, j + 16 W); first: S starts from 0. An fp32 partial sum stored and loaded back is exact, so
 * a dot product taken a slice of pairs at a time is the one chain of vdpbf16ps it would be at once. */
BF16_INLINE void bf16_score_part(const int NB, const int W, const uint32_t *qp, int32_t np, const uint32_t *kp,
                                 int32_t P, int32_t j, int32_t j0, bool first, float (*S)[KC]) {
  v16 a[QB][4];
  for (int i = 0; i < NB; i++)
    for (int w = 0; w < W; w++) a[i][w] = first ? v16_zero() : v16_load(S[i] + (j - j0) + 16 * w);
  const uint32_t *k = kp + j;
  for (int32_t p = 0; p < np; p++, k += P) {
    v16i kv[4];
    for (int w = 0; w < W; w++) kv[w] = v16i_load(k + 16 * w);
    for (int i = 0; i < NB; i++) {
      const v16i b = v16i_set1(qp[(size_t)i * np + p]);
      for (int w = 0; w < W; w++) a[i][w] = v16_dpbf16(a[i][w], b, kv[w]);
    }
  }
  for (int i = 0; i < NB; i++)
    for (int w = 0; w < W; w++) v16_store(S[i] + (j - j0) + 16 * w, a[i][w]);
}

/* 16 W dims from d (n of them there) of o_i = alpha_i o_i + sum over keys [klo, khi) of P_i V, in key pairs, for
 * NB vectors: P as bf16 pairs (pp[i][r - j0 / 2]) through vdpbf16ps, or (FP32) as floats (S) through FMAs with
 * the value pairs widened. A pair that straddles klo or khi has its outside key's value read as zero: its P is
 * 0, but the cache may hold anything there (NaN included), and 0 x NaN would reach the output. */
BF16_INLINE void bf16_pv_part(const int NB, const int W, const bool FP32, float (*S)[KC], uint32_t (*pp)[KC / 2],
                              int32_t j0, int32_t klo, int32_t khi, const uint32_t *vp, int32_t Dv, float *o, int32_t D,
                              int32_t n, const float *alpha) {
  const int32_t r0 = klo / 2, r1 = (khi + 1) / 2;
  /* the low half of a pair is its even key */
  const uint32_t first = klo & 1 ? 0xffff0000u : ~0u, last = khi & 1 ? 0x0000ffffu : ~0u;
  v16 a[QB][4];
  for (int i = 0; i < NB; i++)
    for (int w = 0; w < W; w++)
      a[i][w] = v16_mul(v16_set1(alpha[i]), v16_load_n(o + (size_t)i * D + 16 * w, n - 16 * w));
  const uint32_t *v = vp + (size_t)r0 * Dv;
  for (int32_t r = r0; r < r1; r++, v += Dv) {
    v16i vv[4];
    for (int w = 0; w < W; w++) vv[w] = v16i_load(v + 16 * w);
    const uint32_t keep = (r == r0 ? first : ~0u) & (r == r1 - 1 ? last : ~0u);
    if (keep != ~0u)
      for (int w = 0; w < W; w++) vv[w] = v16i_and32(vv[w], keep);
    if (FP32) {
      v16 ve[4], vo[4];
      for (int w = 0; w < W; w++) ve[w] = v16i_lo(vv[w]), vo[w] = v16i_hi(vv[w]);
      for (int i = 0; i < NB; i++) {
        const v16 pe = v16_set1(S[i][2 * r - j0]), po = v16_set1(S[i][2 * r + 1 - j0]);
        for (int w = 0; w < W; w++) a[i][w] = v16_fmadd(po, vo[w], v16_fmadd(pe, ve[w], a[i][w]));
      }
    } else {
      for (int i = 0; i < NB; i++) {
        const v16i p = v16i_set1(pp[i][r - j0 / 2]);
        for (int w = 0; w < W; w++) a[i][w] = v16_dpbf16(a[i][w], p, vv[w]);
      }
    }
  }
  for (int i = 0; i < NB; i++)
    for (int w = 0; w < W; w++) v16_store_n(o + (size_t)i * D + 16 * w, a[i][w], n - 16 * w);
}

BF16_INLINE void bf16_pv_tile(const int NB, const bool FP32, float (*S)[KC], uint32_t (*pp)[KC / 2], int32_t j0,
                              int32_t klo, int32_t khi, const uint32_t *vp, int32_t Dv, float *o, int32_t D, int32_t E,
                              const float *alpha) {
  int32_t d = 0;
  for (; d + 64 <= E; d += 64) bf16_pv_part(NB, 4, FP32, S, pp, j0, klo, khi, vp + d, Dv, o + d, D, 64, alpha);
  for (; d + 32 <= E; d += 32) bf16_pv_part(NB, 2, FP32, S, pp, j0, klo, khi, vp + d, Dv, o + d, D, 32, alpha);
  for (; d < E; d += 16) bf16_pv_part(NB, 1, FP32, S, pp, j0, klo, khi, vp + d, Dv, o + d, D, E - d, alpha);
}

/* One vector's row of a tile (softmax_row's job, 16 scores at a time): S[j0, j1) holds <q, k> unscaled;
 * s = job->scale <q, k> (one rounding, the seed's), the rule, then P = e^(s - m_new) into pairs (bf16 pairs,
 * P V's operand) or, with job->probs_fp32, into S as floats; m and l updated, and the factor o must be
 * rescaled by returned. A row that sees all of [j0, j1) with no cap or slope (all but the diagonal of a
 * prefill) takes its max on the unscaled scores (scaling by a positive factor and rounding keep the order, so
 * the max of the scaled scores is the scaled max) and scales them in the exp pass: one pass over S less.
 * Rows with a rule (or a layer scale <= 0, which the API allows) are scaled first and go through
 * row_rules_max. 16 lanes a step, where softmax_row takes 8: the same exp to the bit (v16_exp), l summed in
 * another order. */
/* The first half of bf16_softmax_row: the maximum of the row's scores over the keys it sees, scaled. A row that
 * only a mask cuts (*plain: no soft cap or ALiBi) keeps its scores unscaled and is masked lane by lane; the
 * others are scaled and ruled in place (common/softmax.h's rules: -inf where masked). */
BF16_INLINE float bf16_row_max(float *s, int32_t j0, int32_t j1, const vec_rule *v, const uattn_panel_job *job,
                               bool *plain) {
  *plain = job->scale > 0.0f && job->soft_cap <= 0.0f && v->slope == 0.0f;
  if (*plain) {
    v16 vmax = v16_set1(-INFINITY);
    for (int32_t j = j0; j < j1; j += 16) {
      v16 x = v16_load(s + (j - j0));
      if (j < v->lo || j + 16 > v->hi) x = v16_keep_range(x, v->lo - j, v->hi - j, -INFINITY);
      vmax = v16_max(vmax, x);
    }
    return v16_hmax(vmax) * job->scale;
  }
  const v16 scale = v16_set1(job->scale);
  for (int32_t j = 0; j < j1 - j0; j += 16) v16_store(s + j, v16_mul(v16_load(s + j), scale));
  return row_rules_max(s, j0, j1, v, job->soft_cap);
}

/* The second half: P = e^(s - m_new) as 2^(x c - m_new log2 e) from one FMA (v16_exp2_fms), x the row's scores
 * and c the scale times log2 e for a plain row (zero outside the keys it sees), log2 e for a row ruled in
 * place; into bf16 pairs, or over s for probs_fp32. Returns the sum of the unrounded weights. */
BF16_INLINE float bf16_row_exp(float *s, int32_t j0, int32_t j1, const vec_rule *v, bool plain,
                               const uattn_panel_job *job, float m_new, uint32_t *pairs) {
  const int32_t lo = plain ? v->lo : j0, hi = plain ? v->hi : j1;
  const v16 c = v16_set1(plain ? job->scale * LOG2E_F : LOG2E_F), mc = v16_set1(m_new * LOG2E_F);
  /* read once: the pairs' stores may alias anything (__m256i), so the compiler would read it again each step */
  const bool fp32 = job->probs_fp32;
  v16 sum = v16_zero();
  for (int32_t j = j0; j < j1; j += 16, s += 16, pairs += 8) {
    v16 p = v16_exp2_fms(v16_load(s), c, mc);
    if (j < lo || j + 16 > hi) p = v16_keep_range(p, lo - j, hi - j, 0.0f);
    sum = v16_add(sum, p);
    if (fp32)
      v16_store(s, p);
    else
      _mm256_storeu_si256((__m256i *)pairs, v16_pairs_bf16(p));
  }
  return v16_hsum(sum);
}

BF16_INLINE float bf16_softmax_row(float *s, int32_t j0, int32_t j1, const vec_rule *v, const uattn_panel_job *job,
                                   float *m, float *l, uint32_t *pairs) {
  bool plain;
  float alpha;
  const float m_new = row_new_max(bf16_row_max(s, j0, j1, v, job, &plain), *m, &alpha);
  *l = *l * alpha + bf16_row_exp(s, j0, j1, v, plain, job, m_new, pairs);
  *m = m_new;
  return alpha;
}

/* A call's panels, and its tiles: kept here, once for every block size's copy of the block code. */
typedef struct bf16_ctx {
  const uattn_panel_job *job;
  const uint32_t *kp, *vp;
  int32_t P, Dv;
  float (*S)[KC];         /* [QB][KC] scores, then P */
  uint32_t (*pp)[KC / 2]; /* [QB][KC / 2] P in bf16 pairs */
  uint32_t *qp;           /* [QB * BF16_Q_PAIRS] a slice of the queries' pairs */
} bf16_ctx;

/* Query vectors [x0, x0 + NB) of the job against keys [c0, c1) of the panel. */
BF16_INLINE void bf16_attend_block(const int NB, const int32_t D, const bf16_ctx *c, int32_t x0, int32_t c0,
                                   int32_t c1) {
  const uattn_panel_job *job = c->job;
  vec_rule rule[QB];
  int32_t klo, khi;
  block_rules(job, x0, NB, c0, c1, rule, &klo, &khi);
  if (klo >= khi) return; /* a fully masked tile */
  /* columns from a multiple of 16 (c0 is one) to the next: the panel is zero up to there */
  const int32_t j0 = klo & ~15, j1 = (khi + 15) & ~15, Dh = bf16_key_pair_rows(D);
  float(*S)[KC] = c->S;
  uint32_t(*pp)[KC / 2] = c->pp;
  for (int32_t p0 = 0; p0 < Dh; p0 += BF16_Q_PAIRS) {
    const int32_t np = Dh - p0 < BF16_Q_PAIRS ? Dh - p0 : BF16_Q_PAIRS;
    for (int i = 0; i < NB; i++) { /* the unscaled query, rounded to bf16 (see the header comment) */
      const float *x = job->q + (size_t)(x0 + i) * D;
      uint32_t *q = c->qp + (size_t)i * np;
      const int32_t whole = D / 2 - p0 < np ? D / 2 - p0 : np; /* pairs of two dims of the query */
      pairs_bf16(x + 2 * p0, 2 * whole, q);
      for (int32_t p = whole; p < np; p++) /* past the head dim: zeros (and its odd last dim) */
        q[p] = 2 * (p0 + p) < D ? pair_bf16(x[2 * (p0 + p)], 0.0f) : 0;
    }
    const uint32_t *kp = c->kp + (size_t)p0 * c->P;
    for (int32_t j = j0; j < j1;) {
      if (j1 - j >= 64)
        bf16_score_part(NB, 4, c->qp, np, kp, c->P, j, j0, p0 == 0, S), j += 64;
      else if (j1 - j >= 32)
        bf16_score_part(NB, 2, c->qp, np, kp, c->P, j, j0, p0 == 0, S), j += 32;
      else
        bf16_score_part(NB, 1, c->qp, np, kp, c->P, j, j0, p0 == 0, S), j += 16;
    }
  }
  float alpha[QB];
  for (int i = 0; i < NB; i++) {
    const size_t x = (size_t)x0 + i;
    if (rule[i].lo < rule[i].hi) {
      alpha[i] = bf16_softmax_row(S[i], j0, j1, &rule[i], job, &job->m[x], &job->l[x], pp[i]);
    } else { /* this vector sees none of the chunk: o stays exactly as it is */
      alpha[i] = 1.0f;
      memset(S[i], 0, sizeof(float) * (size_t)(j1 - j0));
      memset(pp[i], 0, sizeof(uint32_t) * (size_t)(j1 - j0) / 2);
    }
  }
  float *o = job->o + (size_t)x0 * D;
  if (job->probs_fp32) /* FP32 a constant in each call: one loop of either kind, all its accumulators in registers */
    bf16_pv_tile(NB, true, S, pp, j0, klo, khi, c->vp, c->Dv, o, D, uattn_job_value_dim(job), alpha);
  else
    bf16_pv_tile(NB, false, S, pp, j0, klo, khi, c->vp, c->Dv, o, D, uattn_job_value_dim(job), alpha);
}

/* The job's vectors against its panel (avx2_attend_body's plan); D constant where the caller is specialized. */
BF16_INLINE void bf16_attend_body(const uattn_panel_job *job, int32_t panel_keys, const int32_t D) {
  const int32_t kmax = keys_seen(job, job->rows);
  if (kmax <= 0) return;
  _Alignas(64) float S[QB][KC];
  _Alignas(64) uint32_t pp[QB][KC / 2];
  _Alignas(64) uint32_t qp[QB * BF16_Q_PAIRS];
  const bf16_ctx c = {job,
                      (const uint32_t *)align64c(job->keys),
                      (const uint32_t *)align64c(job->values),
                      key_stride(panel_keys),
                      value_stride(D),
                      S,
                      pp,
                      qp};
  ATTEND_BLOCKS(job->rows * job->group, kmax, bf16_attend_block, D, &c);
}

#endif
