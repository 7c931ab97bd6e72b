/* The decode kernels' softmax in 16 lanes (avx512's and avx512bf16's): common/softmax.h's rules and online
 * update on a call's S rows, or on one share's columns of them (wide_softmax_cols), with v16_exp (exp8's
 * bits). Include after common/vec16.h's decision (AVX512_VEC_ZMM or not). */
#ifndef UATTN_COMMON_SOFTMAX16_H
#define UATTN_COMMON_SOFTMAX16_H

#include "common/decode_shape.h"
#include "common/vec16.h"

/* The maximum of row s (columns [j0, j1), j0 and j1 multiples of 8 apart) after the rule v and the soft cap
 * (row_rules_max's, which masks the blocks of 8 that [lo, hi) cuts and writes back what a rule changed).
 * Without cap and slope only the cut blocks at the ends go through it; the whole blocks between take a
 * 16-lane max (a max is the same in any order), so a decode row takes half the max instructions. */
V16_INLINE float wide_row_max(float *s, int32_t j0, int32_t j1, const vec_rule *v, float cap) {
  const int32_t a = v->lo > j0 ? j0 + ((v->lo - j0 + 7) & ~7) : j0; /* the whole blocks: [a, b) */
  const int32_t b = v->hi < j1 ? j0 + ((v->hi - j0) & ~7) : j1;
  if (cap > 0.0f || v->slope != 0.0f || a >= b) return row_rules_max(s, j0, j1, v, cap);
  float mx = -INFINITY, x;
  if (a > j0 && (x = row_rules_max(s, j0, a, v, cap)) > mx) mx = x;
  if (b < j1 && (x = row_rules_max(s + (b - j0), b, j1, v, cap)) > mx) mx = x;
  v16 vmax = v16_set1(-INFINITY);
  int32_t j = a;
  for (; j + 16 <= b; j += 16) vmax = v16_max(vmax, v16_load(s + (j - j0)));
  if ((x = v16_hmax(vmax)) > mx) mx = x;
  if (j < b && (x = hmax8(_mm256_load_ps(s + (j - j0)))) > mx) mx = x;
  return mx;
}

/* One vector's S row (W floats from column j0; the keys [j0, j0 + W) a multiple of 8) to P, softmax_row's job
 * 16 lanes at a time (v16_exp: exp8's bits; l summed in another order): the rule, the max, then P = e^(s -
 * m_new) in one pass, in place; m and l updated, the factor o must be rescaled by returned. A last 8 keys go
 * through the same 16 lanes, padded with -inf (P 0, which adds nothing to l). */
V16_INLINE float wide_decode_row(float *s, int32_t j0, int32_t W, const vec_rule *v, float cap, float *m, float *l) {
  float alpha;
  const float m_new = row_new_max(wide_row_max(s, j0, j0 + W, v, cap), *m, &alpha);
  const v16 mv = v16_set1(m_new);
  v16 sum = v16_zero();
  int32_t j = 0;
  for (; j + 16 <= W; j += 16) {
    const v16 p = v16_exp(v16_sub(v16_load(s + j), mv));
    sum = v16_add(sum, p);
    v16_store(s + j, p);
  }
  if (j < W) {
    _Alignas(64) float t[16];
    _mm256_store_ps(t, _mm256_load_ps(s + j)), _mm256_store_ps(t + 8, _mm256_set1_ps(-INFINITY));
    const v16 p = v16_exp(v16_sub(v16_load(t), mv));
    sum = v16_add(sum, p);
    v16_store(t, p), _mm256_store_ps(s + j, _mm256_load_ps(t));
  }
  *l = *l * alpha + v16_hsum(sum);
  *m = m_new;
  return alpha;
}

/* o *= alpha, D floats (an output whose maximum grew). */
V16_INLINE void wide_rescale(float *o, float alpha, const int32_t D) {
  for (int32_t d = 0; d < D; d += 16) v16_store(o + d, v16_mul(v16_set1(alpha), v16_load(o + d)));
}

/* The softmax of head g's block b of vectors (rules rule, head 0's: the slopes are head g's) over one
 * share's columns [c0, c1) (scores in the S rows from Sb, column c0 at c0 - j0), a step of the online
 * softmax: wide_decode_row's rules, P in place of the scores, each output rescaled by its
 * alpha. [*plo, *phi): the keys of the share any vector sees (empty: none). A share of Z columns (the walk's
 * share size, a constant multiple of 16) that every vector sees whole, without cap or slopes (all but a
 * call's first and last), takes wide_decode_row's operations on them without the rules' branches: the same
 * bits. */
V16_INLINE void wide_softmax_cols(const uattn_panel_job *job, const decode_shape *s, int32_t g, int32_t b,
                                  const vec_rule *rule, float *Sb, int32_t c0, int32_t c1, int32_t *plo, int32_t *phi,
                                  const int32_t Z, const int32_t D) {
  const int nb = s->nb[b];
  const size_t st0 = (size_t)g * s->hv + (size_t)s->x0[b]; /* the block's first state */
  float *o0 = job->o + (size_t)g * s->hq + (size_t)s->x0[b] * D;
  bool whole = c1 - c0 == Z && !(job->soft_cap > 0.0f) && !job->alibi;
  for (int i = 0; whole && i < nb; i++) whole = rule[i].lo <= c0 && rule[i].hi >= c1;
  if (whole) {
    *plo = c0, *phi = c1;
    for (int i = 0; i < nb; i++) {
      float *row = Sb + (size_t)i * s->W + (c0 - s->j0), *m = &job->m[st0 + i], *l = &job->l[st0 + i];
      v16 mx = v16_load(row);
      for (int32_t j = 16; j < Z; j += 16) mx = v16_max(mx, v16_load(row + j));
      float alpha;
      const float m_new = row_new_max(v16_hmax(mx), *m, &alpha);
      const v16 mv = v16_set1(m_new);
      v16 sum = v16_exp(v16_sub(v16_load(row), mv));
      v16_store(row, sum);
      for (int32_t j = 16; j < Z; j += 16) {
        const v16 p = v16_exp(v16_sub(v16_load(row + j), mv));
        sum = v16_add(sum, p);
        v16_store(row + j, p);
      }
      *l = *l * alpha + v16_hsum(sum);
      *m = m_new;
      if (alpha != 1.0f) wide_rescale(o0 + (size_t)i * D, alpha, D);
    }
    return;
  }
  *plo = INT32_MAX, *phi = INT32_MIN;
  for (int i = 0; i < nb; i++) {
    float *pp = Sb + (size_t)i * s->W + (c0 - s->j0);
    vec_rule r = rule[i];
    if (r.lo < c0) r.lo = c0;
    if (r.hi > c1) r.hi = c1;
    if (r.lo >= r.hi) { /* this vector sees none of the tile: P 0, its state as it is */
      memset(pp, 0, sizeof(float) * (size_t)(c1 - c0));
      continue;
    }
    const size_t x = (size_t)s->x0[b] + (size_t)i;
    if (job->alibi) r.slope = job->alibi[(size_t)g * job->group + x % (size_t)job->group];
    const float alpha = wide_decode_row(pp, c0, c1 - c0, &r, job->soft_cap, &job->m[st0 + i], &job->l[st0 + i]);
    if (alpha != 1.0f) wide_rescale(o0 + (size_t)i * D, alpha, D);
    if (r.lo < *plo) *plo = r.lo;
    if (r.hi > *phi) *phi = r.hi;
  }
}

#endif
