/* Merging partial attention results: the building block of cascade and context-parallel attention. */
#include <math.h>
#include <string.h>

#include "internal.h"
#include "portable.h"

uattn_status uattn_merge_states(int32_t num_parts, const float *const *outs, const float *const *lses, int32_t rows,
                                int32_t heads, int32_t head_dim, float *out, float *lse) {
  uattn_clear_error();
  if (num_parts <= 0 || rows < 0 || heads <= 0 || head_dim <= 0 || head_dim > 4096)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                      "merge_states: num_parts (%d) and heads (%d) must be > 0, head_dim (%d) in 1..4096 and rows "
                      "(%d) >= 0",
                      num_parts, heads, head_dim, rows);
  UATTN_CHECK_PTR(outs, "outs");
  UATTN_CHECK_PTR(lses, "lses");
  UATTN_CHECK_PTR(out, "out");
  for (int32_t i = 0; i < num_parts; i++)
    if (!outs[i] || !lses[i])
      return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "merge_states: outs[%d] and lses[%d] must not be NULL", i, i);
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
                                  const float *const *sums, int32_t rows, int32_t heads, int32_t head_dim,
                                  float *out) {
  uattn_clear_error();
  if (num_parts <= 0 || num_parts > 64 || rows < 0 || heads <= 0 || head_dim <= 0 || head_dim > 4096)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                      "merge_partials: num_parts (%d) must be in 1..64, heads (%d) > 0, head_dim (%d) in 1..4096 "
                      "and rows (%d) >= 0",
                      num_parts, heads, head_dim, rows);
  UATTN_CHECK_PTR(outs, "outs");
  UATTN_CHECK_PTR(maxes, "maxes");
  UATTN_CHECK_PTR(sums, "sums");
  UATTN_CHECK_PTR(out, "out");
  for (int32_t i = 0; i < num_parts; i++)
    if (!outs[i] || !maxes[i] || !sums[i])
      return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "merge_partials: part %d has a NULL array", i);
  uattn_state parts[64];
  float row[4096];
  for (size_t x = 0; x < (size_t)rows * heads; x++) {
    for (int32_t i = 0; i < num_parts; i++) {
      parts[i].m = maxes[i][x];
      parts[i].l = sums[i][x];
      parts[i].o = (float *)outs[i] + x * head_dim; /* read only: uattn_seed_merge does not write parts */
    }
    uattn_seed_merge(parts, num_parts, -INFINITY, head_dim, row);
    memcpy(out + x * head_dim, row, sizeof(float) * (size_t)head_dim);
  }
  return UATTN_OK;
}
