/* The decode kernel in 8-float vectors, in phases: the avx2 set's, and the wider sets' where their 16-lane
 * paths do not fit (head dims not a multiple of 16; the avx512 phases' softmax, the avx512bf16 phases' P V).
 * A few query rows (up to UATTN_DECODE_MAX_VECTORS query vectors a KV head: a
 * decode, a short verification) of one or several KV heads against keys read straight from the cache,
 * widened in registers, with no key or value panel. Few vectors read each cache block once or a few
 * times, so the panels of avx2_load (a transposed key panel and a value panel, written and then read back)
 * cost more than they save there; here the keys and values go from the cache to the FMAs.
 *
 * Several heads (an NHD cache, whose row holds every head) are taken in the order of the cache's bytes: a
 * few rows at a time, every head in turn. A head at a time would read 256 bytes of every 2 KB row, a
 * pattern the hardware prefetchers follow worse than a sequential read, which row order is.
 *
 *   scores  two keys at a time, half the call's keys apart, every head in turn, against up to 4 query
 *           vectors: 8 accumulators of 8 lanes over the head dim (a chain of D / 8 FMAs each, like the panel
 *           kernel's DB-dim partial sums), then one sum tree (hsum8x8) turns them into the 8 scores;
 *   softmax the panel kernel's softmax_row (mask, soft cap, ALiBi, online rescale), per head and block;
 *   P V     PV_TILE keys at a time, every head in turn: register tiles of up to 4 vectors x 16 dims, each
 *           value vector widened from the cache row as it is used.
 * bf16 rows are widened 16 elements at a time: in a 32-byte load, a shift gives the even elements as f32
 * and a mask the odd ones (one instruction per 8 floats, where widen8 takes two). The query vectors are put
 * in that even/odd order once a call, and the outputs are turned into it (and rescaled) before P V and
 * back after, so every dot product and sum has the same terms as in natural order.
 * fp8 rows are widened 32 codes at a time, a quarter of them per vector (fp8_quarter: two shifts and a mask
 * per 8 codes, where widen8_fp8 takes a dozen instructions), in the same way: the query vectors and outputs
 * in "quarter" order, and the codes' rebias (2^120 for E4M3, 2^112 for E5M2) folded into the query vectors,
 * P, the scores and the outputs rather than multiplied into every code.
 * Needs a head dim that is a multiple of 8 (every generated bucket's); the forward uses load + attend
 * otherwise. */
#ifndef UATTN_COMMON_DECODE8_H
#define UATTN_COMMON_DECODE8_H

#include "common/attend_plan.h"
#include "common/decode_shape.h"
#include "common/widen.h"

/* ---- bf16, even/odd --------------------------------------------------------------------------------- */

/* 16 bf16 elements as f32: e = elements 0, 2, .., 14, o = 1, 3, .., 15. */
AVX2_INLINE void widen16_eo(const void *src, __m256 *e, __m256 *o) {
  const __m256i x = in_register_si(_mm256_loadu_si256(src));
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

/* ---- fp8, quarters ---------------------------------------------------------------------------------- */

/* 32 floats in natural order to quarter order (quarter c: elements c, 4 + c, .., 28 + c), and back. */
AVX2_INLINE void to_q4(const float *a, __m256 x[4]) {
  __m128 r[8];
  for (int i = 0; i < 8; i++) r[i] = _mm_loadu_ps(a + 4 * i);
  _MM_TRANSPOSE4_PS(r[0], r[1], r[2], r[3]);
  _MM_TRANSPOSE4_PS(r[4], r[5], r[6], r[7]);
  for (int c = 0; c < 4; c++) x[c] = _mm256_set_m128(r[4 + c], r[c]);
}
AVX2_INLINE void from_q4(const __m256 x[4], float *a) {
  __m128 r[8];
  for (int c = 0; c < 4; c++) r[c] = _mm256_castps256_ps128(x[c]), r[4 + c] = _mm256_extractf128_ps(x[c], 1);
  _MM_TRANSPOSE4_PS(r[0], r[1], r[2], r[3]);
  _MM_TRANSPOSE4_PS(r[4], r[5], r[6], r[7]);
  for (int i = 0; i < 8; i++) _mm_storeu_ps(a + 4 * i, r[i]);
}

/* ---- scores and P V ----------------------------------------------------------------------------------- */

/* Quarters c of two keys' 32 codes into the 8 accumulators of NB vectors (q: quarter c of theirs). */
AVX2_INLINE void fma_quarter(const int NB, const float *q, const int32_t D, __m256 k0, __m256 k1, __m256 a[8]) {
  for (int i = 0; i < NB; i++) {
    const __m256 qv = in_register(_mm256_loadu_ps(q + (size_t)i * D));
    a[2 * i] = _mm256_fmadd_ps(qv, k0, a[2 * i]);
    a[2 * i + 1] = _mm256_fmadd_ps(qv, k1, a[2 * i + 1]);
  }
}

/* <q_i, k_0> and <q_i, k_1> for NB <= 4 vectors (q_i at q + i * D) as lanes 2 i and 2 i + 1. The query
 * vectors and key rows are loaded through in_register: else GCC folds a load that several instructions use into
 * each of them as a memory operand (a query vector meant for both keys of a pair read twice, a key row twice: a
 * load, then an and from memory), 20 32-byte loads for 16 FMAs, more than two loads a cycle feed; in
 * registers 10. ORDER: the
 * vectors' (decode_order): DECODE_EO, bf16 keys widened 16 at a time into even/odd halves (D a multiple of
 * 16); DECODE_Q4, fp8 keys 32 at a time into quarters (D a multiple of 32; the vectors and so the scores
 * times 2^fp8_fold, undone here); else widen8. */
AVX2_INLINE __m256 scores_pair(const int NB, const int ORDER, uattn_dtype t, const float *q, const int32_t D,
                               const char *r0, const char *r1) {
  const size_t esz = uattn_dtype_size(t);
  __m256 a[8];
  for (int x = 0; x < 8; x++) a[x] = _mm256_setzero_ps();
  if (ORDER == DECODE_Q4) {
    __m256i sp = _mm256_setzero_si256(); /* the rows' special codes, looked for first: one test, not D / 32 */
    for (int32_t d = 0; d < D; d += 32)
      sp = _mm256_or_si256(sp, _mm256_or_si256(fp8_special(t, _mm256_loadu_si256((const void *)(r0 + d))),
                                               fp8_special(t, _mm256_loadu_si256((const void *)(r1 + d)))));
    if (__builtin_expect(_mm256_testz_si256(sp, sp), 1)) {
      for (int32_t d = 0; d < D; d += 32) {
        const __m256i x0 = _mm256_loadu_si256((const void *)(r0 + d)), x1 = _mm256_loadu_si256((const void *)(r1 + d));
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) fma_quarter(NB, q + d + 8 * c, D, fp8_quarter(t, x0, c), fp8_quarter(t, x1, c), a);
      }
    } else {
      for (int32_t d = 0; d < D; d += 32) {
        const __m256i x0 = _mm256_loadu_si256((const void *)(r0 + d)), x1 = _mm256_loadu_si256((const void *)(r1 + d));
        for (int c = 0; c < 4; c++)
          fma_quarter(NB, q + d + 8 * c, D, fp8_patch(t, fp8_quarter(t, x0, c), x0, c),
                      fp8_patch(t, fp8_quarter(t, x1, c), x1, c), a);
      }
    }
    return _mm256_mul_ps(hsum8x8(a), _mm256_set1_ps(ldexpf(1.0f, fp8_fold(t))));
  }
  if (ORDER == DECODE_EO) {
    for (int32_t d = 0; d < D; d += 16) {
      __m256 k0e, k0o, k1e, k1o;
      widen16_eo(r0 + 2 * (size_t)d, &k0e, &k0o);
      widen16_eo(r1 + 2 * (size_t)d, &k1e, &k1o);
      for (int i = 0; i < NB; i++) {
        const __m256 qe = in_register(_mm256_loadu_ps(q + (size_t)i * D + d));
        const __m256 qo = in_register(_mm256_loadu_ps(q + (size_t)i * D + d + 8));
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
  return hsum8x8(a);
}

/* scores_pair's lanes into S: vector i's first score at S0 + i * W, and (both; false at an odd count's last
 * step) its second at S1 + i * W. */
AVX2_INLINE void store_score_pair(const int NB, __m256 x, float *S0, float *S1, int32_t W, bool both) {
  _Alignas(32) float p[8];
  _mm256_store_ps(p, x);
  for (int i = 0; i < NB; i++) {
    S0[(size_t)i * W] = p[2 * i];
    if (both) S1[(size_t)i * W] = p[2 * i + 1];
  }
}

/* scores_pair of NB vectors into S (store_score_pair). */
AVX2_INLINE void score_pair_step(const int NB, const int ORDER, uattn_dtype t, const float *q, const int32_t D,
                                 const char *r0, const char *r1, float *S0, float *S1, int32_t W, bool both) {
  store_score_pair(NB, scores_pair(NB, ORDER, t, q, D, r0, r1), S0, S1, W, both);
}

/* 16 dims (from d) of o_i += sum_{j in [lo, hi)} P[i][j] v_j for NB vectors (P[i][j] at S + i * ld + j - j0,
 * o_i at o + i * D in even/odd order), value j's bf16 row at v + j * step bytes. */
AVX2_INLINE void pv_eo(const int NB, const float *S, int32_t ld, int32_t j0, int32_t lo, int32_t hi, const char *v,
                       size_t step, float *o, const int32_t D) {
  __m256 a[4][2];
  for (int i = 0; i < NB; i++) a[i][0] = _mm256_loadu_ps(o + (size_t)i * D), a[i][1] = _mm256_loadu_ps(o + i * D + 8);
#pragma GCC unroll 8 /* a whole tile's keys in one straight run, which P V runs faster than the loop */
  for (int32_t j = lo; j < hi; j++) {
    __m256 ve, vo;
    widen16_eo(v + (size_t)j * step, &ve, &vo);
    for (int i = 0; i < NB; i++) {
      const __m256 p = _mm256_broadcast_ss(S + (size_t)i * ld + (j - j0));
      a[i][0] = _mm256_fmadd_ps(p, ve, a[i][0]);
      a[i][1] = _mm256_fmadd_ps(p, vo, a[i][1]);
    }
  }
  for (int i = 0; i < NB; i++) _mm256_storeu_ps(o + (size_t)i * D, a[i][0]), _mm256_storeu_ps(o + i * D + 8, a[i][1]);
}

/* One pass of pv_q4: quarters 2 h and 2 h + 1 (PATCH: through fp8_patch). */
AVX2_INLINE void pv_q4_pass(const int NB, uattn_dtype t, const bool PATCH, const int h, const float *S, int32_t ld,
                            int32_t j0, int32_t lo, int32_t hi, const char *v, size_t step, float *o, const int32_t D) {
  __m256 a[4][2];
  for (int i = 0; i < NB; i++)
    a[i][0] = _mm256_loadu_ps(o + (size_t)i * D + 16 * h), a[i][1] = _mm256_loadu_ps(o + i * D + 16 * h + 8);
#pragma GCC unroll 8
  for (int32_t j = lo; j < hi; j++) {
    const __m256i x = _mm256_loadu_si256((const void *)(v + (size_t)j * step));
    __m256 f0 = fp8_quarter(t, x, 2 * h), f1 = fp8_quarter(t, x, 2 * h + 1);
    if (PATCH) f0 = fp8_patch(t, f0, x, 2 * h), f1 = fp8_patch(t, f1, x, 2 * h + 1);
    for (int i = 0; i < NB; i++) {
      const __m256 p = _mm256_broadcast_ss(S + (size_t)i * ld + (j - j0));
      a[i][0] = _mm256_fmadd_ps(p, f0, a[i][0]);
      a[i][1] = _mm256_fmadd_ps(p, f1, a[i][1]);
    }
  }
  for (int i = 0; i < NB; i++)
    _mm256_storeu_ps(o + (size_t)i * D + 16 * h, a[i][0]), _mm256_storeu_ps(o + i * D + 16 * h + 8, a[i][1]);
}

/* pv_eo's sum for fp8 values: 32 dims (from d) of NB vectors' outputs in quarter order, times 2^-fold (P
 * times 2^fold), value j's codes at v + j * step bytes. Two quarters a pass over the keys: all four would
 * take 16 accumulators, every register. The keys' special codes are looked for first, once. */
AVX2_INLINE void pv_q4(const int NB, uattn_dtype t, const float *S, int32_t ld, int32_t j0, int32_t lo, int32_t hi,
                       const char *v, size_t step, float *o, const int32_t D) {
  __m256i sp = _mm256_setzero_si256();
  for (int32_t j = lo; j < hi; j++)
    sp = _mm256_or_si256(sp, fp8_special(t, _mm256_loadu_si256((const void *)(v + (size_t)j * step))));
  if (__builtin_expect(_mm256_testz_si256(sp, sp), 1)) {
    pv_q4_pass(NB, t, false, 0, S, ld, j0, lo, hi, v, step, o, D);
    pv_q4_pass(NB, t, false, 1, S, ld, j0, lo, hi, v, step, o, D);
  } else {
    pv_q4_pass(NB, t, true, 0, S, ld, j0, lo, hi, v, step, o, D);
    pv_q4_pass(NB, t, true, 1, S, ld, j0, lo, hi, v, step, o, D);
  }
}

/* pv_eo in natural order, any dtype: 16 dims (W = 2) or 8 (W = 1), split over CHAINS(NB) chains of keys
 * for small NB, as in pv_part. */
AVX2_INLINE void pv_natural(const int NB, const int W, uattn_dtype t, const float *S, int32_t ld, int32_t j0,
                            int32_t lo, int32_t hi, const char *v, size_t step, float *o, const int32_t D) {
  const int C = CHAINS(NB);
  __m256 a[4][QB][2];
  for (int i = 0; i < NB; i++)
    for (int w = 0; w < W; w++) {
      a[0][i][w] = _mm256_loadu_ps(o + (size_t)i * D + 8 * w);
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
        const __m256 p = _mm256_broadcast_ss(S + (size_t)i * ld + (j + c - j0));
        for (int w = 0; w < W; w++) a[c][i][w] = _mm256_fmadd_ps(p, vv[w], a[c][i][w]);
      }
    }
  for (; j < hi; j++) {
    const char *r = v + (size_t)j * step;
    for (int i = 0; i < NB; i++) {
      const __m256 p = _mm256_broadcast_ss(S + (size_t)i * ld + (j - j0));
      for (int w = 0; w < W; w++) a[0][i][w] = _mm256_fmadd_ps(p, widen8(t, r + w * wstep), a[0][i][w]);
    }
  }
  sum_chains(C, NB, W, a);
  for (int i = 0; i < NB; i++)
    for (int w = 0; w < W; w++) _mm256_storeu_ps(o + (size_t)i * D + 8 * w, a[0][i][w]);
}

/* ---- the kernel ---------------------------------------------------------------------------------------- */

/* Whether every query vector of the call times 2^H stays finite with room to spare (|q| < 2^(126 - H)), so
 * that DECODE_Q4's folding is exact; else the call widens in natural order. */
AVX2_INLINE bool q_fits_fold(const uattn_panel_job *job, int32_t heads, size_t head_vectors, int H, const int32_t D) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps();
  const size_t n = (size_t)job->rows * (size_t)job->group * (size_t)D;
  for (int32_t g = 0; g < heads; g++) /* max_ps(a, b) is b where a is NaN: a NaN query, NaN folded or not */
    for (size_t x = 0; x < n; x += 8)
      m = _mm256_max_ps(_mm256_and_ps(absmask, _mm256_loadu_ps(job->q + g * head_vectors * (size_t)D + x)), m);
  return _mm256_movemask_ps(_mm256_cmp_ps(m, _mm256_set1_ps(ldexpf(1.0f, 126 - H)), _CMP_GE_OQ)) == 0;
}

/* Rows [w0, w1) of the scores' walk into r: step i reads keys LO + i and LO + half + i (rows 2 i and 2 i + 1;
 * at an odd count's last step the second is past HI: none), then come ahead_rows's values and next keys.
 * Returns how many. */
AVX2_INLINE int32_t score_walk_rows(const decode_shape *s, int32_t half, int32_t w0, int32_t w1, const char **r) {
  int32_t n = 0;
  for (int32_t w = w0; w < w1; w++) {
    const int32_t i = w >> 1, j = s->LO + i + (w & 1) * half, past = s->HI + w - 2 * half;
    if (i >= half)
      n += ahead_rows(s, past, past + 1, r + n);
    else if (j < s->HI)
      r[n++] = decode_row(s, s->kb, j);
  }
  return n;
}

/* The scores of every head and block, two rows at a time, every head in turn: S[g][x][j - j0] for keys
 * [LO, HI) (q: head g's vectors at q + g * qstep, in even/odd order when EO). The two rows are half the keys
 * apart, so that each half is read in the order of its bytes: two ascending streams, which the hardware
 * prefetchers follow. Adjacent rows, every head in turn, go back and forth between two rows, which they do
 * not follow: the reads then rest on the requests below alone, about half the read bandwidth on Zen 3. The
 * rows ahead are asked for a head's share at a time. */
AVX2_INLINE void decode_scores(const int ORDER, const decode_shape *s, uattn_dtype t, const float *q, size_t qstep,
                               float *S, const int32_t D) {
  const int32_t heads = s->heads, n = s->n, half = (s->HI - s->LO + 1) / 2;
  const int32_t ahead = decode_rows_ahead(s, DECODE_AHEAD); /* at most 64 */
  const char *a[64];
  begin_scores(s, S, 0);
  const int32_t na0 = score_walk_rows(s, half, 0, ahead, a); /* the first rows, which no step asks for */
  for (int32_t g = 0; g < heads; g++) prefetch_rows(s, a, na0, g);
  for (int32_t i = 0; i < half; i++) {
    const int32_t j0 = s->LO + i, j1 = j0 + half;
    const char *r0 = decode_row(s, s->kb, j0), *r1 = j1 < s->HI ? decode_row(s, s->kb, j1) : r0;
    const int32_t na = score_walk_rows(s, half, 2 * i + ahead, 2 * i + ahead + 2, a);
    for (int32_t g = 0; g < heads; g++) {
      prefetch_rows(s, a, na, g);
      const char *g0 = r0 + (size_t)g * s->head_step, *g1 = r1 + (size_t)g * s->head_step;
      for (int32_t b = 0; b < s->blocks; b++) {
        const float *qb = q + (size_t)g * qstep + (size_t)s->x0[b] * D;
        float *Sb = S + ((size_t)g * n + s->x0[b]) * s->W;
        DECODE_BY_NB(s->nb[b], score_pair_step, ORDER, t, qb, D, g0, g1, Sb + (j0 - s->j0), Sb + (j1 - s->j0), s->W,
                     j1 < s->HI);
      }
    }
  }
}

/* The softmax of every head and block (S to P, m and l updated), each output rescaled by its alpha and put
 * in the call's order; for DECODE_Q4 and DECODE_EO8, P times 2^fold and the outputs times 2^-fold. */
AVX2_INLINE void decode_softmax(const uattn_panel_job *job, const decode_shape *s, float *S, const int32_t D) {
  const bool folded = s->order == DECODE_Q4 || s->order == DECODE_EO8;
  for (int32_t g = 0; g < s->heads; g++) {
    const uattn_panel_job h = uattn_decode_head_job(job, g, s->hv);
    for (int32_t b = 0; b < s->blocks; b++) {
      vec_rule rule[4];
      int32_t lo, hi;
      float alpha[4];
      block_rules(&h, s->x0[b], s->nb[b], 0, h.num_keys, rule, &lo, &hi);
      float *Sb = S + ((size_t)g * s->n + s->x0[b]) * s->W;
      block_softmax(&h, s->x0[b], s->nb[b], rule, Sb, s->W, s->j0, s->j0 + s->W, alpha);
      if (folded) {
        const __m256 up = _mm256_set1_ps(ldexpf(1.0f, s->fold));
        for (size_t x = 0; x < (size_t)s->nb[b] * s->W; x += 8)
          _mm256_storeu_ps(Sb + x, _mm256_mul_ps(up, _mm256_loadu_ps(Sb + x)));
      }
      for (int i = 0; i < s->nb[b]; i++) {
        float *o = h.o + (size_t)(s->x0[b] + i) * D;
        const __m256 a = _mm256_set1_ps(alpha[i]), down = _mm256_mul_ps(a, _mm256_set1_ps(ldexpf(1.0f, -s->fold)));
        if (s->order == DECODE_Q4) {
          for (int32_t d = 0; d < D; d += 32) {
            __m256 x[4];
            to_q4(o + d, x);
            for (int c = 0; c < 4; c++) _mm256_storeu_ps(o + d + 8 * c, _mm256_mul_ps(down, x[c]));
          }
        } else if (s->order == DECODE_EO || s->order == DECODE_EO8) {
          const __m256 f = s->order == DECODE_EO8 ? down : a;
          for (int32_t d = 0; d < D; d += 16) {
            __m256 e, od;
            to_eo(o + d, &e, &od);
            _mm256_storeu_ps(o + d, _mm256_mul_ps(f, e)), _mm256_storeu_ps(o + d + 8, _mm256_mul_ps(f, od));
          }
        } else if (alpha[i] != 1.0f)
          for (int32_t d = 0; d < D; d += 8) _mm256_storeu_ps(o + d, _mm256_mul_ps(a, _mm256_loadu_ps(o + d)));
      }
    }
  }
}

/* The outputs of every head back in natural order from the call's (decode_softmax's), and for DECODE_Q4 and
 * DECODE_EO8 times 2^fold: what a decode kernel ends with. */
AVX2_INLINE void decode_outputs_natural(const uattn_panel_job *job, const decode_shape *s, const int32_t D) {
  const __m256 up = _mm256_set1_ps(ldexpf(1.0f, s->fold));
  for (int32_t g = 0; g < s->heads && s->order != DECODE_NATURAL; g++)
    for (int32_t x = 0; x < s->n; x++) {
      float *o = job->o + g * s->hq + (size_t)x * D;
      if (s->order == DECODE_Q4)
        for (int32_t d = 0; d < D; d += 32) {
          __m256 y[4];
          for (int c = 0; c < 4; c++) y[c] = _mm256_mul_ps(up, _mm256_loadu_ps(o + d + 8 * c));
          from_q4(y, o + d);
        }
      else
        for (int32_t d = 0; d < D; d += 16) {
          __m256 e = _mm256_loadu_ps(o + d), od = _mm256_loadu_ps(o + d + 8);
          if (s->order == DECODE_EO8) e = _mm256_mul_ps(up, e), od = _mm256_mul_ps(up, od);
          from_eo(e, od, o + d);
        }
    }
}

/* One block's P V step p: keys [p->lo, p->hi) of NB vectors of one head into its outputs (P at p->S). */
AVX2_INLINE void pv_block(const int NB, const decode_shape *s, uattn_dtype t, const int32_t D, const pv_step *p) {
  const size_t esz = uattn_dtype_size(t);
  int32_t d = 0;
  if (s->order == DECODE_Q4) {
    for (; d < D; d += 32) pv_q4(NB, t, p->S, s->W, p->j0, p->lo, p->hi, p->v + d, s->step, p->o + d, D);
    return;
  }
  if (s->order == DECODE_EO) {
    for (; d < D; d += 16) pv_eo(NB, p->S, s->W, p->j0, p->lo, p->hi, p->v + (size_t)d * esz, s->step, p->o + d, D);
    return;
  }
  for (; d + 16 <= D; d += 16)
    pv_natural(NB, 2, t, p->S, s->W, p->j0, p->lo, p->hi, p->v + (size_t)d * esz, s->step, p->o + d, D);
  if (d < D) pv_natural(NB, 1, t, p->S, s->W, p->j0, p->lo, p->hi, p->v + (size_t)d * esz, s->step, p->o + d, D);
}

/* P V of every head and block (DECODE_PV_TILES); the outputs back in natural order at the end (and, for
 * DECODE_Q4, times 2^fold). */
AVX2_INLINE void decode_pv(const uattn_panel_job *job, const decode_shape *s, uattn_dtype t, const float *S,
                           const int32_t D) {
  DECODE_PV_TILES(job, s, S, D, pv_block, s, t, D);
  decode_outputs_natural(job, s, D);
}

/* decode in kernels.h: `heads` KV heads of the job, their keys and values where src says, elements of dtype,
 * head g's vectors and states head_vectors after head g - 1's; scratch: uattn_decode_scratch_floats, 32-byte
 * aligned. D: the head dim (a multiple of 8), constant where the caller is specialized. A list of blocks is
 * walked as one stretch of keys (decode_row): the same arithmetic, bit for bit, as on
 * the same keys in one block. */
AVX2_INLINE void avx2_decode_body(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype t,
                                  const uattn_decode_src *src, float *scratch, const int32_t D) {
  decode_shape s;
  if (!decode_shape_of(job, heads, head_vectors, t, src, D, &s)) return; /* no vector sees a key */
  /* scratch: the query vectors in the call's order [heads][n][D], then the scores S [heads][n][W] */
  if (uattn_dtype_is_fp8(t) && D % 32 == 0 && D <= DECODE_EO_MAX_DIM &&
      q_fits_fold(job, heads, head_vectors, s.fold, D))
    s.order = DECODE_Q4;
  const int32_t n = s.n;
  float *qeo = scratch, *S = scratch + (size_t)heads * n * D;
  if (s.order == DECODE_Q4) {
    const __m256 up = _mm256_set1_ps(ldexpf(1.0f, s.fold));
    for (int32_t g = 0; g < heads; g++)
      for (int32_t x = 0; x < n; x++)
        for (int32_t d = 0; d < D; d += 32) {
          __m256 y[4];
          to_q4(job->q + g * s.hq + (size_t)x * D + d, y);
          float *dst = qeo + ((size_t)g * n + x) * D + d;
          for (int c = 0; c < 4; c++) _mm256_store_ps(dst + 8 * c, _mm256_mul_ps(up, y[c]));
        }
    decode_scores(DECODE_Q4, &s, t, qeo, (size_t)n * D, S, D);
  } else if (s.order == DECODE_EO) {
    for (int32_t g = 0; g < heads; g++)
      for (int32_t x = 0; x < n; x++)
        for (int32_t d = 0; d < D; d += 16) {
          __m256 e, o;
          to_eo(job->q + g * s.hq + (size_t)x * D + d, &e, &o);
          float *dst = qeo + ((size_t)g * n + x) * D + d;
          _mm256_store_ps(dst, e), _mm256_store_ps(dst + 8, o);
        }
    decode_scores(DECODE_EO, &s, t, qeo, (size_t)n * D, S, D);
  } else {
    decode_scores(DECODE_NATURAL, &s, t, job->q, s.hq, S, D);
  }
  decode_softmax(job, &s, S, D);
  decode_pv(job, &s, t, S, D);
}

#endif
