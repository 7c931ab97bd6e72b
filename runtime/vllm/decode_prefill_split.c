/* vLLM's split of a batch into decodes, extends and prefills (split_decodes_and_prefills,
 * split_decodes_prefills_and_extends) and the reorder that brings a batch into that order with the fewest
 * swaps; apart from the other batch helpers (batch_utils.c) because the reorder's cycle decomposition and
 * its proof are a unit of their own. */
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/internal.h"
#include "uattn_vllm.h"
#include "vllm/batch_checks.h"

/* ---- decode / extend / prefill split (split_decodes_and_prefills, split_decodes_prefills_and_extends) */

static uattn_batch_split all_decodes(int32_t num_reqs, int32_t num_tokens) {
  uattn_batch_split s = {0};
  s.num_decodes = num_reqs;
  s.num_decode_tokens = num_tokens;
  return s;
}

/* The checks both splits make, out first; seq_lens only for the split that reads it. */
static uattn_status check_split_args(int32_t num_reqs, const int32_t *qsl, bool with_seq_lens, const int32_t *seq_lens,
                                     int32_t num_tokens, int32_t decode_threshold, const uattn_batch_split *out) {
  UATTN_CHECK_PTR(out, "out");
  uattn_status st;
  CHECK_COUNTS({num_reqs, "num_reqs"}, {decode_threshold, "decode_threshold"});
  if ((st = uattn_vllm_check_qsl(qsl, num_reqs, true)) != UATTN_OK) return st;
  if (with_seq_lens && (st = uattn_vllm_check_seq_lens(seq_lens, qsl, num_reqs)) != UATTN_OK) return st;
  if (num_tokens < qsl[num_reqs])
    return uattn_fail(UATTN_ERR_INCONSISTENT, "num_tokens = %d is less than query_start_loc[num_reqs] = %d", num_tokens,
                      qsl[num_reqs]);
  return UATTN_OK;
}

uattn_status uattn_split_decodes_and_prefills(int32_t num_reqs, const int32_t *query_start_loc, int32_t num_tokens,
                                              int32_t decode_threshold, bool require_uniform, uattn_batch_split *out) {
  uattn_clear_error();
  uattn_status st = check_split_args(num_reqs, query_start_loc, false, NULL, num_tokens, decode_threshold, out);
  if (st != UATTN_OK) return st;
  const int32_t *qsl = query_start_loc;

  /* The seed indexes query_lens[0] past this point, so an empty batch stops here. */
  if (num_reqs == 0) {
    *out = all_decodes(0, num_tokens);
    return UATTN_OK;
  }
  /* A uniform-decode threshold above 1 must still check that the lengths agree, hence the second term. */
  if (max_query_len(qsl, num_reqs) <= decode_threshold && (!require_uniform || decode_threshold <= 1)) {
    *out = all_decodes(num_reqs, num_tokens);
    return UATTN_OK;
  }
  const int32_t q0 = query_len(qsl, 0);
  uattn_batch_split s = {0};
  if (q0 > decode_threshold) {
    s.num_prefills = num_reqs;
    s.num_prefill_tokens = num_tokens;
    *out = s;
    return UATTN_OK;
  }

  int32_t first_prefill = num_reqs;
  if (require_uniform) {
    /* Zero-length requests are the padding of a captured uniform batch: decodes, if all others agree. */
    bool padded_uniform = true;
    for (int32_t r = 0; r < num_reqs && padded_uniform; r++) {
      int32_t q = query_len(qsl, r);
      padded_uniform = (q == q0 || q == 0);
    }
    if (padded_uniform) {
      if ((int64_t)num_reqs * q0 != num_tokens)
        return uattn_fail(UATTN_ERR_INCONSISTENT,
                          "a uniform batch of %d requests of %d tokens must have num_tokens = %lld, got %d "
                          "(tokens not padded correctly)",
                          num_reqs, q0, (long long)num_reqs * q0, num_tokens);
      *out = all_decodes(num_reqs, num_tokens);
      return UATTN_OK;
    }
    for (int32_t r = 0; r < num_reqs; r++) {
      if (query_len(qsl, r) != q0) {
        first_prefill = r;
        break;
      }
    }
  } else {
    for (int32_t r = 0; r < num_reqs; r++) {
      if (query_len(qsl, r) > decode_threshold) {
        first_prefill = r;
        break;
      }
    }
  }
  if (first_prefill == num_reqs) {
    *out = all_decodes(num_reqs, num_tokens);
    return UATTN_OK;
  }
  s.num_decodes = first_prefill;
  s.num_prefills = num_reqs - first_prefill;
  s.num_decode_tokens = qsl[first_prefill];
  s.num_prefill_tokens = num_tokens - qsl[first_prefill];
  *out = s;
  return UATTN_OK;
}

uattn_status uattn_split_decodes_prefills_and_extends(int32_t num_reqs, const int32_t *query_start_loc,
                                                      const int32_t *seq_lens, int32_t num_tokens,
                                                      int32_t decode_threshold, uattn_batch_split *out) {
  uattn_clear_error();
  uattn_status st = check_split_args(num_reqs, query_start_loc, true, seq_lens, num_tokens, decode_threshold, out);
  if (st != UATTN_OK) return st;
  const int32_t *qsl = query_start_loc;

  if (max_query_len(qsl, num_reqs) <= decode_threshold) {
    *out = all_decodes(num_reqs, num_tokens);
    return UATTN_OK;
  }
  /* max_query_len > threshold, so a first extend-or-prefill exists. (The seed reads max_query_len from
   * the metadata; a stale one could reach its "none" branch, which here cannot happen.) */
  int32_t first_extend = num_reqs, first_prefill = num_reqs;
  for (int32_t r = 0; r < num_reqs; r++) {
    int32_t q = query_len(qsl, r);
    if (q <= decode_threshold) continue;
    if (first_extend == num_reqs) first_extend = r;
    if (seq_lens[r] == q) {
      first_prefill = r;
      break;
    }
  }
  uattn_batch_split s = {0};
  s.num_decodes = first_extend;
  s.num_decode_tokens = qsl[first_extend];
  const int32_t rest_tokens = num_tokens - s.num_decode_tokens;
  if (first_prefill == num_reqs) {
    s.num_extends = num_reqs - first_extend;
    s.num_extend_tokens = rest_tokens;
  } else {
    s.num_extends = first_prefill - first_extend;
    s.num_prefills = num_reqs - first_prefill;
    s.num_prefill_tokens = num_tokens - qsl[first_prefill];
    s.num_extend_tokens = rest_tokens - s.num_prefill_tokens;
  }
  *out = s;
  return UATTN_OK;
}

/* ---- reorder (reorder_batch_to_split_decodes_and_prefills) -------------------------------------------
 *
 * A "move" is one swap of two positions (vLLM's input_batch.swap_states). Regions, in their order: the
 * seed's 0 decode, 1 extend, 2 prefill; today's 0 decode, 1 short extend, 2 long extend, 3 prefill. Zone z
 * is the range of positions that must hold region z at the end. A misplaced request is an edge from the
 * zone it sits in to the zone it must reach; let m be their number and M[a][z] the region-a requests in
 * zone z. We split the edges into simple zone cycles: first min(M[a][b], M[b][a]) 2-cycles for every pair
 * of zones, then 3-cycles, then (four regions) 4-cycles, each as many times as its edges allow, and do a
 * cycle of length L in L - 1 swaps: m - c swaps for c cycles. Why nobody can do with fewer:
 *  - s swaps compose to a permutation pi of positions, and realizing pi takes at least sum over its
 *    cycles of (length - 1) swaps; a cycle of pi holds at most its length in misplaced requests, so
 *    s >= m - k for the k cycles of pi that move one. The misplaced requests of one cycle of pi form a
 *    closed walk over zones, which splits into at least one simple zone cycle: so k <= the most cycles
 *    any split of the m edges has, and it remains to show that ours has that many.
 *  - Some largest split takes our 2-cycles: a simple cycle holding both a->b and b->a is that 2-cycle,
 *    and two cycles holding them apart can be traded for the 2-cycle and the closed walk of the rest,
 *    which splits into at least one cycle.
 *  - What is left runs one way between any two zones. Three zones: all copies of one 3-cycle. Four zones:
 *    orient the empty pairs to make a tournament, which has at most two cyclic triangles and one 4-cycle,
 *    and each of its triangles holds an edge no other of its cycles holds (the 4-cycle's diagonal); so
 *    every split has the same cycles, as many of each as that edge's count, which is also what the
 *    smallest count of its edges gives whatever order the triangles are taken in.
 * The suite checks the count against a breadth-first search over all swap sequences on every batch of up
 * to 8 requests (three regions) or 7 (four). vLLM follows the cycles of one fixed assignment (stable order), which can join requests
 * into longer cycles: regions 1,2,0,1 take it 3 swaps where 2 suffice. */

#define REORDER_MAX_REGIONS 4

typedef struct reorder_ctx {
  const int32_t *num_scheduled;
  const int32_t *num_computed;
  const int32_t *num_prompt; /* NULL: the seed's three regions */
  int32_t threshold;
  int32_t zone_begin[REORDER_MAX_REGIONS];
  int32_t zone_end[REORDER_MAX_REGIONS];
  /* cursor[a][z]: where the search for the next region-a request in zone z resumes */
  int32_t cursor[REORDER_MAX_REGIONS][REORDER_MAX_REGIONS];
} reorder_ctx;

static int region_of(const reorder_ctx *c, int32_t i) {
  const int32_t comp = c->num_computed[i];
  const bool is_short = c->num_scheduled[i] <= c->threshold;
  if (!c->num_prompt) return comp == 0 ? 2 : (is_short ? 0 : 1);
  if (comp == 0) return 3;
  if (!is_short) return 2;
  return comp >= c->num_prompt[i] ? 0 : 1;
}

/* The next region-a request in zone z; each (a, z) cursor only moves forward, so all searches of one
 * call cost O(num_reqs) together. The caller only asks when one is known to remain. */
static int32_t next_misplaced(reorder_ctx *c, int a, int z) {
  int32_t i = c->cursor[a][z];
  while (i < c->zone_end[z] && region_of(c, i) != a) i++;
  c->cursor[a][z] = i + 1;
  return i;
}

/* Every simple cycle over four zones, each from its smallest zone: zone[i] holds requests of region
 * zone[i + 1] (cyclically). Pairs, then triangles, then 4-cycles: the order the split needs. */
typedef struct zone_cycle {
  int8_t len;
  int8_t zone[REORDER_MAX_REGIONS];
} zone_cycle;
static const zone_cycle zone_cycles[] = {
    {2, {0, 1}},       {2, {0, 2}},       {2, {1, 2}},       {2, {0, 3}},       {2, {1, 3}},
    {2, {2, 3}},       {3, {0, 2, 1}},    {3, {0, 1, 2}},    {3, {0, 3, 1}},    {3, {0, 1, 3}},
    {3, {0, 3, 2}},    {3, {0, 2, 3}},    {3, {1, 3, 2}},    {3, {1, 2, 3}},    {4, {0, 1, 2, 3}},
    {4, {0, 1, 3, 2}}, {4, {0, 2, 1, 3}}, {4, {0, 2, 3, 1}}, {4, {0, 3, 1, 2}}, {4, {0, 3, 2, 1}},
};
enum { NUM_ZONE_CYCLES = sizeof zone_cycles / sizeof zone_cycles[0] };

static bool cycle_fits(const zone_cycle *y, int regions) {
  for (int i = 0; i < y->len; i++)
    if (y->zone[i] >= regions) return false;
  return true;
}

/* How many copies of each cycle the split takes (M is consumed) and the swaps they need. */
static int64_t split_into_cycles(int32_t M[REORDER_MAX_REGIONS][REORDER_MAX_REGIONS], int regions,
                                 int32_t copies[NUM_ZONE_CYCLES]) {
  int64_t swaps = 0;
  for (int y = 0; y < NUM_ZONE_CYCLES; y++) {
    const zone_cycle *cy = &zone_cycles[y];
    copies[y] = 0;
    if (!cycle_fits(cy, regions)) continue;
    int32_t k = INT32_MAX;
    for (int i = 0; i < cy->len; i++) k = uattn_min_i32(k, M[cy->zone[(i + 1) % cy->len]][cy->zone[i]]);
    for (int i = 0; i < cy->len; i++) M[cy->zone[(i + 1) % cy->len]][cy->zone[i]] -= k;
    copies[y] = k;
    swaps += (int64_t)k * (cy->len - 1);
  }
  return swaps;
}

static uattn_status reorder(reorder_ctx *c, int regions, int32_t num_reqs, uattn_swap *swaps, int32_t swaps_capacity,
                            int32_t *num_swaps, int32_t *order) {
  int32_t count[REORDER_MAX_REGIONS] = {0};
  for (int32_t i = 0; i < num_reqs; i++) count[region_of(c, i)]++;
  for (int z = 0, at = 0; z < regions; z++) {
    c->zone_begin[z] = at;
    c->zone_end[z] = at += count[z];
  }
  int32_t M[REORDER_MAX_REGIONS][REORDER_MAX_REGIONS] = {{0}}, copies[NUM_ZONE_CYCLES];
  for (int z = 0; z < regions; z++)
    for (int32_t i = c->zone_begin[z]; i < c->zone_end[z]; i++) M[region_of(c, i)][z]++;
  const int64_t needed = split_into_cycles(M, regions, copies);
  if (needed > swaps_capacity) return capacity_error("swaps", needed, swaps_capacity);

  for (int a = 0; a < regions; a++)
    for (int z = 0; z < regions; z++) c->cursor[a][z] = c->zone_begin[z];
  int32_t n = 0;
  for (int y = 0; y < NUM_ZONE_CYCLES; y++) {
    const zone_cycle *cy = &zone_cycles[y];
    for (int32_t k = 0; k < copies[y]; k++) {
      int32_t at[REORDER_MAX_REGIONS];
      for (int i = 0; i < cy->len; i++) at[i] = next_misplaced(c, cy->zone[(i + 1) % cy->len], cy->zone[i]);
      /* at[0] takes the request it needs from the last zone, which then takes its own from the one
       * before, and so on: each swap puts one request in place for good, the last one two. */
      for (int i = cy->len - 1; i >= 1; i--) swaps[n++] = (uattn_swap){i == cy->len - 1 ? at[0] : at[i + 1], at[i]};
    }
  }
  if (order) {
    for (int32_t i = 0; i < num_reqs; i++) order[i] = i;
    for (int32_t k = 0; k < n; k++) {
      int32_t t = order[swaps[k].a];
      order[swaps[k].a] = order[swaps[k].b];
      order[swaps[k].b] = t;
    }
  }
  *num_swaps = n;
  return UATTN_OK;
}

/* The checks both reorders share; num_prompt is checked only when given (prompts are never empty). */
static uattn_status check_reorder_args(int32_t num_reqs, const int32_t *num_scheduled, const int32_t *num_computed,
                                       const int32_t *num_prompt, bool with_prompt, int32_t decode_threshold,
                                       const uattn_swap *swaps, int32_t swaps_capacity, const int32_t *num_swaps,
                                       const int32_t *order) {
  UATTN_CHECK_PTR(num_swaps, "num_swaps");
  CHECK_COUNTS({num_reqs, "num_reqs"}, {decode_threshold, "decode_threshold"}, {swaps_capacity, "swaps_capacity"});
  if (swaps_capacity > 0) UATTN_CHECK_PTR(swaps, "swaps (with swaps_capacity > 0)");
  UATTN_CHECK_ALIGNED(order, "order");
  if (num_reqs > 0) {
    UATTN_CHECK_PTR(num_scheduled, "num_scheduled");
    UATTN_CHECK_PTR(num_computed, "num_computed");
    if (with_prompt) UATTN_CHECK_PTR(num_prompt, "num_prompt");
  }
  for (int32_t i = 0; i < num_reqs; i++) {
    if (num_scheduled[i] < 0)
      return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "num_scheduled[%d] must be >= 0, got %d", i, num_scheduled[i]);
    if (num_computed[i] < 0)
      return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "num_computed[%d] must be >= 0, got %d", i, num_computed[i]);
    if (with_prompt && num_prompt[i] < 1)
      return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "num_prompt[%d] must be >= 1 (a prompt has a token), got %d", i,
                        num_prompt[i]);
  }
  return UATTN_OK;
}

uattn_status uattn_reorder_batch_to_split_decodes_and_prefills(int32_t num_reqs, const int32_t *num_scheduled,
                                                               const int32_t *num_computed, int32_t decode_threshold,
                                                               uattn_swap *swaps, int32_t swaps_capacity,
                                                               int32_t *num_swaps, int32_t *order) {
  uattn_clear_error();
  uattn_status st = check_reorder_args(num_reqs, num_scheduled, num_computed, NULL, false, decode_threshold, swaps,
                                       swaps_capacity, num_swaps, order);
  if (st != UATTN_OK) return st;
  reorder_ctx c = {.num_scheduled = num_scheduled, .num_computed = num_computed, .threshold = decode_threshold};
  return reorder(&c, 3, num_reqs, swaps, swaps_capacity, num_swaps, order);
}

uattn_status uattn_reorder_batch_with_prompt_lens(int32_t num_reqs, const int32_t *num_scheduled,
                                                  const int32_t *num_computed, const int32_t *num_prompt,
                                                  int32_t decode_threshold, uattn_swap *swaps, int32_t swaps_capacity,
                                                  int32_t *num_swaps, int32_t *order) {
  uattn_clear_error();
  uattn_status st = check_reorder_args(num_reqs, num_scheduled, num_computed, num_prompt, true, decode_threshold, swaps,
                                       swaps_capacity, num_swaps, order);
  if (st != UATTN_OK) return st;
  reorder_ctx c = {.num_scheduled = num_scheduled,
                   .num_computed = num_computed,
                   .num_prompt = num_prompt,
                   .threshold = decode_threshold};
  return reorder(&c, 4, num_reqs, swaps, swaps_capacity, num_swaps, order);
}
