/* The forward's merges of partial states (merge.h). */
#include "attention/merge.h"
#include "convert.h"

#include <float.h>
#include <math.h>

UATTN_ROW_CLONES float uattn_merge_parts(const uattn_state *parts, int32_t num_parts, float sink, int32_t head_dim,
                                         float *out) {
  float M = -FLT_MAX;
  for (int32_t k = 0; k < num_parts; k++) {
    const float m = parts[k].m < -FLT_MAX ? -FLT_MAX : parts[k].m;
    if (m > M) M = m;
  }
  if (sink > M) M = sink;
  float sum = 0.0f;
  for (int32_t d = 0; d < head_dim; d++) out[d] = 0.0f;
  for (int32_t k = 0; k < num_parts; k++) {
    const float m = parts[k].m < -FLT_MAX ? -FLT_MAX : parts[k].m;
    const float a = expf(m - M);
    sum += parts[k].l * a;
    for (int32_t d = 0; d < head_dim; d++) out[d] += parts[k].o[d] * a;
  }
  if (sink > -INFINITY) sum += expf(sink - M);
  const float denom = sum > FLT_MIN ? sum : FLT_MIN;
  for (int32_t d = 0; d < head_dim; d++) out[d] /= denom;
  return sum > 0.0f ? M + logf(sum) : -INFINITY;
}
