/* The planner's hand-off to the forward: what a planned step asks the attention to compute, and in which
 * work units. uattn_plan_step fills the plan; the forward reads it only through this view. */
#ifndef UATTN_SCHEDULE_H
#define UATTN_SCHEDULE_H

#include "uattn.h"

typedef struct uattn_schedule {
  const uattn_plan_config *config;
  const uattn_plan_info *info; /* the step: rows, requests, shared spans and unique blocks (uattn.h) */
  /* Work items, largest cost first: item i computes requests [item_first[i], item_first[i] + item_reqs[i]),
   * one request or a prefix run (below). */
  int32_t num_items;
  const int32_t *item_first, *item_reqs;
  /* Split-K: item i is cut into key ranges [split_begin[i], split_begin[i + 1]) of split_keys keys each;
   * split s of its row k keeps its partial states at index split_slot[i] + s * rows + k among the split
   * items' (split_slot[num_items] of them in all). An item of one range is not split. */
  const int32_t *split_begin, *split_slot;
  int32_t split_keys;
  /* The walks of the attention: request r's shared spans are info->shared_spans[spans_by_req[k]] for k in
   * [span_req_begin[r], span_req_begin[r + 1]), in shared-block order; row x's unique blocks are
   * info->unique_blocks[unique_row_begin[x] .. unique_row_begin[x + 1]). */
  const int32_t *spans_by_req, *span_req_begin, *unique_row_begin;
} uattn_schedule;

/* Rows a prefix run (decodes and short verifications in a row that start on the same shared block, computed
 * as one work item) may have: enough that a shared block's load serves many rows, few enough that a
 * 64-decode batch still makes several items a KV head for the threads to share. */
#define UATTN_PREFIX_RUN_MAX_ROWS 32

/* The view of a planned step in *out (the plan must outlive it and not be planned again meanwhile), after
 * checking the caller's pointer as UATTN_CHECK_PTR does. */
uattn_status uattn_plan_schedule(const uattn_plan *plan, uattn_schedule *out);

#endif
