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

/* Context parallelism (uattn.h, uattn_plan_config.cp_size): the positions of a request that rank cp_rank
 * holds, in the plan's normalized config (cp_size and cp_interleave >= 1). With cp_size 1 every function is
 * the identity (or true). */
static inline bool uattn_cp_owns(const uattn_plan_config *c, int32_t pos) {
  return c->cp_size == 1 || (pos / c->cp_interleave) % c->cp_size == c->cp_rank;
}

/* The local position of a global position the rank owns. */
static inline int32_t uattn_cp_local_pos(const uattn_plan_config *c, int32_t pos) {
  const int32_t I = c->cp_interleave;
  return c->cp_size == 1 ? pos : pos / (I * c->cp_size) * I + pos % I;
}

/* The global position of the rank's local position `local`. */
static inline int32_t uattn_cp_global_pos(const uattn_plan_config *c, int32_t local) {
  const int32_t I = c->cp_interleave;
  return c->cp_size == 1 ? local : local / I * (I * c->cp_size) + c->cp_rank * I + local % I;
}

/* Positions of [0, len) the rank owns: its local length (vLLM's get_dcp_local_seq_lens). Monotone in len,
 * so a bound on global positions (causal, window, a row's context) is a bound on local ones. */
static inline int32_t uattn_cp_local_len(const uattn_plan_config *c, int32_t len) {
  if (c->cp_size == 1) return len;
  const int32_t I = c->cp_interleave, round = I * c->cp_size, rest = len % round - c->cp_rank * I;
  return len / round * I + (rest < 0 ? 0 : rest > I ? I : rest);
}

/* Rows a prefix run (decodes and short verifications in a row that start on the same shared block, computed
 * as one work item) may have: enough that a shared block's load serves many rows, few enough that a
 * 64-decode batch still makes several items a KV head for the threads to share. */
#define UATTN_PREFIX_RUN_MAX_ROWS 32

/* The view of a planned step in *out (the plan must outlive it and not be planned again meanwhile), after
 * checking the caller's pointer as UATTN_CHECK_PTR does. */
uattn_status uattn_plan_schedule(const uattn_plan *plan, uattn_schedule *out);

#endif
