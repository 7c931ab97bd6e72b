/* The argument checks that vLLM's batch helpers share (include/uattn_vllm.h: vLLM's v1
 * vllm/v1/attention/backends/utils.py and v0 vllm/attention/backends/utils.py, re-stated in C from their Python
 * semantics), apart so that decode_prefill_split.c and batch_utils.c check alike: every entry point validates
 * everything first and only then writes, so a failed call leaves its outputs as they were, and sums of int32
 * inputs are carried in int64 so that an overflow is reported, not wrapped. batch_checks.c holds the two checks
 * that are not inline. */
#ifndef UATTN_VLLM_BATCH_CHECKS_H
#define UATTN_VLLM_BATCH_CHECKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/internal.h"

static inline uattn_status check_count(int32_t n, const char *what) {
  if (n < 0) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "%s must be >= 0, got %d", what, n);
  return UATTN_OK;
}

typedef struct named_count {
  int32_t n;
  const char *what;
} named_count;

/* check_count on each {n, "name"} in turn; the first that fails is returned from the calling function. */
#define CHECK_COUNTS(...)                                                                                              \
  do {                                                                                                                 \
    const named_count counts_[] = {__VA_ARGS__};                                                                       \
    for (size_t i_ = 0; i_ < sizeof counts_ / sizeof counts_[0]; i_++) {                                               \
      uattn_status st_ = check_count(counts_[i_].n, counts_[i_].what);                                                 \
      if (st_ != UATTN_OK) return st_;                                                                                 \
    }                                                                                                                  \
  } while (0)

/* qsl has num_reqs + 1 entries, never decreases and (zero_start) starts at 0; the seeds index
 * query_start_loc[first] as a token count, which is only right from a zero start. */
uattn_status uattn_vllm_check_qsl(const int32_t *qsl, int32_t num_reqs, bool zero_start);

static inline int32_t query_len(const int32_t *qsl, int32_t r) { return qsl[r + 1] - qsl[r]; }

/* seq_lens[r] counts the request's keys, its query tokens included, so it is never shorter. */
uattn_status uattn_vllm_check_seq_lens(const int32_t *seq_lens, const int32_t *qsl, int32_t num_reqs);

static inline int32_t max_query_len(const int32_t *qsl, int32_t num_reqs) {
  int32_t m = 0;
  for (int32_t r = 0; r < num_reqs; r++) m = uattn_max_i32(m, query_len(qsl, r));
  return m;
}

static inline uattn_status capacity_error(const char *what, int64_t needed, int32_t capacity) {
  return uattn_fail(UATTN_ERR_CAPACITY, "%s needs capacity %lld, got %d", what, (long long)needed, capacity);
}

#endif /* UATTN_VLLM_BATCH_CHECKS_H */
