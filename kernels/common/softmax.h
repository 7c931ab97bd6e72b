/* The softmax rules every kernel applies to a query vector's scores, in the portable set's order: the mask
 * (visible count, window), the soft cap, ALiBi, then the online update of the running max m and sum l, whose
 * factor alpha rescales the output. */
#ifndef UATTN_COMMON_SOFTMAX_H
#define UATTN_COMMON_SOFTMAX_H

#include "common/vec8.h"

/* What one query vector of a block sees of the current chunk. */
typedef struct vec_rule {
  int32_t lo, hi; /* keys [lo, hi) of the panel; empty when lo >= hi */
  int32_t rel;    /* key_pos0 - query position: key j is at distance j + rel */
  float slope;    /* ALiBi, 0 = none */
} vec_rule;

/* softmax_row's first pass, shared with every 16-lane softmax: the rule (mask, soft cap, ALiBi) applied to the
 * scores S[j0, j1) of one vector, and their maximum. */
AVX2_INLINE float row_rules_max(float *s, int32_t j0, int32_t j1, const vec_rule *v, float cap) {
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i lo = _mm256_set1_epi32(v->lo - 1), hi = _mm256_set1_epi32(v->hi);
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  const bool rule = cap > 0.0f || v->slope != 0.0f;
  __m256 vmax = ninf;
  for (int32_t j = j0; j < j1; j += 8) {
    __m256 x = _mm256_load_ps(s + (j - j0));
    if (cap > 0.0f) { /* the portable order: s / cap, tanh, * cap */
      const __m256 c = _mm256_set1_ps(cap);
      x = _mm256_mul_ps(c, tanh8(_mm256_div_ps(x, c)));
    }
    if (v->slope != 0.0f) {
      const __m256 dist = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_set1_epi32(j + v->rel), iota));
      x = _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(v->slope), dist));
    }
    const bool cut = j < v->lo || j + 8 > v->hi;
    if (cut) {
      const __m256i jv = _mm256_add_epi32(_mm256_set1_epi32(j), iota);
      const __m256i in = _mm256_and_si256(_mm256_cmpgt_epi32(jv, lo), _mm256_cmpgt_epi32(hi, jv));
      x = _mm256_blendv_ps(ninf, x, _mm256_castsi256_ps(in));
    }
    if (cut || rule) _mm256_store_ps(s + (j - j0), x);
    vmax = _mm256_max_ps(vmax, x);
  }
  return hmax8(vmax);
}

/* A row's running max after a chunk whose max is block_max, and in *alpha the factor its o and l are rescaled
 * by: as the portable rescale, 1 when the max stays, 0 from an empty state. */
static inline float row_new_max(float block_max, float m_old, float *alpha) {
  const float m_new = block_max > m_old ? block_max : m_old;
  *alpha = m_new == m_old ? 1.0f : (m_old == -INFINITY ? 0.0f : expf(m_old - m_new));
  return m_new;
}

/* One vector's row of the tile: the score rule, then the online softmax. Turns S[j0, j1) into
 * P = e^(s - m_new) (0 where masked), updates m and l, and returns the factor o must be rescaled by. Only
 * the vectors of 8 scores that [lo, hi) cuts are masked, and scores are written back only where a rule
 * (mask, cap, slope) changed them: a row that sees its whole tile (all but the causal diagonal in a
 * prefill) is a max pass and an exp pass. */
AVX2_INLINE float softmax_row(float *s, int32_t j0, int32_t j1, const vec_rule *v, float cap, float *m, float *l) {
  float alpha;
  const float m_new = row_new_max(row_rules_max(s, j0, j1, v, cap), *m, &alpha);
  const __m256 mv = _mm256_set1_ps(m_new);
  __m256 sum = _mm256_setzero_ps();
  for (int32_t j = j0; j < j1; j += 8) {
    const __m256 p = exp8(_mm256_sub_ps(_mm256_load_ps(s + (j - j0)), mv));
    _mm256_store_ps(s + (j - j0), p);
    /* in_register: else GCC may keep the sum on the stack, a store-to-load chain through every step */
    sum = in_register(sum);
    sum = _mm256_add_ps(sum, p);
  }
  *l = *l * alpha + hsum8(sum);
  *m = m_new;
  return alpha;
}

/* The rules of query vectors [x0, x0 + nb) of the job for keys [c0, c1) of the panel, and the range of keys
 * any of them sees, [*klo, *khi) (empty when *klo >= *khi). Shared with the libxsmm body (xsmm.c). */
AVX2_INLINE void block_rules(const uattn_panel_job *job, int32_t x0, const int nb, int32_t c0, int32_t c1,
                             vec_rule *rule, int32_t *klo_out, int32_t *khi_out) {
  const int32_t G = job->group;
  int32_t klo = INT32_MAX, khi = INT32_MIN;
  /* vector x0 + i is head h of row r, counted along: a division per vector cost more than the rest */
  int32_t r = x0 / G, h = x0 - r * G;
  for (int i = 0; i < nb; i++) {
    int32_t lo = c0, hi = job->visible[r] < job->num_keys ? job->visible[r] : job->num_keys;
    if (hi > c1) hi = c1;
    if (job->window > 0) { /* keys at positions <= query position - window are outside */
      const int32_t first = job->query_pos[r] - job->window + 1 - job->key_pos0;
      if (first > lo) lo = first;
    }
    rule[i] = (vec_rule){lo, hi, job->key_pos0 - job->query_pos[r], job->alibi ? job->alibi[h] : 0.0f};
    if (lo < hi) {
      if (lo < klo) klo = lo;
      if (hi > khi) khi = hi;
    }
    if (++h == G) h = 0, r++;
  }
  *klo_out = klo, *khi_out = khi;
}

/* The scores of vectors [x0, x0 + nb) (row i at S + i * ld, columns [j0, j1)) to probabilities with
 * softmax_row, and alpha[i], the factor each o_i must be rescaled by. A vector that sees none of the chunk
 * keeps its state exactly: alpha 1 and a row of zeros. Shared with the libxsmm body (xsmm.c). */
AVX2_INLINE void block_softmax(const uattn_panel_job *job, int32_t x0, const int nb, const vec_rule *rule, float *S,
                               int32_t ld, int32_t j0, int32_t j1, float *alpha) {
  for (int i = 0; i < nb; i++) {
    const size_t x = (size_t)x0 + i;
    float *s = S + (size_t)i * ld;
    if (rule[i].lo < rule[i].hi) {
      alpha[i] = softmax_row(s, j0, j1, &rule[i], job->soft_cap, &job->m[x], &job->l[x]);
    } else { /* this vector sees none of the chunk: o stays exactly as it is */
      alpha[i] = 1.0f;
      memset(s, 0, sizeof(float) * (size_t)(j1 - j0));
    }
  }
}

#endif
