/* The avx512bf16 set's decode kernel: common/decode_shape.h's jobs and rules (decode_shape, the rows of every head in
 * the cache's order, decode_softmax's rules), with both products by vdpbf16ps where the cache is bf16 and the
 * head dim a multiple of 32 (the bf16 path below) or fp8 and a multiple of 64 (the same path, each row widened
 * exactly to bf16 by lookups, v16i_fp8_widen); other dtypes and dims, and probs_fp32, take the scores by
 * vdpbf16ps on rows rounded to bf16 (bf16_scores, in common/decode8.h's phases) and common/decode16.h's fp32 P V.
 *
 * A GQA-4 decode does about 4 flops per cache byte, which at a core's read bandwidth can pass its fp32 FMA peak,
 * so both products are bf16 dot products, and what is around them (folding sums, moving scores, reordering
 * outputs) must cost less than the products themselves.
 *
 * The bf16 path (bf16_fused): a walk of shares, a share being one head's 16 rows (keys [16 c, 16 c + 16)),
 * every head's share of 16 rows in turn; each share is scored, goes through the online softmax and is added
 * into P V before the next, so a call's keys and values are two streams read side by side, and each line of
 * a share asks for its place in its stream's next share into L1 (decode_tiled.h's walk, on rows):
 *   scores  4 keys x up to 4 query vectors a step (16 accumulators of 16 lanes, 4 vdpbf16ps per pair of
 *           key and vector at head dim 128), summed by a tree of lane moves and adds into one vector holding
 *           the 16 scores, vector i's 4 keys in quarter i, stored straight to its S row: 45 moves and adds for
 *           16 scores (12 of the moves blends), about half of what folding to 8 lanes and an hadd tree takes.
 *   softmax bf16_softmax_cols on the share's 16 columns: decode_softmax's rules and online rescale 16 lanes
 *           at a time (the same exp to the bit as exp8; common/softmax16.h's wide_softmax_cols, which the avx512
 *           set's walk shares), P then rounded to the bf16 pairs P V reads (bf16_pairs_in_place); a share
 *           every vector sees whole, without cap or slopes, takes a path without the rules' branches.
 *   P V     two value rows interleaved element by element (unpacklo/hi within each 128-bit lane) are 32 dims as
 *           two vectors of pairs, so each 32 dims of an output are kept in that lane order (unpack32_to) for
 *           the whole call, put in and back once a call; 64-dim register tiles (4 vectors x 64 dims, 16
 *           accumulators) loaded and stored once a share.
 * fp8 rows take the same walk: each 64 dims of a key row widened into two vectors of pairs in the order the
 * query pairs are put in (unpack32_to's, on pairs), two value rows' codes interleaved and widened
 * (bf16_pv_pair), the outputs in fp8_pv_order for the call; a share is 32 rows (FP8_SHARE_KEYS, bf16_fused).
 * Why fused: the keys' and the values' lines stream side by side, which the hardware prefetchers follow (software
 * prefetches alone capped the earlier kernel in phases), and an HND call's two streams ascend. A layout with
 * keys transposed within a block (TILED, decode_tiled.h) also spares the scores' lane tree. The measurements
 * behind both choices: docs/performance.md and `uattn-kernel-bench --decode-layouts`. */
#ifndef UATTN_AVX512BF16_DECODE_H
#define UATTN_AVX512BF16_DECODE_H

#include "avx512bf16/vec.h"
#include "common/decode16.h"
#include "common/decode8.h"
#include "common/decode_walk.h"
#include "common/softmax16.h"

enum {
  BF16_AHEAD = 16,     /* bf16_scores: rows ahead of the four being scored asked for, with 4 or more heads a call */
  FP8_SHARE_KEYS = 32, /* keys a share of bf16_fused's walk on fp8 rows (DECODE_SHARE_KEYS on bf16 rows) */
};

/* Pairs [p, p + 16) of a key row (dims 2p on; pairs past the row's npairs zero), from any dtype. */
BF16_INLINE v16i bf16_row_pairs(uattn_dtype t, const char *row, int32_t p, int32_t npairs) {
  if (t == UATTN_BF16 && p + 16 <= npairs) return v16i_load(row + 4 * (size_t)p);
  _Alignas(64) uint32_t x[16] = {0};
  for (int32_t k = 0; k < 16 && p + k < npairs; k++)
    x[k] = t == UATTN_BF16 ? (uint32_t)((const uint16_t *)row)[2 * (p + k)] |
                                 (uint32_t)((const uint16_t *)row)[2 * (p + k) + 1] << 16
                           : pair_bf16(widen1(t, row, 2 * (size_t)(p + k)), widen1(t, row, 2 * (size_t)(p + k) + 1));
  return v16i_load(x);
}

/* ---- the generic path: scores of any dtype, common/decode16.h's P V ------------------------------------- */

/* scale <q_i, k_j> for NB <= 4 vectors (pairs at q + i * Dh, Dh = D / 2) and the WIDE_KEYS rows r[j], as
 * out[4 i + j]: 16-lane sums folded by hsum8x8's tree. */
BF16_INLINE void bf16_wide_scores_step(const int NB, uattn_dtype t, const int32_t Dh, float scale, const uint32_t *q,
                                       const char *const *r, float *out) {
  v16 a[4][WIDE_KEYS];
  for (int i = 0; i < NB; i++)
    for (int j = 0; j < WIDE_KEYS; j++) a[i][j] = v16_zero();
  for (int32_t p = 0; p < Dh; p += 16) {
    v16i k[WIDE_KEYS];
    for (int j = 0; j < WIDE_KEYS; j++) k[j] = bf16_row_pairs(t, r[j], p, Dh);
    for (int i = 0; i < NB; i++) {
      const uint32_t *qi = q + (size_t)i * Dh;
      const v16i qv = p + 16 <= Dh ? v16i_load(qi + p) : bf16_row_pairs(UATTN_BF16, (const char *)qi, p, Dh);
      for (int j = 0; j < WIDE_KEYS; j++) a[i][j] = v16_dpbf16(a[i][j], qv, k[j]);
    }
  }
  __m256 f[4 * WIDE_KEYS];
  for (int x = 0; x < 4 * WIDE_KEYS; x++)
    f[x] = x / WIDE_KEYS < NB ? v16_fold(a[x / WIDE_KEYS][x % WIDE_KEYS]) : _mm256_setzero_ps();
  const __m256 s = _mm256_set1_ps(scale);
  _mm256_store_ps(out, _mm256_mul_ps(hsum8x8(f), s));
  if (NB > 2) _mm256_store_ps(out + 8, _mm256_mul_ps(hsum8x8(f + 8), s));
}

/* ---- the bf16 path ---------------------------------------------------------------------------------------- */

/* scale <q_i, k_j> for NB <= 4 vectors (bf16 pairs at q + i * Dh, Dh a multiple of 16) and the 4 bf16 rows
 * r[j]: vector i's 4 scores at S + i * ld, or (keys < 4: a ragged end) its first `keys`; each line of row j
 * asks for its place pf[j] bytes on (pf NULL: none) into L1. With tab (fp8 rows,
 * Dh a multiple of 32) the rows are widened 64 dims at a time by v16i_fp8_widen, whose lane order the query
 * pairs are in (unpack32_to's order of 32-bit elements, bf16_decode_body). */
BF16_INLINE void bf16_score4(const int NB, const int32_t Dh, const uint8_t *tab, float scale, const uint32_t *q,
                             const char *const *r, const intptr_t *pf, float *S, size_t ld, int32_t keys) {
  const int(*slot)[4] = sum16_slot;
  v16 a[16];
  for (int x = 0; x < 16; x++) a[x] = v16_zero();
  for (int32_t p = 0; tab && p < Dh; p += 32) {
    v16i k[4][2];
    for (int j = 0; j < 4; j++) v16i_fp8_widen(v16i_load(r[j] + 2 * (size_t)p), tab, &k[j][0], &k[j][1]);
    for (int j = 0; pf && j < keys; j++)
      _mm_prefetch((const char *)((uintptr_t)r[j] + (uintptr_t)pf[j]) + 2 * p, _MM_HINT_T0);
    for (int i = 0; i < NB; i++)
      for (int h = 0; h < 2; h++) {
        const v16i qv = v16i_load(q + (size_t)i * Dh + p + 16 * h);
        for (int j = 0; j < 4; j++) a[slot[i][j]] = v16_dpbf16(a[slot[i][j]], qv, k[j][h]);
      }
  }
  for (int32_t p = 0; !tab && p < Dh; p += 16) {
    v16i k[4];
    for (int j = 0; j < 4; j++) k[j] = v16i_load(r[j] + 4 * (size_t)p);
    for (int j = 0; pf && j < keys; j++)
      _mm_prefetch((const char *)((uintptr_t)r[j] + (uintptr_t)pf[j]) + 4 * p, _MM_HINT_T0);
    for (int i = 0; i < NB; i++) {
      const v16i qv = v16i_load(q + (size_t)i * Dh + p);
      for (int j = 0; j < 4; j++) a[slot[i][j]] = v16_dpbf16(a[slot[i][j]], qv, k[j]);
    }
  }
  sum16_store(NB, v16_mul(v16_sum16(a), v16_set1(scale)), S, ld, keys);
}

/* The scores of every head and block, 4 rows at a time in the cache's order (common/decode16.h's WIDE_SCORES
 * walk): S[g][x][j - j0] for keys [LO, HI) (past the last key, the last again); q: head g's pairs at
 * q + g * n * Dh; tab: fp8 rows (bf16_score4). */
BF16_INLINE void bf16_scores(const decode_shape *s, const uint32_t *q, const uint8_t *tab, float scale, float *S,
                             const int32_t D) {
  const int32_t Dh = D / 2, ahead = decode_rows_ahead(s, BF16_AHEAD); /* 64 for one head, 16 for 4 or more */
  begin_scores(s, S, ahead);
  for (int32_t j = s->LO; j < s->HI; j += 4) {
    const int32_t keys = s->HI - j < 4 ? s->HI - j : 4;
    const char *a[4];
    const int32_t na = ahead_rows(s, j + ahead, j + ahead + 4, a);
    for (int32_t g = 0; g < s->heads; g++) {
      prefetch_rows(s, a, na, g);
      const char *r[4];
      for (int x = 0; x < 4; x++) r[x] = decode_row(s, s->kb, j + (x < keys ? x : keys - 1)) + (size_t)g * s->head_step;
      for (int32_t b = 0; b < s->blocks; b++) {
        float *Sb = S + ((size_t)g * s->n + s->x0[b]) * s->W + (j - s->j0);
        DECODE_BY_NB(s->nb[b], bf16_score4, Dh, tab, scale, q + ((size_t)g * s->n + s->x0[b]) * Dh, r, NULL, Sb,
                     (size_t)s->W, keys);
      }
    }
  }
}

/* ---- the softmax: 16 lanes, P written as P V reads it --------------------------------------------------- */

/* A P row's n floats (n a multiple of 8) as n / 2 bf16 pairs in place, at its start (what bf16_pv_run and
 * decode_tiled.h's P V read; each pair written after the floats it is made of were read). */
BF16_INLINE void bf16_pairs_in_place(float *p, int32_t n) {
  int32_t j = 0;
  for (; j + 16 <= n; j += 16) _mm256_storeu_si256((__m256i *)((uint32_t *)p + j / 2), v16_pairs_bf16(v16_load(p + j)));
  if (j < n) {
    _Alignas(64) float t[16] = {0};
    _mm256_store_ps(t, _mm256_loadu_ps(p + j));
    _mm_storeu_si128((__m128i *)((uint32_t *)p + j / 2), _mm256_castsi256_si128(v16_pairs_bf16(v16_load(t))));
  }
}

/* wide_softmax_cols (common/softmax16.h; shares of Z columns), P then as bf16 pairs at the share's columns' start. */
BF16_INLINE void bf16_softmax_cols(const uattn_panel_job *job, const decode_shape *s, int32_t g, int32_t b,
                                   const vec_rule *rule, float *Sb, int32_t c0, int32_t c1, int32_t *plo, int32_t *phi,
                                   const int32_t Z, const int32_t D) {
  wide_softmax_cols(job, s, g, b, rule, Sb, c0, c1, plo, phi, Z, D);
  for (int i = 0; i < s->nb[b]; i++) bf16_pairs_in_place(Sb + (size_t)i * s->W + (c0 - s->j0), c1 - c0);
}

/* decode_softmax with wide_decode_row, each output rescaled by its alpha (the phases' softmax: the fused walks
 * take it a share at a time, bf16_softmax_cols). */
BF16_INLINE void bf16_decode_softmax(const uattn_panel_job *job, const decode_shape *s, float *S, const int32_t D) {
  for (int32_t g = 0; g < s->heads; g++) {
    const uattn_panel_job h = uattn_decode_head_job(job, g, s->hv);
    for (int32_t b = 0; b < s->blocks; b++) {
      vec_rule rule[4];
      int32_t lo, hi;
      block_rules(&h, s->x0[b], s->nb[b], 0, h.num_keys, rule, &lo, &hi);
      for (int i = 0; i < s->nb[b]; i++) {
        const size_t x = (size_t)s->x0[b] + i;
        float *row = S + ((size_t)g * s->n + x) * s->W;
        float alpha = 1.0f;
        if (rule[i].lo < rule[i].hi) /* else this vector sees none of the keys: o stays exactly as it is */
          alpha = wide_decode_row(row, s->j0, s->W, &rule[i], h.soft_cap, &h.m[x], &h.l[x]);
        else
          memset(row, 0, sizeof(float) * (size_t)s->W);
        float *o = h.o + x * D;
        for (int32_t d = 0; alpha != 1.0f && d < D; d += 8)
          _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_set1_ps(alpha), _mm256_loadu_ps(o + d)));
      }
    }
  }
}

/* P V's order of dims: two value rows interleaved element by element (unpacklo/hi within each 128-bit lane)
 * are 32 dims as two vectors of pairs; lane i of the first is dim 8 (i / 4) + i % 4, of the second that + 4.
 * The permutes of each 32 floats into that order (lane i takes dim unpack32_to[i]) and back (its inverse). */
static const int32_t unpack32_to[32] = {0, 1, 2, 3, 8,  9,  10, 11, 16, 17, 18, 19, 24, 25, 26, 27,
                                        4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
static const int32_t unpack32_from[32] = {0, 1, 2,  3,  16, 17, 18, 19, 4,  5,  6,  7,  20, 21, 22, 23,
                                          8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};

/* Each 32 floats of a (n, a multiple of 32) permuted by perm (32 indices). */
BF16_INLINE void unpack32_apply(float *a, int32_t n, const int32_t *perm) {
  for (int32_t d = 0; d < n; d += 32) {
    const v16 lo = v16_load(a + d), hi = v16_load(a + d + 16);
    v16_store(a + d, v16_perm2(lo, hi, perm)), v16_store(a + d + 16, v16_perm2(lo, hi, perm + 16));
  }
}

/* a[i][..] += P_i (keys j, j + 1: pair c of vector i's P, at pp[i * ld + c]) times the value rows r0, r1
 * interleaved, for U 32-dim parts (part u of a row at r + u * inc: inc 0 for the row of zeros). With tab:
 * fp8 rows, U = 2, their 64 dims' codes interleaved into 16-bit pairs first, then widened (v16i_fp8_widen)
 * straight into bf16 pairs, in fp8_pv_order's lane order: two unpacks fewer than widening each row. */
BF16_INLINE void bf16_pv_pair(const int NB, const int U, const uint8_t *tab, v16 (*a)[4], const char *r0, size_t inc0,
                              const char *r1, size_t inc1, const uint32_t *pp, size_t ld, size_t c, intptr_t pf) {
  v16i w[4];
  if (tab) {
    const v16i x0 = v16i_load(r0), x1 = v16i_load(r1);
    if (pf && inc0) _mm_prefetch((const char *)((uintptr_t)r0 + (uintptr_t)pf), _MM_HINT_T0);
    if (pf && inc1) _mm_prefetch((const char *)((uintptr_t)r1 + (uintptr_t)pf), _MM_HINT_T0);
    v16i_fp8_widen(v16i_unpacklo8(x0, x1), tab, &w[0], &w[1]);
    v16i_fp8_widen(v16i_unpackhi8(x0, x1), tab, &w[2], &w[3]);
  }
  for (int u = 0; !tab && u < U; u++) {
    const v16i x0 = v16i_load(r0 + inc0 * (size_t)u), x1 = v16i_load(r1 + inc1 * (size_t)u);
    w[2 * u] = v16i_unpacklo16(x0, x1), w[2 * u + 1] = v16i_unpackhi16(x0, x1);
    if (pf && inc0) _mm_prefetch((const char *)((uintptr_t)r0 + (uintptr_t)pf) + inc0 * (size_t)u, _MM_HINT_T0);
    if (pf && inc1) _mm_prefetch((const char *)((uintptr_t)r1 + (uintptr_t)pf) + inc1 * (size_t)u, _MM_HINT_T0);
  }
  for (int i = 0; i < NB; i++) {
    const v16i p = v16i_set1(pp[(size_t)i * ld + c]);
    for (int u = 0; u < 2 * U; u++) a[i][u] = v16_dpbf16(a[i][u], p, w[u]);
  }
}

/* 64 dims (U = 2) or 32 (U = 1) of o_i += sum over keys [lo, hi) of P[i][j] v_j for NB vectors, keys in pairs
 * from lo rounded down to even; a key outside [lo, hi) is read from a row of zeros (its P may be another
 * tile's, and its row may lie past the block). pp: P as bf16 pairs, vector i's pair of keys (j, j + 1) at
 * pp[i * ld + (j - j0) / 2] (j0 even); o_i at o + i * D in the unpack order. */
BF16_INLINE void bf16_pv_run(const int NB, const int U, const uint8_t *tab, const uint32_t *pp, size_t ld, int32_t j0,
                             int32_t lo, int32_t hi, const char *v, size_t step, float *o, const int32_t D,
                             intptr_t pf) {
  static const uint16_t zeros[32] __attribute__((aligned(64))); /* 32 bf16 or 64 fp8 zeros */
  const char *z = (const char *)zeros;
  v16 a[4][4];
  for (int i = 0; i < NB; i++)
    for (int u = 0; u < 2 * U; u++) a[i][u] = v16_load(o + (size_t)i * D + 16 * u);
  int32_t j = lo & ~1;
  if (j < lo) { /* an odd first key: its partner before it read as zeros */
    if (j + 1 < hi) bf16_pv_pair(NB, U, tab, a, z, 0, v + (size_t)(j + 1) * step, 64, pp, ld, (size_t)(j - j0) / 2, pf);
    j += 2;
  }
  for (; j + 2 <= hi; j += 2) /* whole pairs */
    bf16_pv_pair(NB, U, tab, a, v + (size_t)j * step, 64, v + (size_t)(j + 1) * step, 64, pp, ld, (size_t)(j - j0) / 2,
                 pf);
  if (j < hi) /* an odd last key */
    bf16_pv_pair(NB, U, tab, a, v + (size_t)j * step, 64, z, 0, pp, ld, (size_t)(j - j0) / 2, pf);
  for (int i = 0; i < NB; i++)
    for (int u = 0; u < 2 * U; u++) v16_store(o + (size_t)i * D + 16 * u, a[i][u]);
}

/* ---- fp8 rows: v16i_fp8_widen's lane order ------------------------------------------------------------- */

/* P V's order of each 64 dims of an output (n floats, a multiple of 64) for fp8 rows: bf16_pv_pair's
 * accumulator u holds dims 16 j + 4 u + [0, 4) in lanes 4 j + [0, 4), so float 16 u + 4 j + i is dim
 * 16 j + 4 u + i: a swap of u and j (a transpose of the four vectors' 128-bit quarters), its own inverse,
 * applied before P V and after. */
BF16_INLINE void fp8_pv_order(float *a, int32_t n) {
  for (int32_t d = 0; d < n; d += 64) {
    const v16 r0 = v16_load(a + d), r1 = v16_load(a + d + 16), r2 = v16_load(a + d + 32), r3 = v16_load(a + d + 48);
    const v16 t0 = V16_SHUF128(r0, r1, 0x88), t1 = V16_SHUF128(r0, r1, 0xdd); /* quarters 0 2 / 1 3 of r0, r1 */
    const v16 t2 = V16_SHUF128(r2, r3, 0x88), t3 = V16_SHUF128(r2, r3, 0xdd);
    v16_store(a + d, V16_SHUF128(t0, t2, 0x88)), v16_store(a + d + 16, V16_SHUF128(t1, t3, 0x88));
    v16_store(a + d + 32, V16_SHUF128(t0, t2, 0xdd)), v16_store(a + d + 48, V16_SHUF128(t1, t3, 0xdd));
  }
}

/* ---- the fused walk (bf16 and fp8 rows) ------------------------------------------------------------------ */

/* Every output of the call put into P V's order or back: fp8_pv_order (its own inverse) for fp8 rows (tab),
 * else each 32 floats permuted by perm (unpack32_to, or unpack32_from back). */
BF16_INLINE void bf16_fused_order(const uattn_panel_job *job, const decode_shape *s, const uint8_t *tab,
                                  const int32_t *perm, const int32_t D) {
  for (int32_t g = 0; g < s->heads; g++)
    for (int32_t x = 0; x < s->n; x++) {
      float *o = job->o + g * s->hq + (size_t)x * D;
      if (tab)
        fp8_pv_order(o, D);
      else
        unpack32_apply(o, D, perm);
    }
}

/* The scores of the walk's share w (bf16_score4, every block of vectors) into its S rows. */
BF16_INLINE void bf16_fused_scores(const uattn_panel_job *job, const decode_shape *s, const decode_walk *w,
                                   const uint8_t *tab, const uint32_t *q, const int32_t Dh) {
  for (int32_t j = w->lo; j < w->hi; j += 4) {
    const char *r[4];
    intptr_t pf[4];
    const int32_t keys = decode_walk_rows(w, s, j, r, pf);
    for (int32_t b = 0; b < s->blocks; b++)
      DECODE_BY_NB(s->nb[b], bf16_score4, Dh, tab, job->scale, q + ((size_t)w->g * s->n + s->x0[b]) * Dh, r,
                   b == 0 ? pf : NULL, w->Sg + (size_t)s->x0[b] * s->W + (j - s->j0), (size_t)s->W, keys);
  }
}

/* Decode on NHD and HND rows of bf16, or of fp8 (tab: the widening tables, the query pairs in unpack32_to's order),
 * fused as decode_tiled.h's tiled_fused: each head's share of Z rows (keys [Z c, Z c + Z) within [LO, HI))
 * scored (bf16_score4, every block of vectors), through the online softmax (bf16_softmax_cols), and into P V
 * (bf16_pv_run) before the next share, so the keys and the values are two streams read side by side; each
 * line asks for its place in its stream's next share into L1. The outputs are in P V's order (unpack32_to,
 * fp8: fp8_pv_order) from the start to the end of the call.
 * Z is 16 rows of bf16 and 32 of fp8 (FP8_SHARE_KEYS): at head dim 128 either share is 4 KB of each stream,
 * and fp8's spreads what a share costs besides its products (the softmax's reductions and its chain to P, the
 * outputs' loads and stores, the walk's step) over twice the keys.
 * In an all-heads call (NHD, more than one head) the next share's scores come before a share's softmax and P
 * V: they depend on nothing before them, so the core has products to run while the softmax's chain resolves.
 * The same arithmetic in another order: the same bits. A call of one head (HND) keeps each share's order, as
 * there the next softmax waits on this P V's outputs. The measurements behind these choices, and the variants
 * tried and dropped, are in this file's git history. */
BF16_INLINE void bf16_fused(const uattn_panel_job *job, const decode_shape *s, const uint8_t *tab, const uint32_t *q,
                            float *S, const int32_t D) {
  const int32_t Dh = D / 2;
  const size_t esz = tab ? 1 : 2;
  bf16_fused_order(job, s, tab, unpack32_to, D);
  decode_walk w, p;
  const int32_t Z = tab ? FP8_SHARE_KEYS : DECODE_SHARE_KEYS; /* a constant in each instance */
  decode_walk_begin(&w, job, s, Z);
  const bool ahead = s->heads > 1; /* the next share's scores before this one's softmax and P V */
  bool more = decode_walk_next(&w, job, s, S, Z);
  if (more) bf16_fused_scores(job, s, &w, tab, q, Dh);
  while (more) {
    p = w;
    int32_t plo[4], phi[4];
    more = decode_walk_next(&w, job, s, S, Z);
    if (more && ahead) bf16_fused_scores(job, s, &w, tab, q, Dh);
    for (int32_t b = 0; b < s->blocks; b++)
      bf16_softmax_cols(job, s, p.g, b, p.rule[b], p.Sg + (size_t)s->x0[b] * s->W, p.c0, p.c1, &plo[b], &phi[b], Z, D);
    for (int32_t b = 0; b < s->blocks; b++) {
      const uint32_t *pp = (const uint32_t *)(p.Sg + (size_t)s->x0[b] * s->W + (p.c0 - s->j0));
      float *o = job->o + (size_t)p.g * s->hq + (size_t)s->x0[b] * D;
      int32_t c0, lo, hi; /* in the piece's rows: each piece starts at an even key, so no pair of keys straddles two */
      for (int32_t x = 0; x < p.pieces; x++) {
        if (!decode_walk_piece(&p, x, plo[b], phi[b], &c0, &lo, &hi)) continue;
        const char *vg = p.vz[x];
        const intptr_t pf = b == 0 ? p.pv[x] : 0;
        int32_t d = 0;
        for (; d + 64 <= D; d += 64)
          DECODE_BY_NB(s->nb[b], bf16_pv_run, 2, tab, pp, (size_t)s->W, c0, lo, hi, vg + esz * d, s->step, o + d, D,
                       pf);
        if (d < D) /* bf16 rows only: fp8's head dims are whole 64s */
          DECODE_BY_NB(s->nb[b], bf16_pv_run, 1, tab, pp, (size_t)s->W, c0, lo, hi, vg + esz * d, s->step, o + d, D,
                       pf);
      }
    }
    if (more && !ahead) bf16_fused_scores(job, s, &w, tab, q, Dh);
  }
  bf16_fused_order(job, s, tab, unpack32_from, D);
}

/* ---- the kernel ----------------------------------------------------------------------------------------- */

/* What both decode kernels (this one and decode_tiled.h's) start with: the call's shape (false when no vector
 * sees a key) and the query vectors as bf16 pairs in scratch ([heads][n][D / 2]: half the floats decode
 * scratch has for the vectors), the score rows S after them. */
BF16_INLINE bool bf16_decode_begin(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype t,
                                   const uattn_decode_src *src, float *scratch, const int32_t D, decode_shape *s,
                                   uint32_t **q, float **S) {
  *q = (uint32_t *)scratch, *S = scratch; /* set also where it returns false (GCC cannot tell the callers stop) */
  if (!decode_shape_of(job, heads, head_vectors, t, src, D, s)) return false;
  s->order = DECODE_NATURAL; /* the scores read pairs; P V keeps its own order */
  *q = (uint32_t *)scratch, *S = scratch + (size_t)heads * s->n * D;
  for (int32_t g = 0; g < heads; g++)
    for (int32_t x = 0; x < s->n; x++)
      pairs_bf16(job->q + g * s->hq + (size_t)x * D, D, *q + ((size_t)g * s->n + x) * (D / 2));
  return true;
}

/* The query pairs of an fp8 call in a widened key row's order: lane 4 j + m of each 16 is pair 8 j + m, then
 * 8 j + 4 + m (v16i_fp8_widen), which is unpack32_to's order of 32 elements. */
BF16_INLINE void bf16_fp8_pairs_order(uint32_t *q, const decode_shape *s, const int32_t D) {
  unpack32_apply((float *)q, s->heads * s->n * (D / 2), unpack32_to);
}

/* decode in kernels.h (the arguments of avx2_decode_body); D a multiple of 8. Every walk takes a call's list
 * of blocks as it is (the fused walks' shares in pieces where the blocks are smaller: decode_walk). */
BF16_INLINE void bf16_decode_body(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype t,
                                  const uattn_decode_src *src, float *scratch, const int32_t D) {
  /* fp8 rows take the bf16 path through the widening lookups (exact) where they are whole 64s of dims */
  const bool fp8 = uattn_dtype_is_fp8(t) && D % 64 == 0;
  const bool bf16 = (t == UATTN_BF16 && D % 32 == 0) || fp8;
  const uint8_t *tab = fp8 ? fp8_bf16_table(t) : NULL;
  decode_shape s;
  uint32_t *q;
  float *S;
  if (!bf16_decode_begin(job, heads, head_vectors, t, src, scratch, D, &s, &q, &S)) return;
  if (fp8) bf16_fp8_pairs_order(q, &s, D);
  if (bf16 && !job->probs_fp32) {
    if (fp8)
      bf16_fused(job, &s, tab, q, S, D);
    else /* a constant NULL: the bf16 instance has no fp8 branch */
      bf16_fused(job, &s, NULL, q, S, D);
    return;
  }
  const int32_t n = s.n;
  if (fp8)
    bf16_scores(&s, q, tab, job->scale, S, D);
  else if (bf16) /* a constant NULL: the bf16 instance has no fp8 branch */
    bf16_scores(&s, q, NULL, job->scale, S, D);
  else
    WIDE_SCORES(&s, S, q, (size_t)n * (D / 2), D / 2, bf16_wide_scores_step, t, D / 2, job->scale);
  bf16_decode_softmax(job, &s, S, D); /* the outputs rescaled, in natural order (s.order is DECODE_NATURAL) */
  if (!job->probs_fp32) round_bf16_in_place(S, (size_t)heads * n * s.W);
  if (D % 16) { /* common/decode16.h's P V takes whole 16s of dims: decode8.h's */
    decode_pv(job, &s, t, S, D);
    return;
  }
  const bool eo = t == UATTN_BF16 && D % 32 == 0;
  for (int32_t g = 0; eo && g < heads; g++)
    for (int32_t x = 0; x < n; x++) eo32_order(job->o + g * s.hq + (size_t)x * D, D, true);
  if (eo)
    wide_pv(true, job, &s, t, S, D);
  else
    wide_pv(false, job, &s, t, S, D);
  for (int32_t g = 0; eo && g < heads; g++)
    for (int32_t x = 0; x < n; x++) eo32_order(job->o + g * s.hq + (size_t)x * D, D, false);
}

#endif
