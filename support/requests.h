/* The uattn_step of a list of requests, as the step runners (support/step.c), the tests, fuzz_forward and
 * uattn-runtime-bench build it. A header of its own so that its users need not see support/step.h's `step`. */
#ifndef UATTN_SUPPORT_REQUESTS_H
#define UATTN_SUPPORT_REQUESTS_H

#include <stdint.h>

#include "uattn.h"

/* A step of num_reqs requests over these arrays, nothing optional (drafts, token ids, cross attention) set. */
uattn_step step_requests(int32_t num_reqs, const int32_t *num_computed, const int32_t *num_scheduled,
                         const int32_t *num_prompt, const int32_t *block_table, int32_t block_table_stride);

#endif
