/* The AVX2 + FMA + F16C kernels, as always-inline bodies: kernels/avx2/set.c instantiates them for any shape
 * (the generic set) and each generated bucket source (gen/) for its own constant block size, head dim and
 * dtype, so the compiler unrolls and folds what the constants decide. Include only on x86.
 *
 * Panels: common/panels.h's (this set's own layout, which the avx512 set shares), loaded by its
 * avx2_load_body.
 *
 * attend: the job's query vectors x = row * group + head (each with its own visible range, window, slope)
 * are taken in blocks of up to QB (as even as they go); the keys a block sees are taken KC at a time (a
 * chunk of the panel that stays in L1/L2 while every block of queries passes over it: common/attend_plan.h).
 * Per (chunk, block):
 *   S = Q K^T in register tiles of NB vectors x 16 keys (2 NB accumulators; 2 or 4 chains each below 4
 *   vectors), over keys from the first any vector sees to the last, DB dims per partial sum;
 *   per vector: common/softmax.h's rules (mask, soft cap, ALiBi) and online rescale of m, l;
 *   O = alpha * O + P V in register tiles of NB vectors x 16 dims (alpha folded into loading O).
 * The group's heads of a row are adjacent vectors, so they share every key and value load. Numerics are
 * fp32 throughout, like the portable set; only the summation order and FMA contraction differ (the
 * max |error| against an fp64 evaluation is the portable set's, tests/kernels/test_kernels/).
 *
 * Everything here carries the AVX2 target attribute: nothing may run before uattn_avx2_runs_here() says
 * yes (the library itself is built for baseline x86-64). */
#ifndef UATTN_AVX2_BODY_H
#define UATTN_AVX2_BODY_H

#include "common/attend_plan.h"
#include "common/panels.h"
#include "common/softmax.h"

/* ---- attend --------------------------------------------------------------------------------------------- */

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

/* o_i = alpha_i o_i + P V over keys [klo, khi) for NB vectors (o_i at o + i * D), over o's first E dims
 * (uattn_job_value_dim), 16 at a time, then 8 (masked in the last vector when E is not a multiple of 8). Each
 * o_i is read and written once per chunk (alpha folded into that read), and each value load serves NB
 * broadcasts. */
AVX2_INLINE void pv_tile(const int NB, float (*S)[KC], int32_t j0, int32_t klo, int32_t khi, const float *vp,
                         int32_t Dv, float *o, int32_t D, int32_t E, const float *alpha) {
  int32_t d = 0;
  const __m256i all = _mm256_set1_epi32(-1);
  for (; d + 16 <= E; d += 16) pv_part(NB, 2, S, j0, klo, khi, vp + d, Dv, o + d, D, alpha, all);
  for (; d < E; d += 8) pv_part(NB, 1, S, j0, klo, khi, vp + d, Dv, o + d, D, alpha, tail_mask(E - d));
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
  pv_tile(NB, S, j0, klo, khi, c->vp, c->Dv, job->o + (size_t)x0 * D, D, uattn_job_value_dim(job), alpha);
}

/* The job's vectors against its panel. D is the job's head dim and ROWS its rows (0: job->rows), constants
 * where the caller is specialized. */
AVX2_INLINE void avx2_attend_body(const uattn_panel_job *job, int32_t panel_keys, const int32_t D, const int32_t ROWS) {
  const int32_t rows = ROWS ? ROWS : job->rows, kmax = keys_seen(job, rows);
  if (kmax <= 0) return;
  const attend_ctx c = {job, align64c(job->keys), align64c(job->values), key_stride(panel_keys), value_stride(D)};
  ATTEND_BLOCKS(rows * job->group, kmax, attend_block, D, &c);
}

#endif
