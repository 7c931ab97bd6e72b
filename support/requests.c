/* step_requests (requests.h): the one place a list of requests becomes a uattn_step outside the engines. */
#include "support/requests.h"

#include <string.h>

uattn_step step_requests(int32_t num_reqs, const int32_t *num_computed, const int32_t *num_scheduled,
                         const int32_t *num_prompt, const int32_t *block_table, int32_t block_table_stride) {
  uattn_step b;
  memset(&b, 0, sizeof b);
  b.num_reqs = num_reqs;
  b.num_computed = num_computed;
  b.num_scheduled = num_scheduled;
  b.num_prompt = num_prompt;
  b.block_table = block_table;
  b.block_table_stride = block_table_stride;
  return b;
}
