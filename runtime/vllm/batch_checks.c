/* The checks of a batch's query_start_loc and seq_lens that vLLM's batch helpers share (batch_checks.h);
 * apart from the helpers so that both files that hold them call one definition. */
#include "vllm/batch_checks.h"

uattn_status uattn_vllm_check_qsl(const int32_t *qsl, int32_t num_reqs, bool zero_start) {
  UATTN_CHECK_PTR(qsl, "query_start_loc");
  if (zero_start && qsl[0] != 0)
    return uattn_fail(UATTN_ERR_INCONSISTENT, "query_start_loc[0] must be 0, got %d", qsl[0]);
  if (!zero_start && qsl[0] < 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "query_start_loc[0] must be >= 0, got %d", qsl[0]);
  for (int32_t r = 0; r < num_reqs; r++) {
    if (qsl[r + 1] < qsl[r])
      return uattn_fail(UATTN_ERR_INCONSISTENT,
                        "query_start_loc must not decrease: query_start_loc[%d] = %d < query_start_loc[%d] = %d", r + 1,
                        qsl[r + 1], r, qsl[r]);
  }
  return UATTN_OK;
}

uattn_status uattn_vllm_check_seq_lens(const int32_t *seq_lens, const int32_t *qsl, int32_t num_reqs) {
  if (num_reqs > 0) UATTN_CHECK_PTR(seq_lens, "seq_lens");
  for (int32_t r = 0; r < num_reqs; r++) {
    if (seq_lens[r] < query_len(qsl, r))
      return uattn_fail(UATTN_ERR_INCONSISTENT, "seq_lens[%d] = %d is shorter than request %d's query length %d", r,
                        seq_lens[r], r, query_len(qsl, r));
  }
  return UATTN_OK;
}
