/* The forward's tensors as the perf programs pass them: dense q, k, v and out beside the paged caches, with
 * no lse, no cross attention and out in the layer's dtype. */
#ifndef UATTN_PERF_TENSORS_H
#define UATTN_PERF_TENSORS_H

#include <stdint.h>

#include "uattn.h"

/* The tensors of one forward over caches of num_blocks blocks of block_size slots. */
static inline uattn_tensors perf_tensors(const void *q, const void *k, const void *v, void *key_cache,
                                         void *value_cache, int32_t num_blocks, int32_t block_size, void *out) {
  return (uattn_tensors){.q = q,
                         .k = k,
                         .v = v,
                         .key_cache = key_cache,
                         .value_cache = value_cache,
                         .num_blocks = num_blocks,
                         .block_size = block_size,
                         .out = out};
}

#endif
