/* A plan's lifetime: the config's defaults and checks, the arrays a plan allocates once at creation (sized by
 * the config, so that no step allocates in the common case) and their release. Apart from planner.c because
 * none of it runs per step. */
#include <string.h>

#include "plan/planner.h"

#define UATTN_DEFAULT_SHARED_BIAS_LIMIT ((size_t)256 << 20)
#define UATTN_DEFAULT_SPLIT_MIN_KEYS 8192
#define UATTN_DEFAULT_SPLIT_KEYS 4096

uattn_plan_config uattn_plan_config_default(int32_t block_size, int32_t num_blocks, int32_t max_num_seqs,
                                            int32_t max_num_batched_tokens, int32_t max_model_len) {
  uattn_plan_config c;
  memset(&c, 0, sizeof c);
  c.block_size = block_size;
  c.num_blocks = num_blocks;
  c.max_num_seqs = max_num_seqs;
  c.max_num_batched_tokens = max_num_batched_tokens;
  c.max_model_len = max_model_len;
  c.bucketing.mode = UATTN_BUCKETING_NONE;
  c.shared_bias_byte_limit = UATTN_DEFAULT_SHARED_BIAS_LIMIT;
  c.split_min_keys = UATTN_DEFAULT_SPLIT_MIN_KEYS;
  c.split_keys = UATTN_DEFAULT_SPLIT_KEYS;
  c.cp_size = 1;
  c.cp_rank = 0;
  c.cp_interleave = 1;
  return c;
}

/* ---- creation ----------------------------------------------------------------------------------- */

static uattn_status validate_config(const uattn_plan_config *c) {
  if (c->block_size <= 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "config.block_size must be > 0 (got %d)", c->block_size);
  if (c->num_blocks <= 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "config.num_blocks must be > 0 (got %d)", c->num_blocks);
  if (c->max_num_seqs <= 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "config.max_num_seqs must be > 0 (got %d)", c->max_num_seqs);
  if (c->max_num_batched_tokens <= 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "config.max_num_batched_tokens must be > 0 (got %d)",
                      c->max_num_batched_tokens);
  if (c->max_model_len <= 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "config.max_model_len must be > 0 (got %d)", c->max_model_len);
  if (c->chunk_size < 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "config.chunk_size must be >= 0 (got %d)", c->chunk_size);
  if (c->split_min_keys < 0 || c->split_keys < 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "config.split_min_keys (%d) and split_keys (%d) must be >= 0",
                      c->split_min_keys, c->split_keys);
  /* context parallelism: 0 means the default of each */
  if (c->cp_size < 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "config.cp_size = %d must be >= 1 ranks (0 = 1)", c->cp_size);
  const int32_t cp_size = c->cp_size ? c->cp_size : 1;
  if (c->cp_rank < 0 || c->cp_rank >= cp_size)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "config.cp_rank = %d must be in [0, cp_size = %d)", c->cp_rank,
                      cp_size);
  if (c->cp_interleave < 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                      "config.cp_interleave = %d must be >= 1 positions a rank holds in a row (0 = 1)",
                      c->cp_interleave);
  int32_t slots;
  if (!uattn_mul_i32(cp_size, c->cp_interleave ? c->cp_interleave : 1, &slots))
    return uattn_fail(UATTN_ERR_OVERFLOW, "config: cp_size * cp_interleave (%d * %d) overflows int32", cp_size,
                      c->cp_interleave);
  if (!uattn_mul_i32(c->num_blocks, c->block_size, &slots))
    return uattn_fail(UATTN_ERR_OVERFLOW, "config: num_blocks * block_size (%d * %d) overflows int32", c->num_blocks,
                      c->block_size);
  if (c->max_num_batched_tokens == INT32_MAX)
    return uattn_fail(UATTN_ERR_OVERFLOW, "config.max_num_batched_tokens must be < INT32_MAX");
  /* query_start_loc holds max_num_seqs + 1 int32 entries */
  if (c->max_num_seqs == INT32_MAX) return uattn_fail(UATTN_ERR_OVERFLOW, "config.max_num_seqs must be < INT32_MAX");
  switch (c->bucketing.mode) {
  case UATTN_BUCKETING_NONE:
  case UATTN_BUCKETING_EXPONENTIAL: break;
  case UATTN_BUCKETING_CUSTOM:
    if (!c->bucketing.fn)
      return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "config.bucketing: mode CUSTOM needs bucketing.fn");
    break;
  default:
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "config.bucketing.mode %d is not a uattn_bucketing_mode",
                      (int)c->bucketing.mode);
  }
  return UATTN_OK;
}

/* Allocates count elements of size bytes each from the plan's allocator into *ptr. */
static uattn_status plan_array(uattn_plan *p, void **ptr, size_t count, size_t size) {
  *ptr = uattn_alloc_bytes(&p->alloc, count * size);
  if (!*ptr) return uattn_fail(UATTN_ERR_NO_MEMORY, "out of memory allocating a plan (%zu bytes)", count * size);
  memset(*ptr, 0, count * size);
  return UATTN_OK;
}

/* Every fixed-size array of a plan, so creation and destruction walk the same list (a table: not reflowed). */
/* clang-format off */
#define UATTN_PLAN_ARRAYS(X)                                                                                \
  X(blocks.stamp, nb) X(blocks.start, nb) X(blocks.owner, nb) X(blocks.readers, nb) X(blocks.index, nb)     \
  X(blocks.written, nb) X(num_scheduled, nr) X(query_start_loc, nr) X(seq_lens, nr) X(cached, nr)          \
  X(num_output_tokens, nr) X(is_prompt, nr) X(step_scheduled, nr) X(token_groups, nt) X(token_offsets, nt) X(token_positions, nt) \
  X(token_ids, nt) X(token_context_lens, nt) X(slot_mapping, nt) X(logits_indices, nt)                      \
  X(logits_groups, nt) X(new_token_positions, nt) X(span_req_begin, nr) X(unique_row_begin, nt) X(item_first, nr) \
  X(item_reqs, nr) X(cost_keys, nr) X(split_begin, nr) X(split_slot, nr)
/* clang-format on */

static void plan_free(uattn_plan *p) {
  size_t nb = (size_t)p->config.num_blocks, nr = (size_t)p->config.max_num_seqs + 1,
         nt = (size_t)p->config.max_num_batched_tokens + 1;
#define UATTN_FREE(field, n) uattn_alloc_release(&p->alloc, p->field, (n) * sizeof *p->field);
  UATTN_PLAN_ARRAYS(UATTN_FREE)
#undef UATTN_FREE
  uattn_buf_release(&p->alloc, &p->shared_blocks);
  uattn_buf_release(&p->alloc, &p->shared_spans);
  uattn_buf_release(&p->alloc, &p->unique_blocks);
  uattn_buf_release(&p->alloc, &p->span_cursor);
  uattn_buf_release(&p->alloc, &p->spans_by_req);
  uattn_batch_buckets_release(p);
  uattn_graph_buffers_release(p);
  uattn_allocator hooks = p->alloc.hooks;
  hooks.free(hooks.user, p);
}

/* The context split's lists hold at most one entry per (request, context block). When that worst case is
 * modest, reserve it now so that no step ever allocates; otherwise they grow with the largest step seen. */
#define UATTN_CONTEXT_RESERVE_LIMIT ((size_t)64 << 20)

static uattn_status reserve_context(uattn_plan *p) {
  const uattn_plan_config *c = &p->config;
  const int64_t entries = (int64_t)c->max_num_seqs * uattn_ceil_div_i32(c->max_model_len, c->block_size);
  const int64_t blocks = entries < c->num_blocks ? entries : c->num_blocks;
  const size_t bytes = (size_t)entries * (sizeof(uattn_shared_span) + sizeof(uattn_unique_block) + sizeof(int32_t)) +
                       (size_t)blocks * 2 * sizeof(int32_t);
  if (bytes > UATTN_CONTEXT_RESERVE_LIMIT) return UATTN_OK;
  uattn_status st;
  if ((st = uattn_buf_reserve(&p->alloc, &p->shared_spans, (size_t)entries * sizeof(uattn_shared_span))) ||
      (st = uattn_buf_reserve(&p->alloc, &p->spans_by_req, (size_t)entries * sizeof(int32_t))) ||
      (st = uattn_buf_reserve(&p->alloc, &p->unique_blocks, (size_t)entries * sizeof(uattn_unique_block))) ||
      (st = uattn_buf_reserve(&p->alloc, &p->shared_blocks, (size_t)blocks * sizeof(int32_t))))
    return st;
  return uattn_buf_reserve(&p->alloc, &p->span_cursor, (size_t)blocks * sizeof(int32_t));
}

uattn_status uattn_plan_create(const uattn_plan_config *config, uattn_plan **out) {
  uattn_clear_error();
  UATTN_CHECK_PTR(config, "config");
  UATTN_CHECK_PTR(out, "out");
  uattn_status st = validate_config(config);
  if (st) return st;
  uattn_alloc alloc;
  if ((st = uattn_alloc_init(&alloc, config->allocator))) return st;

  uattn_plan *p = uattn_alloc_bytes(&alloc, sizeof *p);
  if (!p) return uattn_fail(UATTN_ERR_NO_MEMORY, "out of memory allocating a plan");
  memset(p, 0, sizeof *p);
  p->config = *config;
  p->config.allocator = NULL; /* the hooks live in p->alloc; the caller's struct may go away */
  if (p->config.shared_bias_byte_limit == 0) p->config.shared_bias_byte_limit = UATTN_DEFAULT_SHARED_BIAS_LIMIT;
  if (p->config.split_min_keys == 0) p->config.split_min_keys = UATTN_DEFAULT_SPLIT_MIN_KEYS;
  if (p->config.split_keys == 0) p->config.split_keys = UATTN_DEFAULT_SPLIT_KEYS;
  if (p->config.cp_size == 0) p->config.cp_size = 1;
  if (p->config.cp_interleave == 0) p->config.cp_interleave = 1;
  p->alloc = alloc;

  size_t nb = (size_t)config->num_blocks, nr = (size_t)config->max_num_seqs + 1,
         nt = (size_t)config->max_num_batched_tokens + 1;
#define UATTN_ALLOC(field, n)                                                                                          \
  if (!st) st = plan_array(p, (void **)&p->field, (n), sizeof *p->field);
  UATTN_PLAN_ARRAYS(UATTN_ALLOC)
#undef UATTN_ALLOC
  if (!st && config->bucketing.mode == UATTN_BUCKETING_EXPONENTIAL) st = uattn_batch_buckets_build(p);
  if (!st) st = reserve_context(p);
  if (st) {
    plan_free(p);
    return st;
  }
  p->info.block_size = config->block_size;
  p->info.query_start_loc = p->query_start_loc; /* a valid empty step: query_start_loc = [0] */
  *out = p;
  return UATTN_OK;
}

void uattn_plan_destroy(uattn_plan *plan) {
  if (plan) plan_free(plan);
}
