/* The plan object: everything uattn_plan_step computes, and the buffers it keeps between steps. */
#ifndef UATTN_PLANNER_H
#define UATTN_PLANNER_H

#include "common/internal.h"
#include "plan/schedule.h"

/* Per-block scratch, indexed by block id. A block's entry is valid for the current step only when its
 * stamp equals the plan's, so nothing is cleared between steps. */
typedef struct uattn_block_scratch {
  uint32_t *stamp;
  int32_t *start;   /* the block's position in every request that holds it (must agree) */
  int32_t *owner;   /* the request that first used it this step */
  int32_t *readers; /* query tokens that read it as context */
  int32_t *index;   /* its index in shared_blocks, once assigned */
  uint8_t *written; /* 1 if a request writes this step's K/V into it */
} uattn_block_scratch;

typedef struct uattn_batch_bucket_table {
  uattn_bucket *shapes; /* sorted by (query_len, shared_blocks, unique_blocks, causal) */
  bool *causal;
  int32_t count;
  size_t capacity;
} uattn_batch_bucket_table;

/* The graph tensors of uattn_plan_materialize; grown on demand. */
typedef struct uattn_graph_buffers {
  uattn_buf causal_bias, shared_bias, shared_usage, unique_bias, unique_mapping;
  uattn_buf slot_mapping, token_ids, token_positions, logits_indices;
} uattn_graph_buffers;

typedef struct uattn_cost_key uattn_cost_key;

/* Split-K applies to non-prompt requests of at most this many rows (decodes, verification). */
#define UATTN_SPLIT_MAX_ROWS 16

struct uattn_plan {
  uattn_plan_config config;
  uattn_alloc alloc;
  uattn_block_scratch blocks;
  uint32_t stamp;

  /* per request, [max_num_seqs + 1]; cached: the keys read from the cache, the rank's local count */
  int32_t *num_scheduled, *query_start_loc, *seq_lens, *cached, *num_output_tokens;
  bool *is_prompt;
  int32_t *step_scheduled; /* scratch: num_scheduled while the step is validated */
  /* per query row, [max_num_batched_tokens] */
  int32_t *token_groups, *token_offsets, *token_positions, *token_ids, *token_context_lens;
  int64_t *slot_mapping;
  /* sampling, [max_num_batched_tokens + 1]: async scheduling may add one row */
  int32_t *logits_indices, *logits_groups, *new_token_positions;
  int32_t invalid_req;

  /* context split, sized by the largest step so far */
  uattn_buf shared_blocks, shared_spans, unique_blocks, span_cursor;
  /* indexes the attention walks by: spans grouped by request (indices into shared_spans, each request's
   * in shared-block order), each row's first unique block, and the work items by cost, largest first */
  uattn_buf spans_by_req;
  int32_t *span_req_begin;   /* [max_num_seqs + 1] */
  int32_t *unique_row_begin; /* [max_num_batched_tokens + 1] */
  /* A work item is a run of consecutive requests computed together: one request, or a prefix run of decodes
   * (and verifications) in a row that start on the same shared block, so that each shared block is loaded
   * once for the whole group, not once a request (Hydragen's batching of a common prefix). Items by cost:
   * item i holds requests [item_first[i], item_first[i] + item_reqs[i]). */
  int32_t num_items;
  int32_t *item_first; /* [max_num_seqs] */
  int32_t *item_reqs;  /* [max_num_seqs] */
  /* split-K: a decode over a long context is cut into key ranges of config.split_keys, computed as separate
   * work units and merged in a fixed order. Decided by the context alone, never by the thread count, so the
   * answer does not depend on it (nor does the grouping). A split request is an item of its own. By item
   * position i: splits [split_begin[i], split_begin[i+1]); split_slot[i]: the item's first (row, split) slot
   * among split items' (for their partial states: split s of row k is slot split_slot[i] + s * rows + k). */
  int32_t *split_begin; /* [max_num_seqs + 1] */
  int32_t *split_slot;  /* [max_num_seqs + 1] */
  struct uattn_cost_key {
    int64_t cost;
    int32_t first, reqs;
  } * cost_keys; /* scratch for sorting the items */

  uattn_batch_bucket_table batch_buckets;
  uattn_graph_buffers graph;
  uattn_plan_info info;
  uattn_plan_stats stats;
};

/* bucketing.c */
uattn_status uattn_batch_buckets_build(uattn_plan *plan);
void uattn_batch_buckets_release(uattn_plan *plan);
/* Pads the exact shape by the plan's policy; sets *fallback when no bucket fits. */
uattn_status uattn_batch_bucket_select(const uattn_plan *plan, bool contains_prompts, const uattn_bucket *exact,
                                       uattn_bucket *padded, bool *fallback);

/* graph_tensors.c */
void uattn_graph_buffers_release(uattn_plan *plan);

#endif /* UATTN_PLANNER_H */
