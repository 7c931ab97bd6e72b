/* The avx2 set's decode kernel on uattn's own cache layout (UATTN_LAYOUT_TILED, uattn.h), bf16 and fp8 caches:
 * the decode8.h kernel's shape, softmax and phases, with the products taken in the layout's order.
 *
 * A block is tiles of 16 keys, each tile every KV head in turn: an all-heads call reads its keys, then its
 * values, each one stream in address order (on NHD a head's P V reads part of every row, a pattern the
 * hardware prefetchers follow worse). Within a tile and head (a share: 4 KB of keys, 4 KB of values at head
 * dim 128 in bf16), each 32 elements are an element pair in every 32-bit lane (tiled8_widen):
 *   keys    32 elements are one dim pair of the 16 keys: the widened lanes are 8 keys' dim 2p and dim 2p + 1,
 *           each times the query's element broadcast, so 16 scores are two vectors with no sum tree (NHD's
 *           hsum8x8) and the query vectors stay in their order;
 *   values  32 elements are 16 dims of a key pair: the widened lanes are 8 dims of key 2m and of key 2m + 1,
 *           each times its P broadcast.
 * P stays in fp32 (a layer's probs_fp32 changes nothing here). fp8 codes are widened a quarter at a time
 * (widen.h's fp8_quarter), which gives bf16's pairs in another order of the lanes (the even and odd keys,
 * the even and odd dims); the codes' rebias is folded into a copy of the query vectors, P and the outputs as
 * decode8.h's DECODE_Q4 does, unless the queries are too large for it (q_fits_fold). Keys past the call's
 * inside a tile are scored but masked by the softmax rules, and left out of P V (a slot never written may hold
 * NaN, and 0 x NaN would reach the output). Each head's sums are in one order whatever else the call holds,
 * so a head's result is a call for it alone, bit for bit.
 *
 * Needs a head dim that is a multiple of 16 (the record's tiled_dim_multiple). */
#ifndef UATTN_AVX2_DECODE_TILED_H
#define UATTN_AVX2_DECODE_TILED_H

#include "common/decode8.h"

enum {
  TILED8_KEYS = UATTN_TILED_KEYS,
  TILED8_AHEAD = 2, /* shares ahead of the one being read that are asked for, each line as its place is read */
};

/* Split sums of the tiled steps: chains over the dim pairs (scores) or key pairs (P V), so 1-2 vectors still
 * keep 8 accumulators in flight; 3 vectors take 6, all that fit beside the 4 widened vectors. */
#define TILED8_CHAINS(NB) ((NB) == 1 ? 4 : (NB) == 2 ? 2 : 1)

/* 32 elements of a share (at x: 64 bytes of bf16, 32 of fp8 codes), each 32-bit lane of it an element pair,
 * widened into two slots of 8 lanes, each slot's two vectors the pairs' first and second elements: w[0], w[1]
 * slot 0's, w[2], w[3] slot 1's. Slots: bf16, the first 8 pairs and the next 8; fp8 (FP8), whose lanes hold
 * two pairs (bytes: a, a', b, b' of pairs (a, a'), (b, b')), the first pair of each lane and the second.
 * fp8 elements are exact times 2^-2H (FOLD) or exact (not FOLD: one more multiply, by 2^2H); PATCH: their
 * special codes mended (fp8_patch). */
AVX2_INLINE void tiled8_widen(const int FP8, const int PATCH, const int FOLD, uattn_dtype t, const char *x,
                              __m256 w[4]) {
  if (!FP8) {
    widen16_eo(x, &w[0], &w[1]);
    widen16_eo(x + 32, &w[2], &w[3]);
    return;
  }
  const __m256i c = _mm256_loadu_si256((const void *)x);
  const __m256 up = _mm256_set1_ps(ldexpf(1.0f, 2 * fp8_fold(t)));
  for (int q = 0; q < 4; q++) { /* quarter q: byte q of every lane */
    w[q] = fp8_quarter(t, c, q);
    if (PATCH) w[q] = fp8_patch(t, w[q], c, q);
    if (!FOLD) w[q] = _mm256_mul_ps(up, w[q]);
  }
}

/* Whether any of the n bytes (a multiple of 32) at x is a special fp8 code (fp8_special): looked for once a
 * share, so that its products take fp8_patch only where one is. */
AVX2_INLINE bool tiled8_fp8_special(uattn_dtype t, const char *x, size_t n) {
  __m256i sp = _mm256_setzero_si256();
  for (size_t i = 0; i < n; i += 32)
    sp = _mm256_or_si256(sp, fp8_special(t, _mm256_loadu_si256((const void *)(x + i))));
  return !_mm256_testz_si256(sp, sp);
}

/* <q_i, k_j> for NB vectors (q_i at q + i * D; fp8 with FOLD: times 2^H) and the 16 keys of one head's share of
 * a tile (kt), into vector i's S row at columns col + [0, 16): each half of 8 keys only where it lies within
 * [0, W) (fp8's slots, the even and odd keys, put in the keys' order first). Each line read asks for its place
 * in share pf (NULL: none). */
AVX2_INLINE void tiled8_scores(const int NB, const int FP8, const int PATCH, const int FOLD, uattn_dtype t,
                               const float *q, const int32_t D, const char *kt, const char *pf, float *S, int32_t ld,
                               int32_t col, int32_t W) {
  const int C = TILED8_CHAINS(NB);
  const size_t piece = FP8 ? 32 : 64; /* bytes of a dim pair of the 16 keys */
  __m256 a[4][4][2];                  /* [chain][vector][slot] */
  for (int c = 0; c < C; c++)
    for (int i = 0; i < NB; i++) a[c][i][0] = a[c][i][1] = _mm256_setzero_ps();
  for (int32_t p = 0; p < D / 2; p += C)
    for (int c = 0; c < C; c++) {
      if (pf) _mm_prefetch(pf + piece * (size_t)(p + c), _MM_HINT_T0);
      __m256 w[4];
      tiled8_widen(FP8, PATCH, FOLD, t, kt + piece * (size_t)(p + c), w);
      for (int i = 0; i < NB; i++) {
        const __m256 qe = _mm256_broadcast_ss(q + (size_t)i * D + 2 * (p + c));
        const __m256 qo = _mm256_broadcast_ss(q + (size_t)i * D + 2 * (p + c) + 1);
        a[c][i][0] = _mm256_fmadd_ps(qo, w[1], _mm256_fmadd_ps(qe, w[0], a[c][i][0]));
        a[c][i][1] = _mm256_fmadd_ps(qo, w[3], _mm256_fmadd_ps(qe, w[2], a[c][i][1]));
      }
    }
  const __m256 up = _mm256_set1_ps(ldexpf(1.0f, FP8 && FOLD ? fp8_fold(t) : 0));
  for (int i = 0; i < NB; i++) {
    __m256 half[2];
    for (int h = 0; h < 2; h++) {
      if (C == 4)
        a[0][i][h] = _mm256_add_ps(_mm256_add_ps(a[0][i][h], a[1][i][h]), _mm256_add_ps(a[2][i][h], a[3][i][h]));
      if (C == 2) a[0][i][h] = _mm256_add_ps(a[0][i][h], a[1][i][h]);
      half[h] = FP8 && FOLD ? _mm256_mul_ps(up, a[0][i][h]) : a[0][i][h];
    }
    if (FP8) { /* the even and odd keys into keys 0-7 and 8-15 */
      const __m256 u0 = _mm256_unpacklo_ps(half[0], half[1]), u1 = _mm256_unpackhi_ps(half[0], half[1]);
      half[0] = _mm256_permute2f128_ps(u0, u1, 0x20), half[1] = _mm256_permute2f128_ps(u0, u1, 0x31);
    }
    for (int h = 0; h < 2; h++)
      if (col + 8 * h >= 0 && col + 8 * h < W) _mm256_storeu_ps(S + (size_t)i * ld + (col + 8 * h), half[h]);
  }
}

/* One key of a pair (ODD: the second; its 32 elements of 16 dims at x) into NB vectors' accumulators (chain
 * 0), P of the key at P + i * ld. */
AVX2_INLINE void tiled8_pv_key(const int NB, const int FP8, const int PATCH, const int FOLD, const int ODD,
                               uattn_dtype t, const float *P, int32_t ld, const char *x, __m256 a[4][QB][2]) {
  __m256 w[4];
  tiled8_widen(FP8, PATCH, FOLD, t, x, w);
  for (int i = 0; i < NB; i++) {
    const __m256 p = _mm256_broadcast_ss(P + (size_t)i * ld);
    a[0][i][0] = _mm256_fmadd_ps(p, w[ODD], a[0][i][0]);
    a[0][i][1] = _mm256_fmadd_ps(p, w[2 + ODD], a[0][i][1]);
  }
}

/* A key pair (its 32 elements of 16 dims at vd + at; P of its first key at P + i * ld) into NB vectors'
 * accumulators a (one chain), asking for the piece's place in share pf (off + at; NULL: none). */
AVX2_INLINE void tiled8_pv_pair(const int NB, const int FP8, const int PATCH, const int FOLD, uattn_dtype t,
                                const float *P, int32_t ld, const char *vd, const char *pf, size_t off, size_t at,
                                __m256 a[QB][2]) {
  if (pf) _mm_prefetch(pf + off + at, _MM_HINT_T0);
  __m256 w[4];
  tiled8_widen(FP8, PATCH, FOLD, t, vd + at, w);
  for (int i = 0; i < NB; i++) {
    const __m256 pe = _mm256_broadcast_ss(P + (size_t)i * ld), po = _mm256_broadcast_ss(P + (size_t)i * ld + 1);
    a[i][0] = _mm256_fmadd_ps(po, w[1], _mm256_fmadd_ps(pe, w[0], a[i][0]));
    a[i][1] = _mm256_fmadd_ps(po, w[3], _mm256_fmadd_ps(pe, w[2], a[i][1]));
  }
}

/* o_i += sum over keys [lo, hi) of the tile (0 <= lo < hi <= 16) of P_i[j] v_j for NB vectors: vector i's P
 * of tile key j at P[i * ld + j - lo] (fp8 with FOLD: times 2^H), o_i at o + i * D in the slots' order (bf16:
 * natural; fp8: the even and odd dims of each 16); vt: one head's share of the tile's values. 16 dims a pass
 * over the keys, the keys in pairs (a key of a pair outside [lo, hi) alone); each piece read asks for its
 * place in share pf (NULL: none). */
AVX2_INLINE void tiled8_pv(const int NB, const int FP8, const int PATCH, const int FOLD, uattn_dtype t, const float *P,
                           int32_t ld, int32_t lo, int32_t hi, const char *vt, const char *pf, const int32_t D,
                           float *o) {
  const int C = TILED8_CHAINS(NB);
  const size_t esz = FP8 ? 1 : 2, pair = 2 * (size_t)D * esz; /* bytes of a key pair's row of values */
  for (int32_t d = 0; d < D; d += 16) {
    __m256 a[4][QB][2];
    for (int i = 0; i < NB; i++) {
      a[0][i][0] = _mm256_loadu_ps(o + (size_t)i * D + d), a[0][i][1] = _mm256_loadu_ps(o + (size_t)i * D + d + 8);
      for (int c = 1; c < C; c++) a[c][i][0] = a[c][i][1] = _mm256_setzero_ps();
    }
    const size_t off = 2 * (size_t)d * esz; /* the 16 dims' place in a pair's row */
    const char *vd = vt + off;
    int32_t j = lo;
    if (j & 1) tiled8_pv_key(NB, FP8, PATCH, FOLD, 1, t, P, ld, vd + (size_t)(j / 2) * pair, a), j++;
    const int32_t pairs = (hi - j) / 2;
    for (int32_t m = 0; m < pairs; m += C)
      for (int c = 0; c < C; c++) /* past the last pair: none (C > 1 only) */
        if (C == 1 || m + c < pairs)
          tiled8_pv_pair(NB, FP8, PATCH, FOLD, t, P + (j - lo) + 2 * (m + c), ld, vd, pf, off,
                         (size_t)(j / 2 + m + c) * pair, a[c]);
    j += 2 * pairs;
    if (j < hi) tiled8_pv_key(NB, FP8, PATCH, FOLD, 0, t, P + (j - lo), ld, vd + (size_t)(j / 2) * pair, a);
    sum_chains(C, NB, 2, a);
    for (int i = 0; i < NB; i++)
      _mm256_storeu_ps(o + (size_t)i * D + d, a[0][i][0]), _mm256_storeu_ps(o + (size_t)i * D + d + 8, a[0][i][1]);
  }
}

/* ---- the walk -------------------------------------------------------------------------------------------- */

/* One head's share of a tile scored for NB vectors: bf16, or fp8 (fold: the vectors carry 2^H) with its
 * special codes mended where the share has one (patch: tiled8_fp8_special found one, looked for once a share
 * whatever the blocks of vectors; every share where the queries are not folded: rare, so one instance). */
AVX2_INLINE void tiled8_share_scores(const int NB, uattn_dtype t, bool fold, bool patch, const float *q,
                                     const int32_t D, const char *kt, const char *pf, float *S, int32_t ld, int32_t col,
                                     int32_t W) {
  if (t == UATTN_BF16)
    tiled8_scores(NB, 0, 0, 1, t, q, D, kt, pf, S, ld, col, W);
  else if (!fold)
    tiled8_scores(NB, 1, 1, 0, t, q, D, kt, pf, S, ld, col, W);
  else if (patch)
    tiled8_scores(NB, 1, 1, 1, t, q, D, kt, pf, S, ld, col, W);
  else
    tiled8_scores(NB, 1, 0, 1, t, q, D, kt, pf, S, ld, col, W);
}

/* One head's share of a tile into NB vectors' outputs, keys [lo, hi) of the tile: as above (patch: a special
 * code among the key pairs any block reads). */
AVX2_INLINE void tiled8_share_pv(const int NB, uattn_dtype t, bool fold, bool patch, const float *P, int32_t ld,
                                 int32_t lo, int32_t hi, const char *vt, const char *pf, const int32_t D, float *o) {
  if (t == UATTN_BF16)
    tiled8_pv(NB, 0, 0, 1, t, P, ld, lo, hi, vt, pf, D, o);
  else if (!fold)
    tiled8_pv(NB, 1, 1, 0, t, P, ld, lo, hi, vt, pf, D, o);
  else if (patch)
    tiled8_pv(NB, 1, 1, 1, t, P, ld, lo, hi, vt, pf, D, o);
  else
    tiled8_pv(NB, 1, 0, 1, t, P, ld, lo, hi, vt, pf, D, o);
}

/* Where one call's tiles are, for its walk. */
typedef struct tiled8_src {
  const char *k, *v;           /* the block's first tile, the call's first head */
  size_t tile_step, head_step; /* bytes from a tile to the next, from a head's share of a tile to the next head's */
  int32_t T0, T1, heads;       /* tiles [T0, T1) hold the keys [LO, HI) */
  const char *next_k;          /* the next call's keys (its block's first tile, the same heads), or NULL */
} tiled8_src;

/* Share y of the call's walk: its keys' shares (tiles from T0, every head in turn), then its values' in the
 * same order, then the next call's first tile's keys; NULL past them. */
AVX2_INLINE const char *tiled8_share(const tiled8_src *w, int32_t y) {
  const int32_t n = (w->T1 - w->T0) * w->heads, x = y < n ? y : y < 2 * n ? y - n : y - 2 * n;
  const size_t at = (size_t)(x / w->heads) * w->tile_step + (size_t)(x % w->heads) * w->head_step;
  if (y < 2 * n) return (y < n ? w->k : w->v) + (size_t)w->T0 * w->tile_step + at;
  return w->next_k && x < w->heads ? w->next_k + at : NULL;
}

/* kernels.h's decode_tiled for bf16 and fp8 caches (k_src, v_src: the block's first tile, the call's first
 * head; stride: elements from a tile to the next; head_stride: from a head's share of a tile to the next
 * head's), in decode8.h's phases: every share's scores (each line asking for its place TILED8_AHEAD shares on,
 * past the keys in the values', past those in the next call's first keys), the softmax of the call's columns,
 * then every share's P V. fp8: the codes' rebias folded into a copy of the query vectors, P and the outputs
 * (decode8.h's DECODE_Q4 way), unless the queries are too large for it (q_fits_fold). D a multiple of 16. */
AVX2_INLINE void avx2_decode_tiled_body(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype t,
                                        const void *k_src, const void *v_src, size_t stride, size_t head_stride,
                                        float *scratch, const int32_t D) {
  /* the record takes bf16 and fp8 alone (uattn_decode_tiled_fits): other dtypes' buckets compile none */
  if (t != UATTN_BF16 && !uattn_dtype_is_fp8(t)) return;
  decode_shape s;
  const uattn_decode_src tiles = uattn_decode_one_block(&k_src, &v_src, stride, head_stride); /* steps: a tile's */
  if (!decode_shape_of(job, heads, head_vectors, t, &tiles, D, &s)) return;                   /* no vector sees a key */
  s.order = DECODE_NATURAL; /* bf16: the query vectors and outputs as they are */
  const float *q = job->q;
  size_t qstep = s.hq;
  float *S = scratch; /* [heads][n][W], after the folded query vectors where there are some */
  bool fold = false;
  if (uattn_dtype_is_fp8(t)) {
    fold = q_fits_fold(job, heads, head_vectors, s.fold, D);
    s.order = fold ? DECODE_EO8 : DECODE_EO; /* the outputs in P V's order (tiled8_pv) */
    if (fold) {
      const __m256 up = _mm256_set1_ps(ldexpf(1.0f, s.fold));
      for (int32_t g = 0; g < heads; g++)
        for (size_t x = 0; x < (size_t)s.n * D; x += 8)
          _mm256_store_ps(scratch + (size_t)g * s.n * D + x, _mm256_mul_ps(up, _mm256_loadu_ps(job->q + g * s.hq + x)));
      q = scratch, qstep = (size_t)s.n * D, S = scratch + (size_t)heads * s.n * D;
    }
  }
  const tiled8_src w = {
      k_src, v_src,      s.step, s.head_step, s.LO / TILED8_KEYS, (s.HI + TILED8_KEYS - 1) / TILED8_KEYS,
      heads, job->next_k};
  const int32_t shares = (w.T1 - w.T0) * heads;
  const size_t share = (size_t)TILED8_KEYS * (size_t)D * uattn_dtype_size(t); /* bytes of a head's share of a tile */
  for (int32_t y = 0; y < TILED8_AHEAD; y++) { /* the first shares, which no line asks for */
    const char *x = tiled8_share(&w, y);
    for (size_t o = 0; x && o < share; o += 64) _mm_prefetch(x + o, _MM_HINT_T0);
  }
  for (int32_t y = 0; y < shares; y++) {
    const int32_t T = w.T0 + y / heads, g = y % heads;
    const char *kt = w.k + (size_t)T * w.tile_step + (size_t)g * w.head_step, *pf = tiled8_share(&w, y + TILED8_AHEAD);
    const bool patch = fold && tiled8_fp8_special(t, kt, (size_t)TILED8_KEYS * D);
    for (int32_t b = 0; b < s.blocks; b++)
      DECODE_BY_NB(s.nb[b], tiled8_share_scores, t, fold, patch, q + g * qstep + (size_t)s.x0[b] * D, D, kt,
                   b == 0 ? pf : NULL, S + ((size_t)g * s.n + s.x0[b]) * s.W, s.W, T * TILED8_KEYS - s.j0, s.W);
  }
  decode_softmax(job, &s, S, D);
  for (int32_t y = 0; y < shares; y++) {
    const int32_t T = w.T0 + y / heads, g = y % heads, k0 = T * TILED8_KEYS;
    const char *vt = w.v + (size_t)T * w.tile_step + (size_t)g * w.head_step;
    const char *pf = tiled8_share(&w, shares + y + TILED8_AHEAD);
    int32_t lo_all = k0 + TILED8_KEYS, hi_all = k0; /* the keys of the share any block reads */
    for (int32_t b = 0; b < s.blocks; b++) {
      if (s.lo[b] < lo_all) lo_all = s.lo[b] > k0 ? s.lo[b] : k0;
      if (s.hi[b] > hi_all) hi_all = s.hi[b] < k0 + TILED8_KEYS ? s.hi[b] : k0 + TILED8_KEYS;
    }
    if (lo_all >= hi_all) continue;
    const size_t pair = 2 * (size_t)D, first = (size_t)((lo_all - k0) / 2) * pair;
    const bool patch = fold && tiled8_fp8_special(t, vt + first, (size_t)((hi_all - k0 + 1) / 2) * pair - first);
    for (int32_t b = 0; b < s.blocks; b++) {
      const int32_t lo = s.lo[b] > k0 ? s.lo[b] : k0, hi = s.hi[b] < k0 + TILED8_KEYS ? s.hi[b] : k0 + TILED8_KEYS;
      if (lo >= hi) continue; /* (a block that sees no key has lo INT32_MAX, hi INT32_MIN) */
      const float *P = S + ((size_t)g * s.n + s.x0[b]) * s.W + (lo - s.j0); /* key lo's */
      DECODE_BY_NB(s.nb[b], tiled8_share_pv, t, fold, patch, P, s.W, lo - k0, hi - k0, vt, b == 0 ? pf : NULL, D,
                   job->o + g * s.hq + (size_t)s.x0[b] * D);
    }
  }
  decode_outputs_natural(job, &s, D);
}

#endif
