/* The AVX2 decode kernel: a few query rows (up to UATTN_DECODE_MAX_VECTORS query vectors: a decode, a
 * short verification) against keys read straight from the cache, widened in registers, with no key or
 * value panel. Few vectors read each cache block once or a few times, so the panels of avx2_load (a
 * transposed key panel and a value panel, written and then read back) cost more than they save there;
 * here the keys and values go from the cache to the FMAs, 4 vectors a pass.
 *
 *   scores  two keys at a time against up to 4 query vectors: 8 accumulators of 8 lanes over the head
 *           dim (a chain of D / 8 FMAs each, like the panel kernel's DB-dim partial sums), then one hadd
 *           tree turns the 8 accumulators into the 8 scores;
 *   softmax the panel kernel's softmax_row (mask, soft cap, ALiBi, online rescale);
 *   P V     register tiles of up to 4 vectors x 16 dims over the keys, each value vector widened from
 *           the cache row as it is used.
 * bf16 rows are widened 16 elements at a time: in a 32-byte load, a shift gives the even elements as f32
 * and a mask the odd ones (one instruction per 8 floats, where widen8 takes two). The query vectors are put
 * in that even/odd order once a call, and the output tile is read into it and written back out of it, so
 * every dot product and sum has the same terms as in natural order.
 * Needs a head dim that is a multiple of 8 (every generated bucket's); the forward uses load + attend
 * otherwise. Include after avx2_body.h. */
#ifndef UATTN_AVX2_DECODE_H
#define UATTN_AVX2_DECODE_H

#include "avx2_body.h"

enum { DECODE_MAX_KEYS = UATTN_DECODE_MAX_KEYS };

/* The 8 sums of a[0..7], in order. */
AVX2_INLINE __m256 hsum8x8(const __m256 a[8]) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3); /* [a0..a3 | a0..a3] halves */
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* Asks for the cache lines of row j of a source, when j < hi. */
AVX2_INLINE void prefetch_row(const char *src, size_t step, int32_t j, int32_t hi, size_t row_bytes) {
  if (j >= hi) return;
  const char *r = src + (size_t)j * step;
  for (size_t b = 0; b < row_bytes; b += 64) _mm_prefetch(r + b, _MM_HINT_T0);
  _mm_prefetch(r + row_bytes - 1, _MM_HINT_T0); /* a row need not start on a line */
}

/* Keys ahead of the one being scored that are asked for: the cache rows are cold and, in NHD, a row of
 * heads apart, so the hardware prefetcher alone falls behind. */
enum { DECODE_AHEAD = 8 };

/* ---- bf16, even/odd --------------------------------------------------------------------------------- */

/* 16 bf16 elements as f32: e = elements 0, 2, .., 14, o = 1, 3, .., 15. */
AVX2_INLINE void widen16_eo(const void *src, __m256 *e, __m256 *o) {
  const __m256i x = _mm256_loadu_si256(src);
  *e = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
  *o = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xffff0000u)));
}

/* 16 floats in natural order to even/odd order, and back. */
AVX2_INLINE void to_eo(const float *a, __m256 *e, __m256 *o) {
  const __m256 lo = _mm256_loadu_ps(a), hi = _mm256_loadu_ps(a + 8);
  const __m256 t1 = _mm256_permute2f128_ps(lo, hi, 0x20), t2 = _mm256_permute2f128_ps(lo, hi, 0x31);
  *e = _mm256_shuffle_ps(t1, t2, _MM_SHUFFLE(2, 0, 2, 0));
  *o = _mm256_shuffle_ps(t1, t2, _MM_SHUFFLE(3, 1, 3, 1));
}
AVX2_INLINE void from_eo(__m256 e, __m256 o, float *a) {
  const __m256 u0 = _mm256_unpacklo_ps(e, o), u1 = _mm256_unpackhi_ps(e, o);
  _mm256_storeu_ps(a, _mm256_permute2f128_ps(u0, u1, 0x20));
  _mm256_storeu_ps(a + 8, _mm256_permute2f128_ps(u0, u1, 0x31));
}

enum { DECODE_EO_MAX_DIM = 256 }; /* the even/odd path's query copy (larger head dims: widen8) */

/* decode_pv for bf16: 16 dims (from d, as one 32-byte load a value row) of NB vectors, the tile read into
 * and written back out of even/odd order. */
AVX2_INLINE void decode_pv_eo(const int NB, float (*S)[DECODE_MAX_KEYS], int32_t j0, int32_t lo, int32_t hi,
                              const char *v, size_t step, float *o, const int32_t D, const float *alpha) {
  __m256 a[4][2];
  for (int i = 0; i < NB; i++) {
    to_eo(o + (size_t)i * D, &a[i][0], &a[i][1]);
    const __m256 s = _mm256_set1_ps(alpha[i]);
    a[i][0] = _mm256_mul_ps(s, a[i][0]), a[i][1] = _mm256_mul_ps(s, a[i][1]);
  }
  for (int32_t j = lo; j < hi; j++) {
    __m256 ve, vo;
    widen16_eo(v + (size_t)j * step, &ve, &vo);
    for (int i = 0; i < NB; i++) {
      const __m256 p = _mm256_broadcast_ss(S[i] + (j - j0));
      a[i][0] = _mm256_fmadd_ps(p, ve, a[i][0]);
      a[i][1] = _mm256_fmadd_ps(p, vo, a[i][1]);
    }
  }
  for (int i = 0; i < NB; i++) from_eo(a[i][0], a[i][1], o + (size_t)i * D);
}

/* ---- scores and P V ----------------------------------------------------------------------------------- */

/* S[i][j - j0] = <q_i, k_j> for NB <= 4 vectors and keys [lo, hi), key j's row at k + j * step bytes. EO:
 * bf16 keys widened 16 at a time into even/odd halves, the vectors in that order (D a multiple of 16);
 * else widen8, the vectors in natural order. The first block of vectors (first) also asks for the keys
 * ahead and for the values P V will read. */
AVX2_INLINE void decode_scores(const int NB, const bool EO, uattn_dtype t, const float *q, const int32_t D,
                               const char *k, const char *v, size_t step, int32_t lo, int32_t hi, int32_t j0,
                               bool first, float (*S)[DECODE_MAX_KEYS]) {
  const size_t esz = uattn_dtype_size(t), row_bytes = (size_t)D * esz;
  for (int32_t j = lo; first && j < lo + DECODE_AHEAD; j++) prefetch_row(k, step, j, hi, row_bytes);
  for (int32_t j = lo; j < hi; j += 2) {
    if (first)
      for (int32_t x = j; x < j + 2; x++) {
        prefetch_row(k, step, x + DECODE_AHEAD, hi, row_bytes);
        prefetch_row(v, step, x, hi, row_bytes);
      }
    const char *r0 = k + (size_t)j * step, *r1 = j + 1 < hi ? r0 + step : r0; /* an odd last key: twice */
    __m256 a[8];
    for (int x = 0; x < 8; x++) a[x] = _mm256_setzero_ps();
    if (EO) {
      for (int32_t d = 0; d < D; d += 16) {
        __m256 k0e, k0o, k1e, k1o;
        widen16_eo(r0 + 2 * (size_t)d, &k0e, &k0o);
        widen16_eo(r1 + 2 * (size_t)d, &k1e, &k1o);
        for (int i = 0; i < NB; i++) {
          const __m256 qe = _mm256_load_ps(q + (size_t)i * D + d), qo = _mm256_load_ps(q + (size_t)i * D + d + 8);
          a[2 * i] = _mm256_fmadd_ps(qo, k0o, _mm256_fmadd_ps(qe, k0e, a[2 * i]));
          a[2 * i + 1] = _mm256_fmadd_ps(qo, k1o, _mm256_fmadd_ps(qe, k1e, a[2 * i + 1]));
        }
      }
    } else {
      for (int32_t d = 0; d < D; d += 8) {
        const __m256 k0 = widen8(t, r0 + (size_t)d * esz), k1 = widen8(t, r1 + (size_t)d * esz);
        for (int i = 0; i < NB; i++) {
          const __m256 qv = _mm256_loadu_ps(q + (size_t)i * D + d);
          a[2 * i] = _mm256_fmadd_ps(qv, k0, a[2 * i]);
          a[2 * i + 1] = _mm256_fmadd_ps(qv, k1, a[2 * i + 1]);
        }
      }
    }
    _Alignas(32) float s[8];
    _mm256_store_ps(s, hsum8x8(a));
    for (int i = 0; i < NB; i++) {
      S[i][j - j0] = s[2 * i];
      if (j + 1 < hi) S[i][j + 1 - j0] = s[2 * i + 1];
    }
  }
}

/* 16 dims (from d) of o_i = alpha_i o_i + sum_{j in [lo, hi)} P[i][j - j0] v_j for NB vectors, value j's
 * row at v + j * step bytes: per key, two widened value vectors serve NB broadcasts and 2 NB FMAs (split
 * over CHAINS(NB) chains for small NB, as in pv_part). W = 1: 8 dims. */
AVX2_INLINE void decode_pv(const int NB, const int W, uattn_dtype t, float (*S)[DECODE_MAX_KEYS], int32_t j0,
                           int32_t lo, int32_t hi, const char *v, size_t step, float *o, const int32_t D,
                           const float *alpha) {
  const int C = CHAINS(NB);
  __m256 a[4][QB][2];
  for (int i = 0; i < NB; i++)
    for (int w = 0; w < W; w++) {
      a[0][i][w] = _mm256_mul_ps(_mm256_set1_ps(alpha[i]), _mm256_loadu_ps(o + (size_t)i * D + 8 * w));
      for (int c = 1; c < C; c++) a[c][i][w] = _mm256_setzero_ps();
    }
  const size_t wstep = 8 * uattn_dtype_size(t);
  int32_t j = lo;
  for (; j + C <= hi; j += C)
    for (int c = 0; c < C; c++) {
      const char *r = v + (size_t)(j + c) * step;
      __m256 vv[2];
      for (int w = 0; w < W; w++) vv[w] = widen8(t, r + w * wstep);
      for (int i = 0; i < NB; i++) {
        const __m256 p = _mm256_broadcast_ss(S[i] + (j + c - j0));
        for (int w = 0; w < W; w++) a[c][i][w] = _mm256_fmadd_ps(p, vv[w], a[c][i][w]);
      }
    }
  for (; j < hi; j++) {
    const char *r = v + (size_t)j * step;
    for (int i = 0; i < NB; i++) {
      const __m256 p = _mm256_broadcast_ss(S[i] + (j - j0));
      for (int w = 0; w < W; w++) a[0][i][w] = _mm256_fmadd_ps(p, widen8(t, r + w * wstep), a[0][i][w]);
    }
  }
  for (int i = 0; i < NB; i++)
    for (int w = 0; w < W; w++) {
      if (C == 4)
        a[0][i][w] = _mm256_add_ps(_mm256_add_ps(a[0][i][w], a[1][i][w]), _mm256_add_ps(a[2][i][w], a[3][i][w]));
      if (C == 2) a[0][i][w] = _mm256_add_ps(a[0][i][w], a[1][i][w]);
      _mm256_storeu_ps(o + (size_t)i * D + 8 * w, a[0][i][w]);
    }
}

/* Vectors [x0, x0 + NB) of the job (NB <= 4), each with its row's rule, against the keys any of them
 * sees. The first block also asks for the keys and values ahead; the others find them in L1/L2. */
AVX2_INLINE void decode_block(const int NB, const uattn_panel_job *job, int32_t x0, uattn_dtype t, const char *k,
                              const char *v, size_t step, const int32_t D) {
  vec_rule rule[4];
  int32_t lo, hi;
  block_rules(job, x0, NB, 0, job->num_keys, rule, &lo, &hi);
  if (lo >= hi) return; /* none of the block's vectors sees a key */
  const int32_t j0 = lo & ~7, j1 = (hi + 7) & ~7;
  _Alignas(32) float S[4][DECODE_MAX_KEYS];
  for (int i = 0; i < NB; i++) /* the columns softmax_row reads outside [lo, hi): masked, but set */
    for (int32_t j = j0; j < j1; j++) S[i][j - j0] = 0.0f;
  const bool eo = t == UATTN_BF16 && D % 16 == 0 && D <= DECODE_EO_MAX_DIM;
  if (eo) {
    _Alignas(32) float qeo[4 * DECODE_EO_MAX_DIM];
    for (int i = 0; i < NB; i++)
      for (int32_t d = 0; d < D; d += 16) {
        __m256 e, o;
        to_eo(job->q + ((size_t)x0 + i) * D + d, &e, &o);
        _mm256_store_ps(qeo + (size_t)i * D + d, e);
        _mm256_store_ps(qeo + (size_t)i * D + d + 8, o);
      }
    decode_scores(NB, true, t, qeo, D, k, v, step, lo, hi, j0, x0 == 0, S);
  } else {
    decode_scores(NB, false, t, job->q + (size_t)x0 * D, D, k, v, step, lo, hi, j0, x0 == 0, S);
  }
  float alpha[4];
  block_softmax(job, x0, NB, rule, S[0], DECODE_MAX_KEYS, j0, j1, alpha);
  float *o = job->o + (size_t)x0 * D;
  if (eo) {
    for (int32_t d = 0; d < D; d += 16) decode_pv_eo(NB, S, j0, lo, hi, v + (size_t)d * 2, step, o + d, D, alpha);
    return;
  }
  int32_t d = 0;
  for (; d + 16 <= D; d += 16)
    decode_pv(NB, 2, t, S, j0, lo, hi, v + (size_t)d * uattn_dtype_size(t), step, o + d, D, alpha);
  if (d < D) decode_pv(NB, 1, t, S, j0, lo, hi, v + (size_t)d * uattn_dtype_size(t), step, o + d, D, alpha);
}

/* The job (rows x group <= UATTN_DECODE_MAX_VECTORS vectors; keys [0, num_keys), each row seeing its
 * visible count within its window) with key i and value i at k_src / v_src + i * stride elements of
 * dtype. D: the head dim (a multiple of 8), constant where the caller is specialized. */
AVX2_INLINE void avx2_decode_body(const uattn_panel_job *job, uattn_dtype dtype, const void *k_src,
                                  const void *v_src, size_t stride, const int32_t D) {
  const size_t step = stride * uattn_dtype_size(dtype);
  const char *k = k_src, *v = v_src;
  /* the vectors 4 at a time, as even as they go (6 heads: 3 + 3) */
  const int32_t n = job->rows * job->group, blocks = (n + 3) / 4, small = n / blocks, big = n % blocks;
  for (int32_t b = 0, x0 = 0; b < blocks; b++) {
    const int32_t nb = small + (b < big);
    switch (nb) {
    case 1: decode_block(1, job, x0, dtype, k, v, step, D); break;
    case 2: decode_block(2, job, x0, dtype, k, v, step, D); break;
    case 3: decode_block(3, job, x0, dtype, k, v, step, D); break;
    default: decode_block(4, job, x0, dtype, k, v, step, D); break;
    }
    x0 += nb;
  }
}

#endif
