/* The planner: worked examples, a property test over thousands of random batches (every key seen exactly
 * once), every bad input, and no allocation per step. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plan/planner.h"
#include "common/random_batch.h"
#include "common/support.h"
#include "support/requests.h"

/* ---- worked examples ------------------------------------------------------------------------------- */

/* The docs' batch: block size 4, query lengths [8, 4, 1, 1], contexts [0, 4, 6, 4]: a prompt, the second
 * chunk of a prompt, and two decodes. Expected values worked out by hand from docs/design.md. */
Test(planner_examples, docs_batch) {
  uattn_plan_config cfg = uattn_plan_config_default(4, 16, 8, 64, 64);
  uattn_plan *plan;
  cr_assert_eq(uattn_plan_create(&cfg, &plan), UATTN_OK, "%s", uattn_last_error());
  const int32_t nc[] = {0, 4, 6, 4}, ns[] = {8, 4, 1, 1}, np[] = {8, 8, 6, 4};
  const int32_t table[] = {0, 1, 2, 3, 4, 5, 6, 7}; /* stride 2 */
  uattn_step step = step_requests(4, nc, ns, np, table, 2);
  cr_assert_eq(uattn_plan_step(plan, &step), UATTN_OK, "%s", uattn_last_error());
  uattn_plan_info in;
  uattn_plan_get_info(plan, &in);

  cr_assert_eq(in.num_tokens, 14);
  cr_assert(in.contains_prompts);
  const int32_t qsl[] = {0, 8, 12, 13, 14}, seq_lens[] = {8, 8, 7, 5};
  const bool prompt[] = {true, true, false, false};
  for (int r = 0; r < 4; r++) {
    cr_assert_eq(in.seq_lens[r], seq_lens[r]);
    cr_assert_eq(in.is_prompt[r], prompt[r], "request %d", r);
  }
  for (int r = 0; r <= 4; r++) cr_assert_eq(in.query_start_loc[r], qsl[r]);
  const int32_t pos[] = {0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7, 6, 4};
  const int64_t slots[] = {0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15, 22, 28};
  const int32_t ctx[] = {0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 7, 5};
  for (int t = 0; t < 14; t++) {
    cr_assert_eq(in.token_positions[t], pos[t], "row %d", t);
    cr_assert_eq(in.slot_mapping[t], slots[t], "row %d", t);
    cr_assert_eq(in.token_context_lens[t], ctx[t], "row %d", t);
  }
  const int32_t logits[] = {7, 11, 12, 13}, new_pos[] = {8, 8, 7, 5};
  cr_assert_eq(in.num_logits, 4);
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(in.logits_indices[i], logits[i]);
    cr_assert_eq(in.logits_groups[i], i);
    cr_assert_eq(in.new_token_positions[i], new_pos[i]);
  }
  /* block 2 holds request 1's four cached keys and its four rows read it: shared */
  cr_assert_eq(in.num_shared_blocks, 1);
  cr_assert_eq(in.shared_blocks[0], 2);
  cr_assert_eq(in.num_shared_spans, 1);
  cr_assert_eq(in.shared_spans[0].req, 1);
  cr_assert_eq(in.shared_spans[0].token_begin, 8);
  cr_assert_eq(in.shared_spans[0].token_end, 12);
  /* the decodes' blocks are read by one row each: unique, with the decode's own new key included */
  const uattn_unique_block want[] = {{4, 12, 0, 4}, {5, 12, 4, 3}, {6, 13, 0, 4}, {7, 13, 4, 1}};
  cr_assert_eq(in.num_unique_blocks, 4);
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(in.unique_blocks[i].block, want[i].block, "unique %d", i);
    cr_assert_eq(in.unique_blocks[i].token, want[i].token, "unique %d", i);
    cr_assert_eq(in.unique_blocks[i].block_start, want[i].block_start, "unique %d", i);
    cr_assert_eq(in.unique_blocks[i].usage, want[i].usage, "unique %d", i);
  }
  cr_assert_eq(in.exact.unique_blocks, 8, "the seed's unique dimension is the largest unique id + 1");

  /* graph tensors: the decode rows (12, 13) get nothing from the causal bias */
  uattn_graph_tensors seed;
  cr_assert_eq(uattn_plan_materialize(plan, UATTN_GRAPH_CAUSAL_BIAS | UATTN_GRAPH_UNIQUE_BIAS, &seed), UATTN_OK);
  cr_assert_eq(seed.causal_bias[0 * 14 + 0], 0.0f);
  cr_assert(isinf(seed.causal_bias[0 * 14 + 1]));
  cr_assert_eq(seed.causal_bias[11 * 14 + 8], 0.0f);
  cr_assert(isinf(seed.causal_bias[11 * 14 + 7]), "no attention across requests");
  cr_assert(isinf(seed.causal_bias[12 * 14 + 12]), "a decode row sees its key once, from the cache");
  cr_assert_eq(seed.unique_block_mapping[5], 12);
  cr_assert_eq(seed.unique_block_mapping[3], -1);
  cr_assert_eq(seed.unique_bias[5 * 4 + 2], 0.0f);
  cr_assert(isinf(seed.unique_bias[5 * 4 + 3]));
  uattn_plan_destroy(plan);
}

/* The seed's indices_and_offsets([1, 2, 3]) is the rows' (group, offset) for num_scheduled [1, 2, 3]. */
Test(planner_examples, indices_and_offsets) {
  uattn_plan_config cfg = uattn_plan_config_default(16, 8, 4, 64, 256);
  uattn_plan *plan;
  cr_assert_eq(uattn_plan_create(&cfg, &plan), UATTN_OK);
  const int32_t nc[] = {0, 0, 0}, ns[] = {1, 2, 3}, np[] = {1, 2, 3}, table[] = {0, 1, 2};
  uattn_step step = step_requests(3, nc, ns, np, table, 1);
  cr_assert_eq(uattn_plan_step(plan, &step), UATTN_OK, "%s", uattn_last_error());
  uattn_plan_info in;
  uattn_plan_get_info(plan, &in);
  const int32_t groups[] = {0, 1, 1, 2, 2, 2}, offsets[] = {0, 0, 1, 0, 1, 2};
  for (int t = 0; t < 6; t++) {
    cr_assert_eq(in.token_groups[t], groups[t]);
    cr_assert_eq(in.token_offsets[t], offsets[t]);
  }
  uattn_plan_destroy(plan);
}

/* Spec decode: drafts [5, -1, 7] count two, so three rows; each row's usage of the last block grows by one
 * (the seed gave all three the same usage, letting a draft see later drafts). */
Test(planner_examples, spec_decode_is_causal) {
  uattn_plan_config cfg = uattn_plan_config_default(4, 8, 2, 16, 64);
  uattn_plan *plan;
  cr_assert_eq(uattn_plan_create(&cfg, &plan), UATTN_OK);
  const int32_t nc[] = {5}, ns[] = {1}, np[] = {3}, table[] = {3, 6};
  const int32_t drafts[] = {5, -1, 7}, offsets[] = {0, 3};
  uattn_step step = step_requests(1, nc, ns, np, table, 2);
  step.draft_tokens = drafts;
  step.draft_offsets = offsets;
  cr_assert_eq(uattn_plan_step(plan, &step), UATTN_OK, "%s", uattn_last_error());
  uattn_plan_info in;
  uattn_plan_get_info(plan, &in);
  cr_assert_eq(in.num_tokens, 3);
  cr_assert_eq(in.num_scheduled[0], 3);
  cr_assert_eq(in.num_logits, 3, "verification samples every row");
  const int32_t ctx[] = {6, 7, 8};
  for (int t = 0; t < 3; t++) cr_assert_eq(in.token_context_lens[t], ctx[t]);
  /* block 3 (positions 0-3) is read by all three rows, block 6 (positions 4-7) too */
  cr_assert_eq(in.num_shared_blocks, 2);
  cr_assert_eq(in.num_unique_blocks, 0);
  uattn_graph_tensors seed;
  cr_assert_eq(uattn_plan_materialize(plan, UATTN_GRAPH_SHARED_USAGE, &seed), UATTN_OK);
  /* shared index 1 is block 6: usages 2, 3, 4 for rows 0, 1, 2 */
  for (int t = 0; t < 3; t++) cr_assert_eq(seed.shared_usage[t * 2 + 1], 2 + t, "row %d", t);
  uattn_plan_destroy(plan);
}

Test(planner_examples, async_partial_prompt_samples_its_last_row) {
  uattn_plan_config cfg = uattn_plan_config_default(4, 8, 2, 16, 64);
  uattn_plan *plan;
  cr_assert_eq(uattn_plan_create(&cfg, &plan), UATTN_OK);
  /* request 0 is a partial prompt (3 of 10 tokens), request 1 a decode */
  const int32_t nc[] = {0, 4}, ns[] = {3, 1}, np[] = {10, 4}, table[] = {0, 1, 2, 3};
  uattn_step step = step_requests(2, nc, ns, np, table, 2);
  step.async_scheduling = true;
  cr_assert_eq(uattn_plan_step(plan, &step), UATTN_OK, "%s", uattn_last_error());
  uattn_plan_info in;
  uattn_plan_get_info(plan, &in);
  cr_assert_eq(in.num_logits, 2);
  cr_assert_eq(in.logits_indices[0], 3, "the decode");
  cr_assert_eq(in.logits_indices[1], 2, "the partial prompt's last row");
  cr_assert_eq(in.logits_groups[1], 0);
  cr_assert_eq(in.num_invalid_reqs, 1);
  cr_assert_eq(in.invalid_req_indices[0], 0);
  step.async_scheduling = false;
  cr_assert_eq(uattn_plan_step(plan, &step), UATTN_OK);
  uattn_plan_get_info(plan, &in);
  cr_assert_eq(in.num_logits, 1);
  cr_assert_eq(in.num_invalid_reqs, 0);
  uattn_plan_destroy(plan);
}

Test(planner_examples, empty_batch) {
  uattn_plan_config cfg = uattn_plan_config_default(16, 8, 4, 64, 256);
  uattn_plan *plan;
  cr_assert_eq(uattn_plan_create(&cfg, &plan), UATTN_OK);
  uattn_step step = {.num_reqs = 0};
  cr_assert_eq(uattn_plan_step(plan, &step), UATTN_OK, "%s", uattn_last_error());
  uattn_plan_info in;
  uattn_plan_get_info(plan, &in);
  cr_assert_eq(in.num_tokens, 0);
  cr_assert_eq(in.num_logits, 0);
  cr_assert_eq(in.query_start_loc[0], 0);
  uattn_plan_destroy(plan);
}

/* ---- property: every row sees every key of its request up to its position exactly once ------------- */

/* Counts, per row, how often each slot of its request is visible through causal, shared and unique, and
 * checks the count is 1 for positions <= the row's and 0 otherwise. Returns a message or NULL. */
static const char *check_every_key_once(const uattn_plan_info *in, const rb_batch *b, char *msg, size_t cap) {
  const int32_t bs = in->block_size;
  for (int32_t t = 0; t < in->num_tokens; t++) {
    const int32_t r = in->token_groups[t], p = in->token_positions[t];
    const int32_t *row = b->block_table + (size_t)r * b->stride;
    /* seen[j] for positions j of request r */
    int32_t seen[RB_MAX_LEN];
    memset(seen, 0, sizeof(int32_t) * (size_t)(in->seq_lens[r]));
    if (in->is_prompt[r])
      for (int32_t k = in->query_start_loc[r]; k <= t; k++) seen[in->token_positions[k]]++;
    for (int32_t k = 0; k < in->num_shared_spans; k++) {
      const uattn_shared_span *sp = &in->shared_spans[k];
      if (t < sp->token_begin || t >= sp->token_end) continue;
      if (sp->req != r || row[sp->block_start / bs] != in->shared_blocks[sp->shared_index]) {
        snprintf(msg, cap, "span %d names block %d at %d of request %d, not in its table", k,
                 in->shared_blocks[sp->shared_index], sp->block_start, sp->req);
        return msg;
      }
      int32_t u = in->token_context_lens[t] - sp->block_start;
      u = u < 0 ? 0 : (u > bs ? bs : u);
      for (int32_t i = 0; i < u; i++) seen[sp->block_start + i]++;
    }
    for (int32_t k = 0; k < in->num_unique_blocks; k++) {
      const uattn_unique_block *ub = &in->unique_blocks[k];
      if (ub->token != t) continue;
      if (row[ub->block_start / bs] != ub->block) {
        snprintf(msg, cap, "unique %d: block %d is not at %d of request %d", k, ub->block, ub->block_start, r);
        return msg;
      }
      for (int32_t i = 0; i < ub->usage; i++) seen[ub->block_start + i]++;
    }
    for (int32_t j = 0; j < in->seq_lens[r]; j++) {
      int32_t want = j <= p ? 1 : 0;
      if (seen[j] != want) {
        snprintf(msg, cap, "row %d (request %d, position %d) sees key %d %d times, want %d", t, r, p, j, seen[j], want);
        return msg;
      }
    }
  }
  return NULL;
}

/* Structural invariants of the split: shared ids sorted and distinct, each read by > 1 row; unique blocks
 * read by exactly one row, spans ordered. */
static const char *check_split(const uattn_plan_info *in, char *msg, size_t cap) {
  for (int32_t i = 1; i < in->num_shared_blocks; i++)
    if (in->shared_blocks[i - 1] >= in->shared_blocks[i]) return "shared blocks not strictly ascending";
  for (int32_t k = 1; k < in->num_shared_spans; k++) {
    const uattn_shared_span *a = &in->shared_spans[k - 1], *c = &in->shared_spans[k];
    if (a->shared_index > c->shared_index || (a->shared_index == c->shared_index && a->req >= c->req))
      return "spans not ordered by (shared_index, req)";
  }
  for (int32_t s = 0; s < in->num_shared_blocks; s++) {
    int32_t readers = 0;
    for (int32_t k = 0; k < in->num_shared_spans; k++) {
      const uattn_shared_span *sp = &in->shared_spans[k];
      if (sp->shared_index != s) continue;
      for (int32_t t = sp->token_begin; t < sp->token_end; t++) readers += in->token_context_lens[t] > sp->block_start;
    }
    if (readers < 2) {
      snprintf(msg, cap, "shared block %d has %d readers", in->shared_blocks[s], readers);
      return msg;
    }
  }
  for (int32_t k = 0; k < in->num_unique_blocks; k++) {
    const uattn_unique_block *u = &in->unique_blocks[k];
    if (u->usage < 1 || u->usage > in->block_size) return "unique usage out of 1..block_size";
    if (k > 0 &&
        (in->unique_blocks[k - 1].token > u->token ||
         (in->unique_blocks[k - 1].token == u->token && in->unique_blocks[k - 1].block_start >= u->block_start)))
      return "unique blocks not ordered by (token, block_start)";
  }
  return NULL;
}

/* The attention's work items (planner.h): they partition the requests into runs of consecutive ones, and a
 * run of several is decodes without splits that start on the same shared block, within the row limit.
 * Counts the grouped items in *groups. */
static const char *check_items(const uattn_plan *p, const uattn_plan_info *in, int *groups, char *msg, size_t cap) {
  int32_t seen[RB_MAX_REQS] = {0};
  for (int32_t i = 0; i < p->num_items; i++) {
    const int32_t first = p->item_first[i], n = p->item_reqs[i];
    if (n < 1 || first < 0 || first + n > in->num_reqs) return "an item outside the requests";
    for (int32_t r = first; r < first + n; r++) seen[r]++;
    if (n == 1) continue;
    ++*groups;
    if (p->split_begin[i + 1] - p->split_begin[i] != 1) return "a group is split";
    if (in->query_start_loc[first + n] - in->query_start_loc[first] > UATTN_PREFIX_RUN_MAX_ROWS)
      return "a prefix run too large";
    int32_t key = -1;
    for (int32_t r = first; r < first + n; r++) {
      if (in->is_prompt[r]) return "a prompt in a group";
      int32_t lowest = INT32_MAX; /* the request's first shared block */
      for (int32_t k = 0; k < in->num_shared_spans; k++)
        if (in->shared_spans[k].req == r && in->shared_spans[k].shared_index < lowest)
          lowest = in->shared_spans[k].shared_index;
      if (lowest == INT32_MAX || (key >= 0 && lowest != key)) {
        snprintf(msg, cap, "request %d of a group starts on shared block %d, the group on %d", r, lowest, key);
        return msg;
      }
      key = lowest;
    }
  }
  for (int32_t r = 0; r < in->num_reqs; r++)
    if (seen[r] != 1) {
      snprintf(msg, cap, "request %d is in %d items", r, seen[r]);
      return msg;
    }
  return NULL;
}

Test(planner_properties, every_key_exactly_once_over_random_batches, .timeout = 120) {
  test_rng rng = {20261121};
  int checked = 0, groups = 0;
  for (int iter = 0; iter < 3000; iter++) {
    rb_params prm = rb_random_params(&rng);
    rb_batch b;
    rb_generate(&rng, &prm, &b);
    uattn_plan_config cfg =
        uattn_plan_config_default(prm.block_size, prm.num_blocks, RB_MAX_REQS, RB_MAX_TOKENS, RB_MAX_LEN);
    if (iter % 3 == 0) cfg.bucketing.mode = UATTN_BUCKETING_EXPONENTIAL;
    uattn_plan *plan;
    cr_assert_eq(uattn_plan_create(&cfg, &plan), UATTN_OK, "%s", uattn_last_error());
    uattn_step step = rb_step(&b);
    cr_assert_eq(uattn_plan_step(plan, &step), UATTN_OK, "iter %d: %s", iter, uattn_last_error());
    uattn_plan_info in;
    uattn_plan_get_info(plan, &in);
    char msg[256];
    const char *err = check_every_key_once(&in, &b, msg, sizeof msg);
    cr_assert_null(err, "iter %d (bs %d, %d reqs): %s", iter, prm.block_size, b.num_reqs, err);
    err = check_split(&in, msg, sizeof msg);
    cr_assert_null(err, "iter %d: %s", iter, err);
    err = check_items(plan, &in, &groups, msg, sizeof msg);
    cr_assert_null(err, "iter %d: %s", iter, err);
    /* slots: every row's slot is the block table's, and no two rows write the same slot */
    for (int32_t t = 0; t < in.num_tokens; t++) {
      const int32_t r = in.token_groups[t], p = in.token_positions[t];
      const int64_t want =
          (int64_t)b.block_table[r * b.stride + p / prm.block_size] * prm.block_size + p % prm.block_size;
      cr_assert_eq(in.slot_mapping[t], want, "iter %d row %d", iter, t);
      for (int32_t t2 = 0; t2 < t; t2++) cr_assert_neq(in.slot_mapping[t2], in.slot_mapping[t]);
    }
    cr_assert(in.padded.query_len >= in.exact.query_len && in.padded.shared_blocks >= in.exact.shared_blocks &&
              in.padded.unique_blocks >= in.exact.unique_blocks && in.padded.logits >= in.exact.logits);
    uattn_plan_destroy(plan);
    checked++;
  }
  cr_assert_eq(checked, 3000);
  cr_assert_gt(groups, 100, "the random batches should group decodes on a common prefix now and then");
}

/* ---- no allocation per step ------------------------------------------------------------------------- */

Test(planner_alloc, no_allocation_once_the_largest_batch_was_seen) {
  test_counting_allocator counter;
  test_counting_allocator_init(&counter);
  uattn_plan_config cfg = uattn_plan_config_default(16, RB_MAX_BLOCKS, RB_MAX_REQS, RB_MAX_TOKENS, RB_MAX_LEN);
  cfg.allocator = &counter.hooks; /* no bucketing: a subset's padded shape never outgrows the batch's */
  uattn_plan *plan;
  cr_assert_eq(uattn_plan_create(&cfg, &plan), UATTN_OK);
  const long at_creation = counter.allocs;
  test_rng rng = {7};
  rb_params big = rb_random_params(&rng);
  big.block_size = 16;
  big.num_blocks = RB_MAX_BLOCKS;
  big.max_reqs = RB_MAX_REQS;
  big.share_prob = 1.0;
  rb_batch b;
  rb_generate(&rng, &big, &b);
  uattn_step step = rb_step(&b);
  cr_assert_eq(uattn_plan_step(plan, &step), UATTN_OK, "%s", uattn_last_error());
  cr_assert_eq(counter.allocs, at_creation, "a plan this size reserves its worst-case context at creation");
  uattn_graph_tensors seed;
  cr_assert_eq(uattn_plan_materialize(plan, UATTN_GRAPH_PADDED_IDS | UATTN_GRAPH_SHARED_USAGE, &seed), UATTN_OK);
  const long after_first = counter.allocs;
  uattn_plan_stats stats;
  /* the same batch and subsets of it: never larger than what was seen */
  for (int i = 0; i < 200; i++) {
    rb_batch sub = b;
    sub.num_reqs = 1 + (int32_t)(test_rng_next(&rng) % (uint64_t)b.num_reqs);
    step = rb_step(&sub);
    cr_assert_eq(uattn_plan_step(plan, &step), UATTN_OK, "%s", uattn_last_error());
    cr_assert_eq(uattn_plan_materialize(plan, UATTN_GRAPH_PADDED_IDS | UATTN_GRAPH_SHARED_USAGE, &seed), UATTN_OK);
  }
  cr_assert_eq(counter.allocs, after_first, "steps allocated %ld times", counter.allocs - after_first);
  cr_assert_eq(uattn_plan_get_stats(plan, &stats), UATTN_OK);
  cr_assert_eq(stats.steps, 201);
  cr_assert_eq(stats.allocations, after_first);
  uattn_plan_destroy(plan);
  cr_assert_eq(counter.frees, counter.allocs, "destroy frees everything");
}
