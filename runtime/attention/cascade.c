/* Merging partial attention results: the building block of cascade and context-parallel attention. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/internal.h"
#include "attention/merge.h"

/* Each part's array: not NULL and aligned for floats. */
static uattn_status check_parts(int32_t num_parts, const float *const *arrays, const char *name) {
  for (int32_t i = 0; i < num_parts; i++) {
    char what[32];
    snprintf(what, sizeof what, "%s[%d]", name, i);
    UATTN_CHECK_PTR(arrays[i], what);
  }
  return UATTN_OK;
}

/* rows x heads x head_dim floats must fit a size_t: the loops index them so, and no array can be larger. */
static uattn_status check_size(int32_t rows, int32_t heads, int32_t head_dim) {
  size_t bytes;
  if (__builtin_mul_overflow((size_t)rows * (size_t)heads, (size_t)head_dim * sizeof(float), &bytes))
    return uattn_fail(UATTN_ERR_OVERFLOW, "rows (%d) x heads (%d) x head_dim (%d) floats overflow a size_t", rows,
                      heads, head_dim);
  return UATTN_OK;
}

/* The arrays of one input of a merge: the per-part array of pointers, and its name for messages. */
typedef struct merge_input {
  const float *const *arrays;
  const char *name;
} merge_input;

/* The checks both merges make once their dimensions are valid, in this order: the size, each input's array
 * of pointers, out, the optional lse, then each input's parts. */
static uattn_status check_merge_arrays(int32_t num_parts, int32_t rows, int32_t heads, int32_t head_dim,
                                       const merge_input *inputs, int num_inputs, const float *out, const float *lse) {
  uattn_status st;
  if ((st = check_size(rows, heads, head_dim))) return st;
  for (int i = 0; i < num_inputs; i++) UATTN_CHECK_PTR(inputs[i].arrays, inputs[i].name);
  UATTN_CHECK_PTR(out, "out");
  UATTN_CHECK_ALIGNED(lse, "lse");
  for (int i = 0; i < num_inputs; i++)
    if ((st = check_parts(num_parts, inputs[i].arrays, inputs[i].name))) return st;
  return UATTN_OK;
}

uattn_status uattn_merge_states(int32_t num_parts, const float *const *outs, const float *const *lses, int32_t rows,
                                int32_t heads, int32_t head_dim, float *out, float *lse) {
  uattn_clear_error();
  if (num_parts <= 0 || rows < 0 || heads <= 0 || head_dim <= 0 || head_dim > 4096)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                      "merge_states: num_parts (%d) and heads (%d) must be > 0, head_dim (%d) in 1..4096 and rows "
                      "(%d) >= 0",
                      num_parts, heads, head_dim, rows);
  const merge_input inputs[] = {{outs, "outs"}, {lses, "lses"}};
  uattn_status st = check_merge_arrays(num_parts, rows, heads, head_dim, inputs, 2, out, lse);
  if (st != UATTN_OK) return st;
  for (size_t x = 0; x < (size_t)rows * heads; x++) {
    float M = -INFINITY;
    for (int32_t i = 0; i < num_parts; i++)
      if (lses[i][x] > M) M = lses[i][x];
    float acc[4096], sum = 0.0f;
    for (int32_t d = 0; d < head_dim; d++) acc[d] = 0.0f;
    for (int32_t i = 0; i < num_parts; i++) {
      const float wi = M == -INFINITY ? 0.0f : expf(lses[i][x] - M);
      sum += wi;
      for (int32_t d = 0; d < head_dim; d++) acc[d] += wi * outs[i][x * head_dim + d];
    }
    for (int32_t d = 0; d < head_dim; d++) out[x * head_dim + d] = sum > 0.0f ? acc[d] / sum : 0.0f;
    if (lse) lse[x] = sum > 0.0f ? M + logf(sum) : -INFINITY;
  }
  return UATTN_OK;
}

uattn_status uattn_merge_partials(int32_t num_parts, const float *const *outs, const float *const *maxes,
                                  const float *const *sums, int32_t rows, int32_t heads, int32_t head_dim, float *out) {
  uattn_clear_error();
  if (num_parts <= 0 || num_parts > 64 || rows < 0 || heads <= 0 || head_dim <= 0 || head_dim > 4096)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                      "merge_partials: num_parts (%d) must be in 1..64, heads (%d) > 0, head_dim (%d) in 1..4096 "
                      "and rows (%d) >= 0",
                      num_parts, heads, head_dim, rows);
  const merge_input inputs[] = {{outs, "outs"}, {maxes, "maxes"}, {sums, "sums"}};
  uattn_status st = check_merge_arrays(num_parts, rows, heads, head_dim, inputs, 3, out, NULL);
  if (st != UATTN_OK) return st;
  uattn_state parts[64];
  float row[4096];
  for (size_t x = 0; x < (size_t)rows * heads; x++) {
    for (int32_t i = 0; i < num_parts; i++) {
      parts[i].m = maxes[i][x];
      parts[i].l = sums[i][x];
      parts[i].o = (float *)outs[i] + x * head_dim; /* read only: uattn_merge_parts does not write parts */
    }
    uattn_merge_parts(parts, num_parts, -INFINITY, head_dim, row);
    memcpy(out + x * head_dim, row, sizeof(float) * (size_t)head_dim);
  }
  return UATTN_OK;
}
