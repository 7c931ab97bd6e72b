/* The portable kernel set (portable.h). */
#include "portable/portable.h"

#include <math.h>
#include <string.h>

#include "convert.h"

float uattn_dot(const float *a, const float *b, int32_t n) {
  /* eight independent sums: vectorizable without -ffast-math, and the same order on every build */
  float s[8] = {0};
  int32_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) s[k] += a[i + k] * b[i + k];
  for (; i < n; i++) s[i & 7] += a[i] * b[i];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

void uattn_attend_panel(const float *q, const float *keys, const float *values, int32_t head_dim, int32_t lo,
                        int32_t hi, int32_t key_pos0, int32_t query_pos, const uattn_score_rule *rule, float *scores,
                        uattn_state *st) {
  if (rule->window > 0) { /* keys at positions <= query_pos - window are outside */
    const int32_t first = query_pos - rule->window + 1 - key_pos0;
    if (first > lo) lo = first;
  }
  if (lo >= hi) return;
  float block_max = -INFINITY;
  for (int32_t i = lo; i < hi; i++) {
    float s = uattn_dot(q, keys + (int64_t)i * head_dim, head_dim);
    if (rule->soft_cap > 0.0f) s = rule->soft_cap * tanhf(s / rule->soft_cap);
    if (rule->alibi_slope != 0.0f) s += rule->alibi_slope * (float)(key_pos0 + i - query_pos);
    scores[i - lo] = s;
    if (s > block_max) block_max = s;
  }
  if (block_max > st->m) uattn_state_rescale(st, block_max, head_dim);
  for (int32_t i = lo; i < hi; i++) {
    const float p = expf(scores[i - lo] - st->m);
    st->l += p;
    const float *v = values + (int64_t)i * head_dim;
    for (int32_t d = 0; d < head_dim; d++) st->o[d] += p * v[d];
  }
}

void uattn_attend_panel_rows(const uattn_panel_job *j) {
  const int32_t D = j->head_dim;
  for (int32_t r = 0; r < j->rows; r++) {
    const int32_t hi = j->visible[r] < j->num_keys ? j->visible[r] : j->num_keys;
    if (hi <= 0) continue;
    for (int32_t h = 0; h < j->group; h++) {
      const size_t x = (size_t)r * j->group + h;
      uattn_state st = {j->m[x], j->l[x], j->o + x * D};
      const uattn_score_rule rule = {j->soft_cap, j->alibi ? j->alibi[h] : 0.0f, j->window};
      uattn_attend_panel(j->q + x * D, j->keys, j->values, D, 0, hi, j->key_pos0, j->query_pos[r], &rule, j->scores,
                         &st);
      j->m[x] = st.m;
      j->l[x] = st.l;
    }
  }
}

/* ---- the portable kernel set --------------------------------------------------------------------------- */

static void portable_load(uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride, int32_t count,
                          int32_t head_dim, int32_t panel_keys, float *keys, float *values) {
  (void)panel_keys;
  const size_t esz = uattn_dtype_size(dtype);
  for (int32_t i = 0; i < count; i++) {
    uattn_widen(dtype, (const char *)k_src + (size_t)i * stride * esz, keys + (size_t)i * head_dim, (size_t)head_dim);
    uattn_widen(dtype, (const char *)v_src + (size_t)i * stride * esz, values + (size_t)i * head_dim, (size_t)head_dim);
  }
}

static void portable_attend(const uattn_panel_job *job, int32_t panel_keys) {
  (void)panel_keys;
  uattn_attend_panel_rows(job);
}

static size_t portable_panel_floats(int32_t panel_keys, int32_t head_dim) { return (size_t)panel_keys * head_dim; }

const uattn_kernels uattn_kernels_portable = {.name = "portable",
                                              .load = portable_load,
                                              .attend = {portable_attend, portable_attend, portable_attend},
                                              .panel_floats = portable_panel_floats,
                                              .caps = UATTN_CAPS_RECORD(PORTABLE_CAPS)};
