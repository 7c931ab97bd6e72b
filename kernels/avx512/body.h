/* The avx512 set's attend (every part but the decode kernel's jobs), always inline, in common/vec16.h's two forms:
 * avx512/set.c instantiates it in zmm, avx512/twin.c on pairs of ymm (the same bits: every operation is
 * lane-wise or one of vec.h's exact moves), each generated bucket (avx512/bucket.h) with a constant head dim.
 *
 * Panels: the avx2 set's (common/panels.h, its load): keys transposed, values row-major, both 64-byte aligned
 * with strides of an odd number of 64-byte lines, so a 16-float vector of either is one cache line.
 *
 * Plan: common/attend_plan.h's (chunks of KC keys, blocks of query vectors as even as they go, block_rules and
 * block_softmax), with blocks of up to ZQB vectors and the two products in 16-float vectors:
 *   S = Q K^T  register tiles of NB vectors x 32 keys, 2 NB accumulators (16 for NB = 8) fed by 2 key loads
 *              and NB broadcasts a dim, summed DB dims at a time into S as avx2/body.h does (its accuracy);
 *   softmax    common/softmax.h's rules and online rescale, its exp pass 16 lanes at a time (v16_exp: exp8's bits);
 *   P V        register tiles of NB vectors x 32 dims, each value load serving NB broadcasts.
 * Blocks of 8 vectors (where avx2/body.h stops at 6) fill the 32 registers: 16 accumulators, the key or value
 * loads and a broadcast, and give each load 8 FMAs. Define AVX512_VEC_ZMM or not first (common/vec16.h). */
#ifndef UATTN_AVX512_BODY_H
#define UATTN_AVX512_BODY_H

#include "common/attend_plan.h"
#include "common/panels.h"
#include "common/softmax.h"
#include "common/vec16.h"

enum { ZQB = 8 }; /* query vectors per block */

/* Independent chains per accumulator: two FMA ports of 4 cycles need 8 in flight, which 2 NB accumulators give
 * from NB = 4; smaller blocks split each sum over 2 or 4 chains, added as common/attend_plan.h's sum_chains does. */
#define ZCHAINS(NB) ((NB) >= 4 ? 1 : (NB) == 1 ? 4 : 2)

V16_INLINE void zsum_chains(const int C, const int NB, const int W, v16 (*a)[ZQB][2]) {
  for (int i = 0; i < NB; i++)
    for (int w = 0; w < W; w++) {
      if (C == 4) a[0][i][w] = v16_add(v16_add(a[0][i][w], a[1][i][w]), v16_add(a[2][i][w], a[3][i][w]));
      if (C == 2) a[0][i][w] = v16_add(a[0][i][w], a[1][i][w]);
    }
}

/* Dims [d0, d1) of the scores of NB vectors (q_i at q + i * D) against 16 W keys at k (n lanes of the last
 * vector: the panel's columns past its keys up to the next 16 may be unset). */
V16_INLINE void zscore_part(const int NB, const int W, const float *q, int32_t D, const float *k, int32_t P, int32_t d0,
                            int32_t d1, int n, v16 (*out)[2]) {
  const int C = ZCHAINS(NB);
  v16 a[4][ZQB][2];
  for (int c = 0; c < C; c++)
    for (int i = 0; i < NB; i++)
      for (int w = 0; w < W; w++) a[c][i][w] = v16_zero();
  int32_t d = d0;
  k += (size_t)d0 * P;
  for (; d + C <= d1; d += C, k += (size_t)C * P)
    for (int c = 0; c < C; c++) {
      v16 kv[2];
      for (int w = 0; w < W; w++)
        kv[w] = W == 2 || n == 16 ? v16_load(k + (size_t)c * P + 16 * w) : v16_load_n(k + (size_t)c * P, n);
      for (int i = 0; i < NB; i++) {
        const v16 b = v16_set1(q[(size_t)i * D + d + c]);
        for (int w = 0; w < W; w++) a[c][i][w] = v16_fmadd(b, kv[w], a[c][i][w]);
      }
    }
  for (; d < d1; d++, k += P) {
    v16 kv[2];
    for (int w = 0; w < W; w++) kv[w] = W == 2 || n == 16 ? v16_load(k + 16 * w) : v16_load_n(k, n);
    for (int i = 0; i < NB; i++) {
      const v16 b = v16_set1(q[(size_t)i * D + d]);
      for (int w = 0; w < W; w++) a[0][i][w] = v16_fmadd(b, kv[w], a[0][i][w]);
    }
  }
  zsum_chains(C, NB, W, a);
  for (int i = 0; i < NB; i++)
    for (int w = 0; w < W; w++) out[i][w] = a[0][i][w];
}

/* S[i][j - j0] = <q_i, k_j> for NB vectors and keys [j0, j1) (j1 - j0 a multiple of 8), 32 keys at a time, then
 * 16 or fewer; each dot product DB dims at a time, the partial sums added up in S (avx2/body.h's score_tile). */
V16_INLINE void zscore_tile(const int NB, const float *q, int32_t D, const float *kt, int32_t P, int32_t j0, int32_t j1,
                            float (*S)[KC]) {
  for (int32_t j = j0; j < j1;) {
    const int W = j1 - j >= 32 ? 2 : 1, n = j1 - j >= 16 ? 16 : j1 - j;
    for (int32_t d0 = 0; d0 < D; d0 += DB) {
      const int32_t d1 = D - d0 < DB ? D : d0 + DB;
      v16 a[ZQB][2];
      if (W == 2)
        zscore_part(NB, 2, q, D, kt + j, P, d0, d1, 16, a);
      else
        zscore_part(NB, 1, q, D, kt + j, P, d0, d1, n, a);
      for (int i = 0; i < NB; i++)
        for (int w = 0; w < W; w++) {
          float *s = S[i] + (j - j0) + 16 * w;
          if (n == 16) {
            if (d0) a[i][w] = v16_add(a[i][w], v16_load(s));
            v16_store(s, a[i][w]);
          } else {
            if (d0) a[i][w] = v16_add(a[i][w], v16_load_n(s, n));
            v16_store_n(s, a[i][w], n);
          }
        }
    }
    j += W == 2 ? 32 : n;
  }
}

/* 16 W dims (n lanes of the last vector) of o_i = alpha_i o_i + sum_{j in [klo, khi)} P[i][j - j0] v_j. */
V16_INLINE void zpv_part(const int NB, const int W, float (*S)[KC], int32_t j0, int32_t klo, int32_t khi,
                         const float *v, int32_t Dv, float *o, int32_t D, const float *alpha, int n) {
  const int C = ZCHAINS(NB);
  v16 a[4][ZQB][2];
  for (int i = 0; i < NB; i++)
    for (int w = 0; w < W; w++) {
      const v16 x = n == 16 ? v16_load(o + (size_t)i * D + 16 * w) : v16_load_n(o + (size_t)i * D, n);
      a[0][i][w] = v16_mul(v16_set1(alpha[i]), x);
      for (int c = 1; c < C; c++) a[c][i][w] = v16_zero();
    }
  int32_t j = klo;
  v += (size_t)klo * Dv;
  for (; j + C <= khi; j += C, v += (size_t)C * Dv)
    for (int c = 0; c < C; c++) {
      v16 vv[2];
      for (int w = 0; w < W; w++) vv[w] = v16_load(v + (size_t)c * Dv + 16 * w);
      for (int i = 0; i < NB; i++) {
        const v16 p = v16_set1(S[i][j + c - j0]);
        for (int w = 0; w < W; w++) a[c][i][w] = v16_fmadd(p, vv[w], a[c][i][w]);
      }
    }
  for (; j < khi; j++, v += Dv) {
    v16 vv[2];
    for (int w = 0; w < W; w++) vv[w] = v16_load(v + 16 * w);
    for (int i = 0; i < NB; i++) {
      const v16 p = v16_set1(S[i][j - j0]);
      for (int w = 0; w < W; w++) a[0][i][w] = v16_fmadd(p, vv[w], a[0][i][w]);
    }
  }
  zsum_chains(C, NB, W, a);
  for (int i = 0; i < NB; i++)
    for (int w = 0; w < W; w++) {
      if (n == 16)
        v16_store(o + (size_t)i * D + 16 * w, a[0][i][w]);
      else
        v16_store_n(o + (size_t)i * D, a[0][i][w], n);
    }
}

/* o_i = alpha_i o_i + P V over keys [klo, khi) for NB vectors, over o's first E dims (uattn_job_value_dim), 32
 * at a time, then 16 or fewer (the value panel's rows are zero past the head dim only to the next 8, and every
 * row is read whole: a value stride is a multiple of 16, so a 16-float load past the head dim stays within the
 * row's line). */
V16_INLINE void zpv_tile(const int NB, float (*S)[KC], int32_t j0, int32_t klo, int32_t khi, const float *vp,
                         int32_t Dv, float *o, int32_t D, int32_t E, const float *alpha) {
  int32_t d = 0;
  for (; d + 32 <= E; d += 32) zpv_part(NB, 2, S, j0, klo, khi, vp + d, Dv, o + d, D, alpha, 16);
  for (; d < E; d += 16) zpv_part(NB, 1, S, j0, klo, khi, vp + d, Dv, o + d, D, alpha, E - d >= 16 ? 16 : (int)(E - d));
}

/* common/softmax.h's softmax_row with the exp pass in 16 lanes: S[j0, j1) to P, m and l updated, the factor o is
 * rescaled by returned. */
V16_INLINE float zsoftmax_row(float *s, int32_t j0, int32_t j1, const vec_rule *v, float cap, float *m, float *l) {
  float alpha;
  const float m_new = row_new_max(row_rules_max(s, j0, j1, v, cap), *m, &alpha);
  const v16 mv = v16_set1(m_new);
  v16 sum = v16_zero();
  int32_t j = j0;
  for (; j + 16 <= j1; j += 16) {
    const v16 p = v16_exp(v16_sub(v16_load(s + (j - j0)), mv));
    v16_store(s + (j - j0), p);
    sum = v16_add(sum, p);
  }
  if (j < j1) { /* 8 left: the lanes past them add zeros */
    const v16 p = v16_exp(v16_sub(v16_load_n(s + (j - j0), 8), mv));
    v16_store_n(s + (j - j0), p, 8);
    sum = v16_add(sum, v16_keep_n(p, 8));
  }
  *l = *l * alpha + v16_hsum(sum);
  *m = m_new;
  return alpha;
}

/* Query vectors [x0, x0 + NB) of the job against keys [c0, c1) of the panel (avx2/body.h's attend_block). */
V16_INLINE void zattend_block(const int NB, const int32_t D, const attend_ctx *c, int32_t x0, int32_t c0, int32_t c1) {
  const uattn_panel_job *job = c->job;
  vec_rule rule[ZQB];
  int32_t klo, khi;
  block_rules(job, x0, NB, c0, c1, rule, &klo, &khi);
  if (klo >= khi) return;
  const int32_t j0 = klo & ~15, j1 = (khi + 7) & ~7;
  _Alignas(64) float S[ZQB][KC];
  zscore_tile(NB, job->q + (size_t)x0 * D, D, c->kt, c->P, j0, j1, S);
  float alpha[ZQB];
  for (int i = 0; i < NB; i++) {
    const size_t x = (size_t)x0 + i;
    if (rule[i].lo < rule[i].hi) {
      alpha[i] = zsoftmax_row(S[i], j0, j1, &rule[i], job->soft_cap, &job->m[x], &job->l[x]);
    } else { /* this vector sees none of the chunk: o stays exactly as it is */
      alpha[i] = 1.0f;
      memset(S[i], 0, sizeof(float) * (size_t)(j1 - j0));
    }
  }
  zpv_tile(NB, S, j0, klo, khi, c->vp, c->Dv, job->o + (size_t)x0 * D, D, uattn_job_value_dim(job), alpha);
}

/* The job's vectors against its panel: common/attend_plan.h's ATTEND_BLOCKS plan with blocks of up to ZQB. */
V16_INLINE void avx512_attend_body(const uattn_panel_job *job, int32_t panel_keys, const int32_t D,
                                   const int32_t ROWS) {
  const int32_t rows = ROWS ? ROWS : job->rows, kmax = keys_seen(job, rows);
  if (kmax <= 0) return;
  const attend_ctx c = {job, align64c(job->keys), align64c(job->values), key_stride(panel_keys), value_stride(D)};
  const int32_t n = rows * job->group, blocks = (n + ZQB - 1) / ZQB, small = n / blocks, big = n % blocks;
  for (int32_t c0 = 0; c0 < kmax; c0 += KC) {
    const int32_t c1 = kmax - c0 < KC ? kmax : c0 + KC;
    for (int32_t b = 0, x0 = 0; b < blocks; b++) {
      const int32_t nb = small + (b < big);
      switch (nb) {
      case 1: zattend_block(1, D, &c, x0, c0, c1); break;
      case 2: zattend_block(2, D, &c, x0, c0, c1); break;
      case 3: zattend_block(3, D, &c, x0, c0, c1); break;
      case 4: zattend_block(4, D, &c, x0, c0, c1); break;
      case 5: zattend_block(5, D, &c, x0, c0, c1); break;
      case 6: zattend_block(6, D, &c, x0, c0, c1); break;
      case 7: zattend_block(7, D, &c, x0, c0, c1); break;
      default: zattend_block(ZQB, D, &c, x0, c0, c1); break;
      }
      x0 += nb;
    }
  }
}

#endif
