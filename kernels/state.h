/* The partial softmax state of one (row, head), the seed's triplet, and the two operations every kernel and
 * the forward's merges share: rescaling to a larger max, and adding one partial into another. */
#ifndef UATTN_STATE_H
#define UATTN_STATE_H

#include <math.h>
#include <stdint.h>

/* o is unnormalized: sum_j e^(s_j - m) v_j. */
typedef struct uattn_state {
  float m;  /* running max of the scores (-inf while empty) */
  float l;  /* sum_j e^(s_j - m) */
  float *o; /* [head_dim] */
} uattn_state;

static inline void uattn_state_reset(uattn_state *st, int32_t head_dim) {
  st->m = -INFINITY;
  st->l = 0.0f;
  for (int32_t d = 0; d < head_dim; d++) st->o[d] = 0.0f;
}

/* Rescales a state by e^(old max - new max) so it can take keys with a larger max. */
static inline void uattn_state_rescale(uattn_state *st, float new_m, int32_t head_dim) {
  if (st->m == new_m) return;
  const float a = st->m == -INFINITY ? 0.0f : expf(st->m - new_m);
  st->l *= a;
  for (int32_t d = 0; d < head_dim; d++) st->o[d] *= a;
  st->m = new_m;
}

/* Adds partial b into a (the seed's rescale merge of two partials). */
static inline void uattn_state_merge(uattn_state *a, const uattn_state *b, int32_t head_dim) {
  if (b->m == -INFINITY) return;
  if (b->m > a->m) uattn_state_rescale(a, b->m, head_dim);
  const float f = expf(b->m - a->m);
  a->l += b->l * f;
  for (int32_t d = 0; d < head_dim; d++) a->o[d] += b->o[d] * f;
}

#endif
