/* The amx set's attend, in amx/tile.h's two forms (amx/set.c: the instructions over avx512bf16/body.h's zmm
 * form; amx/twin.c: the emulation over its twin form; amx/bucket.h: the instructions, the head dim constant).
 *
 * Panels: avx512bf16/body.h's, loaded by its load. Its key panel (pair p of key i at kp[p * P + i]) and its
 * value panel (key pair r, dim d at vp[r * Dv + d]) are the B operands of tdpbf16ps as they lie (a tile row:
 * 16 columns of bf16 pairs): K and V are packed once per panel and every query tile, of any head of the GQA
 * group, reads them with strided tile loads.
 *
 * A job's query vectors (its rows x group) are taken 32 at a time, two tile rows of a tile's M dimension
 * (16; the last block padded with zero rows), so that each K or V tile loaded feeds two tdpbf16ps; each
 * such block walks the keys it sees KC at a time:
 *   S = Q K^T   the block's queries rounded to bf16 unscaled (avx512bf16's rule), tdpbf16ps over 32 dims a
 *               step into 2 x 2 fp32 tiles of 16 vectors by 16 keys, stored to S;
 *   softmax     avx512bf16's bf16_softmax_row on each vector's row, with the same rules (mask, window, soft
 *               cap, ALiBi) and the scale applied to the fp32 scores; P into bf16 pairs;
 *   P V         the block's outputs, in fp32 in the job's o (a last partial block's in a padded copy),
 *               rescaled there by each row's factor, take tdpbf16ps over 32 keys a step, 32 dims at a time,
 *               over the keys the block sees.
 * The outputs, m and l are the job's, so a vector's result depends on its own row alone, as elsewhere.
 * What tiles do not fill goes to avx512bf16's attend on the same panels: jobs of fewer than 16 vectors
 * (decodes, short verifications), head dims that are not multiples of 32 or past AMX_MAX_DIM, and P kept in
 * fp32 (probs_fp32). Each call loads the tile configuration, since it is per thread and code between calls
 * may change it, and releases the tiles as it returns. */
#ifndef UATTN_AMX_BODY_H
#define UATTN_AMX_BODY_H

#include "amx/tile.h"
#include "avx512bf16/body.h"

enum {
  AMX_M = 16,           /* query vectors a tile */
  AMX_QB = 2 * AMX_M,   /* query vectors a block: two tile rows, so each K or V tile loaded feeds two tdpbf16ps */
  AMX_MAX_DIM = 512,    /* head dims the block's buffers hold */
  AMX_PP = KC / 2 + 16, /* a row of P's pairs, and the 16 past its end that a last P V step may read */
};

/* The tiles: 0 to 3 accumulators (2 x 2: query tile row by 16 keys or dims); 4, 5 the A operands (a query tile
 * row each); 6, 7 the B operands. */
static const amx_config amx_tile_config __attribute__((aligned(64))) = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

typedef struct amx_ctx {
  const uattn_panel_job *job;
  const uint32_t *kp, *vp;
  int32_t P, Dv;
  float (*S)[KC];         /* [AMX_QB][KC] scores, then P */
  uint32_t (*pp)[AMX_PP]; /* [AMX_QB][AMX_PP] P in bf16 pairs, finite everywhere (zeros at first) */
  uint32_t *qp;           /* [AMX_QB][D / 2] the block's queries in bf16 pairs */
} amx_ctx;

/* Vectors [x0, x0 + nb) of the job (their queries in c->qp, outputs at ob, D floats apart) against keys
 * [c0, c1). Each accumulator tile sees the same tdpbf16ps in the same order whether its block has one tile
 * row or two, so the second row only shares the operand loads. */
AMX_INLINE void amx_chunk(amx_tiles *t, const int32_t D, const amx_ctx *c, int32_t x0, int32_t nb, float *ob,
                          int32_t c0, int32_t c1) {
  const uattn_panel_job *job = c->job;
  vec_rule rule[AMX_QB];
  int32_t klo, khi;
  block_rules(job, x0, nb, c0, c1, rule, &klo, &khi);
  if (klo >= khi) return;
  const int32_t j0 = klo & ~15, j1 = (khi + 15) & ~15, P = c->P, Dv = c->Dv;
  const bool m2 = nb > AMX_M; /* the second tile row holds vectors */
  float(*S)[KC] = c->S;
  const size_t qs = 2 * (size_t)D, ss = sizeof(float) * KC, ps = sizeof(uint32_t) * AMX_PP, os = sizeof(float) * D;
  const uint32_t *q1 = c->qp + (size_t)AMX_M * (D / 2);
  for (int32_t j = j0; j < j1; j += 32) {
    const bool two = j + 16 < j1;
    amx_zero(t, 0);
    if (two) amx_zero(t, 1);
    if (m2) amx_zero(t, 2);
    if (m2 && two) amx_zero(t, 3);
    for (int32_t d = 0; d < D; d += 32) {
      const uint32_t *k = c->kp + (size_t)(d / 2) * P + j;
      amx_load(t, 4, c->qp + d / 2, qs);
      amx_load(t, 6, k, 4 * (size_t)P);
      if (m2) amx_load(t, 5, q1 + d / 2, qs);
      if (two) amx_load(t, 7, k + 16, 4 * (size_t)P);
      amx_dpbf16(t, 0, 4, 6);
      if (two) amx_dpbf16(t, 1, 4, 7);
      if (m2) amx_dpbf16(t, 2, 5, 6);
      if (m2 && two) amx_dpbf16(t, 3, 5, 7);
    }
    amx_store(t, 0, &S[0][j - j0], ss);
    if (two) amx_store(t, 1, &S[0][j + 16 - j0], ss);
    if (m2) amx_store(t, 2, &S[AMX_M][j - j0], ss);
    if (m2 && two) amx_store(t, 3, &S[AMX_M][j + 16 - j0], ss);
  }
  for (int i = 0; i < nb; i++) {
    const size_t x = (size_t)x0 + i;
    float alpha;
    if (rule[i].lo < rule[i].hi) {
      alpha = bf16_softmax_row(S[i], j0, j1, &rule[i], job, &job->m[x], &job->l[x], c->pp[i]);
    } else { /* this vector sees none of the chunk: o stays exactly as it is */
      alpha = 1.0f;
      memset(c->pp[i], 0, sizeof(uint32_t) * (size_t)(j1 - j0) / 2);
    }
    if (alpha != 1.0f) {
      float *o = ob + (size_t)i * D;
      const v16 a = v16_set1(alpha);
      for (int32_t d = 0; d < D; d += 16) v16_store(o + d, v16_mul(a, v16_load(o + d)));
    }
  }
  /* key pairs [klo / 2, (khi + 1) / 2), as avx512bf16's P V: values outside the keys the block sees may be
   * anything (an evicted window's), and 0 times NaN is NaN. A last step of fewer than 16 pairs takes its
   * values from vt, the pairs past its end zero (P past it is finite: pp's rows and their pad). */
  const int32_t r0 = klo / 2, r1 = (khi + 1) / 2, tail = (r1 - r0) % 16, rt = r1 - tail;
  _Alignas(64) uint32_t vt[16][32];
  if (tail) memset(vt[tail], 0, sizeof(uint32_t) * 32 * (size_t)(16 - tail));
  for (int32_t d = 0; d < D; d += 32) {
    float *o = ob + d, *o1 = ob + (size_t)AMX_M * D + d;
    amx_load(t, 0, o, os);
    amx_load(t, 1, o + 16, os);
    if (m2) amx_load(t, 2, o1, os);
    if (m2) amx_load(t, 3, o1 + 16, os);
    for (int32_t r = r0; r < r1; r += 16) {
      const uint32_t *v = c->vp + (size_t)r * Dv + d;
      size_t vs = 4 * (size_t)Dv;
      if (r == rt) {
        for (int k = 0; k < tail; k++) memcpy(vt[k], v + (size_t)k * Dv, sizeof vt[k]);
        v = vt[0], vs = sizeof vt[0];
      }
      amx_load(t, 4, &c->pp[0][r - j0 / 2], ps);
      amx_load(t, 6, v, vs);
      amx_load(t, 7, v + 16, vs);
      if (m2) amx_load(t, 5, &c->pp[AMX_M][r - j0 / 2], ps);
      amx_dpbf16(t, 0, 4, 6);
      amx_dpbf16(t, 1, 4, 7);
      if (m2) amx_dpbf16(t, 2, 5, 6);
      if (m2) amx_dpbf16(t, 3, 5, 7);
    }
    amx_store(t, 0, o, os);
    amx_store(t, 1, o + 16, os);
    if (m2) amx_store(t, 2, o1, os);
    if (m2) amx_store(t, 3, o1 + 16, os);
  }
}

/* Whether the amx attend takes the job (see the header comment); avx512bf16's attend takes the rest. */
static inline bool amx_takes(const uattn_panel_job *job, int32_t D) {
  return !job->probs_fp32 && D % 32 == 0 && D <= AMX_MAX_DIM && job->rows * job->group >= AMX_M;
}

/* The job's vectors against its panel; D constant where the caller is specialized. */
AMX_INLINE void amx_attend_body(const uattn_panel_job *job, int32_t panel_keys, const int32_t D) {
  if (!amx_takes(job, D)) {
    bf16_attend_body(job, panel_keys, D);
    return;
  }
  const int32_t kmax = keys_seen(job, job->rows), n = job->rows * job->group;
  if (kmax <= 0) return;
  _Alignas(64) float S[AMX_QB][KC];
  _Alignas(64) uint32_t pp[AMX_QB][AMX_PP];
  _Alignas(64) uint32_t qp[AMX_QB * AMX_MAX_DIM / 2];
  _Alignas(64) float ob[AMX_QB * AMX_MAX_DIM]; /* a last block's outputs, padded to two tile rows */
  memset(pp, 0, sizeof pp);
  const amx_ctx c = {job,
                     (const uint32_t *)align64c(job->keys),
                     (const uint32_t *)align64c(job->values),
                     key_stride(panel_keys),
                     value_stride(D),
                     S,
                     pp,
                     qp};
  amx_tiles t;
  amx_configure(&t, &amx_tile_config);
  for (int32_t x0 = 0; x0 < n; x0 += AMX_QB) {
    const int32_t nb = n - x0 < AMX_QB ? n - x0 : AMX_QB;
    /* a whole block's tiles read and write the job's outputs in place; a partial one's, ob's padded rows */
    float *o = nb == AMX_QB ? job->o + (size_t)x0 * D : ob;
    for (int i = 0; i < AMX_QB;
         i++) { /* the unscaled queries, rounded to bf16 (avx512bf16's rule); zero rows past nb */
      if (i < nb) {
        pairs_bf16(job->q + (size_t)(x0 + i) * D, D, qp + (size_t)i * (D / 2));
        if (o == ob) memcpy(ob + (size_t)i * D, job->o + (size_t)(x0 + i) * D, sizeof(float) * (size_t)D);
      } else {
        memset(qp + (size_t)i * (D / 2), 0, 2 * (size_t)D);
        memset(ob + (size_t)i * D, 0, sizeof(float) * (size_t)D);
      }
    }
    for (int32_t c0 = 0; c0 < kmax; c0 += KC) amx_chunk(&t, D, &c, x0, nb, o, c0, kmax - c0 < KC ? kmax : c0 + KC);
    if (o == ob) memcpy(job->o + (size_t)x0 * D, ob, sizeof(float) * (size_t)nb * (size_t)D);
  }
  amx_release(&t);
}

#endif
