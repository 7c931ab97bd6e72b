/* Random valid unified batches for property tests: decodes, spec decode with placeholders, whole and
 * chunked prompts, prefix caching, and a block-aligned prefix shared by several requests. The block table
 * is valid by construction: a block id is at one position only, and blocks written this step are private
 * to their request; entries past a request's length are -1, so reading one is caught. */
#ifndef UATTN_TEST_RANDOM_BATCH_H
#define UATTN_TEST_RANDOM_BATCH_H

#include <string.h>

#include "common/support.h"
#include "support/requests.h"

#define RB_MAX_REQS 16
#define RB_MAX_TOKENS 512
#define RB_MAX_LEN 1024
#define RB_MAX_BLOCKS (RB_MAX_REQS * RB_MAX_LEN + 64)
#define RB_MAX_DRAFTS 8

typedef struct rb_params {
  int32_t block_size;
  int32_t num_blocks;
  int32_t max_reqs;
  double share_prob; /* chance a request joins the shared prefix */
} rb_params;

typedef struct rb_batch {
  int32_t num_reqs, stride;
  int32_t num_computed[RB_MAX_REQS], num_scheduled[RB_MAX_REQS], num_prompt[RB_MAX_REQS];
  int32_t block_table[RB_MAX_REQS * RB_MAX_LEN];
  int32_t draft_tokens[RB_MAX_REQS * RB_MAX_DRAFTS], draft_offsets[RB_MAX_REQS + 1];
  int32_t token_ids[RB_MAX_REQS * RB_MAX_LEN];
  bool has_drafts, has_ids;
} rb_batch;

static inline rb_params rb_random_params(test_rng *rng) {
  static const int32_t sizes[] = {1, 2, 4, 8, 16, 16, 32, 64, 128, 256};
  rb_params p;
  p.block_size = sizes[test_rng_range(rng, 0, 9)];
  p.num_blocks = RB_MAX_BLOCKS;
  p.max_reqs = test_rng_range(rng, 1, RB_MAX_REQS);
  p.share_prob = test_rng_unit(rng);
  return p;
}

/* Hands out distinct block ids in random order. */
typedef struct rb_pool {
  int32_t ids[RB_MAX_BLOCKS];
  int32_t next, size;
} rb_pool;

static inline void rb_pool_init(rb_pool *pool, test_rng *rng, int32_t num_blocks) {
  pool->size = num_blocks < RB_MAX_BLOCKS ? num_blocks : RB_MAX_BLOCKS;
  for (int32_t i = 0; i < pool->size; i++) pool->ids[i] = i;
  for (int32_t i = pool->size - 1; i > 0; i--) {
    int32_t j = test_rng_range(rng, 0, i), t = pool->ids[i];
    pool->ids[i] = pool->ids[j];
    pool->ids[j] = t;
  }
  pool->next = 0;
}

static inline void rb_generate(test_rng *rng, const rb_params *p, rb_batch *b) {
  static rb_pool pool; /* large: kept off the stack */
  memset(b, 0, sizeof *b);
  const int32_t bs = p->block_size;
  b->stride = (RB_MAX_LEN + bs - 1) / bs;
  rb_pool_init(&pool, rng, p->num_blocks);
  /* a block-aligned prefix, already computed, shared by the requests that join it */
  const int32_t prefix_blocks = test_rng_range(rng, 0, (RB_MAX_LEN / 2) / bs);
  int32_t prefix_ids[RB_MAX_LEN];
  for (int32_t i = 0; i < prefix_blocks; i++) prefix_ids[i] = pool.ids[pool.next++];
  b->has_drafts = test_rng_unit(rng) < 0.5;
  b->has_ids = test_rng_unit(rng) < 0.5;
  int32_t tokens = 0, drafts = 0;
  b->draft_offsets[0] = 0;
  for (int32_t r = 0; r < p->max_reqs && tokens < RB_MAX_TOKENS; r++) {
    const bool shares = prefix_blocks > 0 && test_rng_unit(rng) < p->share_prob;
    const int32_t hit = shares ? prefix_blocks * bs : 0; /* keys already cached from the prefix */
    const int32_t budget = RB_MAX_TOKENS - tokens;
    int32_t nc, ns, np, ndraft = 0;
    switch (test_rng_range(rng, 0, 4)) {
    case 0: /* decode */
    case 1: /* spec decode when drafts are on */
      np = test_rng_range(rng, 1, RB_MAX_LEN / 2);
      nc = test_rng_range(rng, np > hit ? np : hit, RB_MAX_LEN - RB_MAX_DRAFTS - 1);
      ns = 1;
      if (b->has_drafts && test_rng_unit(rng) < 0.7) {
        ndraft = test_rng_range(rng, 1, RB_MAX_DRAFTS - 1);
        int32_t real = 0;
        for (int32_t i = 0; i < ndraft; i++) {
          const bool placeholder = test_rng_unit(rng) < 0.25;
          b->draft_tokens[drafts + i] = placeholder ? -1 : test_rng_range(rng, 0, 32000);
          real += !placeholder;
        }
        ns = real + 1;
      }
      break;
    case 2: /* a whole prompt after a prefix-cache hit */
      nc = hit;
      ns = test_rng_range(rng, 1, 64);
      np = nc + ns;
      break;
    default: /* a chunk of a longer prompt: partial, or the one that finishes it */
      nc = hit + test_rng_range(rng, 0, 128);
      ns = test_rng_range(rng, 1, 96);
      np = nc + ns + (test_rng_unit(rng) < 0.5 ? test_rng_range(rng, 1, 64) : 0);
      break;
    }
    if (ns > budget || nc + ns > RB_MAX_LEN) break;
    if (ndraft > 0 && !b->has_drafts) ndraft = 0;
    b->num_computed[r] = nc;
    b->num_scheduled[r] = ndraft > 0 ? 1 : ns; /* the scheduler's count; drafts decide the real one */
    b->num_prompt[r] = np;
    drafts += ndraft;
    b->draft_offsets[r + 1] = drafts;
    int32_t *row = b->block_table + (size_t)r * b->stride;
    for (int32_t i = 0; i < b->stride; i++) row[i] = -1;
    const int32_t nblocks = (nc + ns + bs - 1) / bs;
    for (int32_t i = 0; i < nblocks; i++)
      row[i] = (shares && i < prefix_blocks) ? prefix_ids[i] : pool.ids[pool.next++];
    for (int32_t i = 0; i < RB_MAX_LEN; i++) b->token_ids[(size_t)r * RB_MAX_LEN + i] = test_rng_range(rng, 0, 32000);
    tokens += ns;
    b->num_reqs = r + 1;
  }
}

static inline uattn_step rb_step(const rb_batch *b) {
  uattn_step s =
      step_requests(b->num_reqs, b->num_computed, b->num_scheduled, b->num_prompt, b->block_table, b->stride);
  if (b->has_drafts) {
    s.draft_tokens = b->draft_tokens;
    s.draft_offsets = b->draft_offsets;
  }
  if (b->has_ids) {
    s.token_ids = b->token_ids;
    s.token_ids_stride = RB_MAX_LEN;
  }
  return s;
}

#endif
