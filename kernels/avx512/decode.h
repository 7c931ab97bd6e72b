/* The avx512 set's decode kernel: the jobs, phases and rules of common/decode8.h (scores of every head, the
 * softmax, P V; rows in the cache's order, every head in turn; the same prefetches), with the score and
 * P V loops in 16-float vectors (common/vec16.h), where AVX-512's width and 32 registers halve the
 * instructions a key and give the FMAs twice the independent chains:
 *   scores  WIDE_KEYS keys at a time against up to 4 query vectors: 16 accumulators of 16 lanes over the
 *           head dim, folded to 8 lanes and summed by hsum8x8;
 *   softmax common/decode8.h's (block_softmax: mask, soft cap, ALiBi, online rescale), per head and block;
 *   P V     register tiles of up to 4 vectors x 64 dims, each value row widened as it is used.
 * bf16 rows with a head dim a multiple of 32 are widened 32 elements at a time into even/odd halves (a
 * shift and a mask), so the query vectors and outputs are kept in that order, [evens | odds] for each 32
 * dims, through the call; every dot product and sum has the same terms as in natural order.
 * Rows in natural order (f16, f32, fp8, bf16 at head dims that are not multiples of 32) take a fused walk
 * instead (wide_fused): avx512bf16/decode.h's bf16_fused with fp32 FMAs, each head's share of 16 rows scored
 * (wide_score4: 4 rows x up to 4 vectors, summed by v16_sum16's lane tree), through the online softmax
 * (wide_softmax_cols) and into P V (wide_pv_step) before the next share, each line asking for its place in
 * its stream's next share into L1 (common/decode_walk.h, common/softmax16.h: the bf16 walks' too), which
 * streams the keys and values side by side where phases read each apart (docs/performance.md).
 * Needs a head dim that is a multiple of 16; other multiples of 8 take common/decode8.h's kernel. Include
 * after common/vec16.h's decision (AVX512_VEC_ZMM or not): the AVX-512 kernel or its twin. */
#ifndef UATTN_AVX512_DECODE_H
#define UATTN_AVX512_DECODE_H

#include "common/decode16.h"
#include "common/decode8.h"
#include "common/decode_walk.h"
#include "common/softmax16.h"
#include "common/vec16.h"

/* <q_i, k_j> for NB <= 4 vectors (q_i at q + i * D) and the WIDE_KEYS rows r[j], as out[4 i + j]. EO: bf16
 * rows widened into even/odd halves, the vectors in that order; else each 16 elements in order. */
V16_INLINE void wide_scores_step(const int NB, const bool EO, uattn_dtype t, const int32_t D, const float *q,
                                 const char *const *r, float *out) {
  const size_t esz = uattn_dtype_size(t);
  v16 a[4][WIDE_KEYS];
  for (int i = 0; i < NB; i++)
    for (int j = 0; j < WIDE_KEYS; j++) a[i][j] = v16_zero();
  int32_t d = 0;
  for (; d + 32 <= D; d += 32) {
    v16 k0[WIDE_KEYS], k1[WIDE_KEYS];
    for (int j = 0; j < WIDE_KEYS; j++) {
      if (EO)
        v16_widen_bf16_eo(r[j] + 2 * (size_t)d, &k0[j], &k1[j]);
      else
        k0[j] = v16_widen(t, r[j] + (size_t)d * esz), k1[j] = v16_widen(t, r[j] + (size_t)(d + 16) * esz);
    }
    for (int i = 0; i < NB; i++) {
      const v16 q0 = v16_load(q + (size_t)i * D + d), q1 = v16_load(q + (size_t)i * D + d + 16);
      for (int j = 0; j < WIDE_KEYS; j++) a[i][j] = v16_fmadd(q1, k1[j], v16_fmadd(q0, k0[j], a[i][j]));
    }
  }
  if (d < D) { /* the last 16 dims (never with EO) */
    v16 k0[WIDE_KEYS];
    for (int j = 0; j < WIDE_KEYS; j++) k0[j] = v16_widen(t, r[j] + (size_t)d * esz);
    for (int i = 0; i < NB; i++) {
      const v16 q0 = v16_load(q + (size_t)i * D + d);
      for (int j = 0; j < WIDE_KEYS; j++) a[i][j] = v16_fmadd(q0, k0[j], a[i][j]);
    }
  }
  __m256 f[4 * WIDE_KEYS];
  for (int x = 0; x < 4 * WIDE_KEYS; x++)
    f[x] = x / WIDE_KEYS < NB ? v16_fold(a[x / WIDE_KEYS][x % WIDE_KEYS]) : _mm256_setzero_ps();
  _mm256_store_ps(out, hsum8x8(f));
  if (NB > 2) _mm256_store_ps(out + 8, hsum8x8(f + 8));
}

/* The scores of every head and block (WIDE_SCORES; q: head g's vectors at q + g * qstep). */
V16_INLINE void wide_scores(const bool EO, const decode_shape *s, uattn_dtype t, const float *q, size_t qstep, float *S,
                            const int32_t D) {
  WIDE_SCORES(s, S, q, qstep, D, wide_scores_step, EO, t, D);
}

/* The three phases in the kernel's order of dims (EO: [evens | odds] each 32). */
V16_INLINE void wide_decode_phases(const bool EO, const uattn_panel_job *job, const decode_shape *s, uattn_dtype t,
                                   float *scratch, const int32_t D) {
  /* scratch: the query vectors in the kernel's order [heads][n][D] (EO), then the scores S [heads][n][W] */
  const int32_t heads = s->heads, n = s->n;
  float *S = scratch + (size_t)heads * n * D;
  const float *q = job->q;
  size_t qstep = s->hq;
  if (EO) {
    for (int32_t g = 0; g < heads; g++)
      for (int32_t x = 0; x < n; x++) {
        float *qx = scratch + ((size_t)g * n + x) * D;
        memcpy(qx, job->q + g * s->hq + (size_t)x * D, sizeof(float) * (size_t)D);
        eo32_order(qx, D, true);
        eo32_order(job->o + g * s->hq + (size_t)x * D, D, true);
      }
    q = scratch, qstep = (size_t)n * D;
  }
  wide_scores(EO, s, t, q, qstep, S, D);
  decode_softmax(job, s, S, D); /* s->order is DECODE_NATURAL: it only rescales the outputs, whatever their order */
  wide_pv(EO, job, s, t, S, D);
  if (EO)
    for (int32_t g = 0; g < heads; g++)
      for (int32_t x = 0; x < n; x++) eo32_order(job->o + g * s->hq + (size_t)x * D, D, false);
}

/* <q_i, k_j> for NB <= 4 vectors (q_i at q + i * D, in order) and the 4 rows r[j] of dtype t: vector i's 4
 * scores at S + i * ld, or (keys < 4: a ragged end) its first `keys`. 16 accumulators summed by v16_sum16;
 * each line of row j asks for its place pf[j] bytes on (pf NULL: none) into L1. */
V16_INLINE void wide_score4(const int NB, uattn_dtype t, const int32_t D, const float *q, const char *const *r,
                            const intptr_t *pf, float *S, size_t ld, int32_t keys) {
  const size_t esz = uattn_dtype_size(t);
  const int(*slot)[4] = sum16_slot;
  v16 a[16];
  for (int x = 0; x < 16; x++) a[x] = v16_zero();
  for (int32_t d = 0; d < D; d += 16) {
    v16 k[4];
    for (int j = 0; j < 4; j++) k[j] = v16_widen(t, r[j] + (size_t)d * esz);
    if (pf && ((size_t)d * esz) % 64 == 0)
      for (int j = 0; j < keys; j++)
        _mm_prefetch((const char *)((uintptr_t)r[j] + (uintptr_t)pf[j]) + d * esz, _MM_HINT_T0);
    for (int i = 0; i < NB; i++) {
      const v16 qv = v16_load(q + (size_t)i * D + d);
      for (int j = 0; j < 4; j++) a[slot[i][j]] = v16_fmadd(qv, k[j], a[slot[i][j]]);
    }
  }
  sum16_store(NB, v16_sum16(a), S, ld, keys);
}

/* Decode on NHD and HND rows of any dtype in natural order (f16, f32, fp8; bf16 where the head dim is not a
 * multiple of 32), fused as avx512bf16/decode.h's bf16_fused (decode_walk): each head's share of 16 rows
 * scored (wide_score4, every block of vectors), through the online softmax (wide_softmax_cols) and into P V
 * (wide_pv_step, 64 dims at a time) before the next share, so the keys and the values are two streams read
 * side by side; each line asks for its place in its stream's next share into L1. */
V16_INLINE void wide_fused(const uattn_panel_job *job, const decode_shape *s, uattn_dtype t, float *S,
                           const int32_t D) {
  const size_t esz = uattn_dtype_size(t);
  decode_walk w;
  decode_walk_begin(&w, job, s, DECODE_SHARE_KEYS);
  while (decode_walk_next(&w, job, s, S, DECODE_SHARE_KEYS)) {
    const float *qg = job->q + (size_t)w.g * s->hq;
    for (int32_t j = w.lo; j < w.hi; j += 4) {
      const char *r[4];
      intptr_t pf[4];
      const int32_t keys = decode_walk_rows(&w, s, j, r, pf);
      for (int32_t b = 0; b < s->blocks; b++)
        DECODE_BY_NB(s->nb[b], wide_score4, t, D, qg + (size_t)s->x0[b] * D, r, b == 0 ? pf : NULL,
                     w.Sg + (size_t)s->x0[b] * s->W + (j - s->j0), (size_t)s->W, keys);
    }
    int32_t plo[4], phi[4];
    for (int32_t b = 0; b < s->blocks; b++)
      wide_softmax_cols(job, s, w.g, b, w.rule[b], w.Sg + (size_t)s->x0[b] * s->W, w.c0, w.c1, &plo[b], &phi[b],
                        DECODE_SHARE_KEYS, D);
    for (int32_t b = 0; b < s->blocks; b++) {
      const float *P = w.Sg + (size_t)s->x0[b] * s->W + (w.c0 - s->j0);
      float *o = job->o + (size_t)w.g * s->hq + (size_t)s->x0[b] * D;
      int32_t c0, lo, hi; /* in the piece's rows */
      for (int32_t x = 0; x < w.pieces; x++) {
        if (!decode_walk_piece(&w, x, plo[b], phi[b], &c0, &lo, &hi)) continue;
        const char *vg = w.vz[x];
        const intptr_t pf = b == 0 ? w.pv[x] : 0;
        int32_t d = 0;
        for (; d + 64 <= D; d += 64)
          DECODE_BY_NB(s->nb[b], wide_pv_step, 4, false, t, P, s->W, c0, lo, hi, vg + esz * d, s->step, o + d, D, pf);
        switch ((D - d) / 16) {
        case 1:
          DECODE_BY_NB(s->nb[b], wide_pv_step, 1, false, t, P, s->W, c0, lo, hi, vg + esz * d, s->step, o + d, D, pf);
          break;
        case 2:
          DECODE_BY_NB(s->nb[b], wide_pv_step, 2, false, t, P, s->W, c0, lo, hi, vg + esz * d, s->step, o + d, D, pf);
          break;
        case 3:
          DECODE_BY_NB(s->nb[b], wide_pv_step, 3, false, t, P, s->W, c0, lo, hi, vg + esz * d, s->step, o + d, D, pf);
          break;
        default: break;
        }
      }
    }
  }
}

/* decode in kernels.h (the arguments of avx2_decode_body). Either walk takes a call's list of blocks as it is
 * (the fused walk's shares in pieces where the blocks are smaller: decode_walk). */
V16_INLINE void avx512_decode_body(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype t,
                                   const uattn_decode_src *src, float *scratch, const int32_t D) {
  if (D % 16) { /* 16-float vectors need whole 16s of the head dim */
    avx2_decode_body(job, heads, head_vectors, t, src, scratch, D);
    return;
  }
  if (t == UATTN_BF16 && D % 32 == 0) {
    decode_shape s;
    if (!decode_shape_of(job, heads, head_vectors, t, src, D, &s)) return; /* no vector sees a key */
    s.order = DECODE_NATURAL; /* decode8.h's 16-dim even/odd order: this kernel keeps its own */
    wide_decode_phases(true, job, &s, t, scratch, D);
    return;
  }
  decode_shape s;
  if (!decode_shape_of(job, heads, head_vectors, t, src, D, &s)) return; /* no vector sees a key */
  s.order = DECODE_NATURAL;
  wide_fused(job, &s, t, scratch + (size_t)heads * s.n * D, D);
}

#endif
