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
 *   softmax     avx512bf16's rows (bf16_row_max, bf16_row_exp: its rules, the weights as 2^(s c - m log2 e)
 *               from one FMA), with the online rescale; P into bf16 pairs;
 *   P V         the block's outputs, in fp32 in the job's o (a last partial block's in a padded copy),
 *               rescaled there by each row's factor, take tdpbf16ps over 32 keys a step, 32 dims at a time,
 *               over the keys the block sees and the dims the job keeps (uattn_job_value_dim).
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
  AMX_MAX_DIM = 576,    /* head dims the block's buffers hold: up to MLA's 576-dim latent */
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
  int32_t P, Dv, E;       /* E: the dims of o that P V computes, uattn_job_value_dim rounded up to a tile's 32 */
  float (*S)[KC];         /* [AMX_QB][KC] scores */
  uint32_t (*pp)[AMX_PP]; /* [AMX_QB][AMX_PP] P in bf16 pairs, finite everywhere (zeros at first) */
} amx_ctx;

/* One step of the walk: a block of query vectors [x0, x0 + nb) (their queries in qp, outputs at o, D floats
 * apart) against the keys [c0, c1) of a chunk, of which the block sees [klo, khi). */
typedef struct amx_step {
  int32_t x0, nb, c0, c1, klo, khi;
  const uint32_t *qp;
  float *o;
  vec_rule rule[AMX_QB];
} amx_step;

/* S = Q K^T of the step's block and chunk, over the columns [j0, j1) of whole 16s that hold its keys. Each
 * accumulator tile sees the same tdpbf16ps in the same order whether its block has one tile row or two, so
 * the second row only shares the operand loads. */
AMX_INLINE void amx_scores(amx_tiles *t, const int32_t D, const amx_ctx *c, const amx_step *s) {
  const int32_t j0 = s->klo & ~15, j1 = (s->khi + 15) & ~15, P = c->P;
  const bool m2 = s->nb > AMX_M; /* the second tile row holds vectors */
  float(*S)[KC] = c->S;
  const size_t qs = 2 * (size_t)D, ss = sizeof(float) * KC;
  const uint32_t *q1 = s->qp + (size_t)AMX_M * (D / 2);
  for (int32_t j = j0; j < j1; j += 32) {
    const bool two = j + 16 < j1;
    amx_zero(t, 0);
    if (two) amx_zero(t, 1);
    if (m2) amx_zero(t, 2);
    if (m2 && two) amx_zero(t, 3);
    for (int32_t d = 0; d < D; d += 32) {
      const uint32_t *k = c->kp + (size_t)(d / 2) * P + j;
      amx_load(t, 4, s->qp + d / 2, qs);
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
}

/* The step's scores to P in c->pp, its vectors' m and l updated and their outputs rescaled: avx512bf16's rows
 * (bf16_row_max, bf16_row_exp), in passes (maxima, then exponentials, then rescales) so that their chains
 * overlap. */
AMX_INLINE void amx_softmax(const int32_t D, const amx_ctx *c, const amx_step *s) {
  const uattn_panel_job *job = c->job;
  const int32_t j0 = s->klo & ~15, j1 = (s->khi + 15) & ~15;
  float bmax[AMX_QB], alpha[AMX_QB];
  bool plain[AMX_QB];
  for (int i = 0; i < s->nb; i++)
    if (s->rule[i].lo < s->rule[i].hi) bmax[i] = bf16_row_max(c->S[i], j0, j1, &s->rule[i], job, &plain[i]);
  for (int i = 0; i < s->nb; i++) {
    const size_t x = (size_t)s->x0 + i;
    if (s->rule[i].lo < s->rule[i].hi) {
      const float m_new = row_new_max(bmax[i], job->m[x], &alpha[i]);
      job->l[x] = job->l[x] * alpha[i] + bf16_row_exp(c->S[i], j0, j1, &s->rule[i], plain[i], job, m_new, c->pp[i]);
      job->m[x] = m_new;
    } else { /* this vector sees none of the chunk: o stays exactly as it is */
      alpha[i] = 1.0f;
      memset(c->pp[i], 0, sizeof(uint32_t) * (size_t)(j1 - j0) / 2);
    }
  }
  for (int i = 0; i < s->nb; i++)
    if (alpha[i] != 1.0f) {
      float *o = s->o + (size_t)i * D;
      const v16 a = v16_set1(alpha[i]);
      for (int32_t d = 0; d < c->E; d += 16) v16_store(o + d, v16_mul(a, v16_load(o + d)));
    }
}

/* o += P V over key pairs [klo / 2, (khi + 1) / 2), as avx512bf16's P V: values outside the keys the block sees
 * may be anything (an evicted window's), and 0 times NaN is NaN. A last step of fewer than 16 pairs takes its
 * values from vt, the pairs past its end zero (P past it is finite: pp's rows and their pad). */
AMX_INLINE void amx_values(amx_tiles *t, const int32_t D, const amx_ctx *c, const amx_step *s) {
  const int32_t j0 = s->klo & ~15, Dv = c->Dv;
  const bool m2 = s->nb > AMX_M;
  const size_t ps = sizeof(uint32_t) * AMX_PP, os = sizeof(float) * D;
  const int32_t r0 = s->klo / 2, r1 = (s->khi + 1) / 2, tail = (r1 - r0) % 16, rt = r1 - tail;
  _Alignas(64) uint32_t vt[16][32];
  if (tail) memset(vt[tail], 0, sizeof(uint32_t) * 32 * (size_t)(16 - tail));
  for (int32_t d = 0; d < c->E; d += 32) {
    float *o = s->o + d, *o1 = s->o + (size_t)AMX_M * D + d;
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

/* The walk's state: the job's blocks of vectors in order, each over its chunks in order. */
typedef struct amx_walk {
  int32_t n, kmax, x0, c0; /* the next step's block and chunk */
  uint32_t *qp;            /* the block's queries in bf16 pairs */
  float *ob;               /* a last partial block's outputs, padded to two tile rows */
} amx_walk;

/* The walk's next step that sees keys into *s (its block's queries and outputs ready when it is the block's
 * first), false when there is none. */
AMX_INLINE bool amx_next(const int32_t D, const uattn_panel_job *job, amx_walk *w, amx_step *s) {
  for (;;) {
    if (w->x0 >= w->n) return false;
    if (w->c0 == 0) { /* a new block: its queries, rounded to bf16 (avx512bf16's rule), zero rows past it */
      const int32_t nb = w->n - w->x0 < AMX_QB ? w->n - w->x0 : AMX_QB;
      uint32_t *qp = w->qp;
      float *o = nb == AMX_QB ? job->o + (size_t)w->x0 * D : w->ob;
      for (int i = 0; i < AMX_QB; i++) {
        if (i < nb) {
          pairs_bf16(job->q + (size_t)(w->x0 + i) * D, D, qp + (size_t)i * (D / 2));
          if (o == w->ob) memcpy(w->ob + (size_t)i * D, job->o + (size_t)(w->x0 + i) * D, sizeof(float) * (size_t)D);
        } else {
          memset(qp + (size_t)i * (D / 2), 0, 2 * (size_t)D);
          memset(w->ob + (size_t)i * D, 0, sizeof(float) * (size_t)D);
        }
      }
    }
    s->x0 = w->x0, s->nb = w->n - w->x0 < AMX_QB ? w->n - w->x0 : AMX_QB;
    s->c0 = w->c0, s->c1 = w->kmax - w->c0 < KC ? w->kmax : w->c0 + KC;
    s->qp = w->qp;
    s->o = s->nb == AMX_QB ? job->o + (size_t)w->x0 * D : w->ob;
    w->c0 = s->c1;
    if (w->c0 >= w->kmax) w->c0 = 0, w->x0 += AMX_QB;
    block_rules(job, s->x0, s->nb, s->c0, s->c1, s->rule, &s->klo, &s->khi);
    if (s->klo < s->khi) return true;
  }
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
  _Alignas(64) float ob[AMX_QB * AMX_MAX_DIM];
  memset(pp, 0, sizeof pp);
  const amx_ctx c = {job,
                     (const uint32_t *)align64c(job->keys),
                     (const uint32_t *)align64c(job->values),
                     key_stride(panel_keys),
                     value_stride(D),
                     (uattn_job_value_dim(job) + 31) & ~31,
                     S,
                     pp};
  amx_walk w = {n, kmax, 0, 0, qp, ob};
  amx_step s;
  amx_tiles t;
  amx_configure(&t, &amx_tile_config);
  while (amx_next(D, job, &w, &s)) {
    amx_scores(&t, D, &c, &s);
    amx_softmax(D, &c, &s);
    amx_values(&t, D, &c, &s);
  }
  if (n % AMX_QB) /* the last block's outputs, from its padded copy */
    memcpy(job->o + (size_t)(n - n % AMX_QB) * D, ob, sizeof(float) * (size_t)(n % AMX_QB) * (size_t)D);
  amx_release(&t);
}

#endif
