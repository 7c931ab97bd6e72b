/* Bad input to the planner: every case gets its status and a message, and the plan keeps the previous
 * step exactly (checked by comparing everything it reports before and after). */
#include <criterion/criterion.h>
#include <limits.h>
#include <string.h>

#include "common/support.h"
#include "support/requests.h"

/* A valid base step: a prompt sharing a 2-block prefix with a decode, block size 4. */
typedef struct base {
  int32_t nc[3], ns[3], np[3], table[3 * 4], ids[3 * 16];
  int32_t drafts[4], draft_offsets[4];
  uattn_step step;
} base;

/* Points the step at b's own arrays (after a struct copy it still points at the original's). */
static void base_point(base *b) {
  b->step.num_computed = b->nc;
  b->step.num_scheduled = b->ns;
  b->step.num_prompt = b->np;
  b->step.block_table = b->table;
  b->step.token_ids = b->ids;
  b->step.draft_tokens = b->drafts;
  b->step.draft_offsets = b->draft_offsets;
}

static void base_init(base *b) {
  const int32_t nc[] = {8, 9, 0}, ns[] = {4, 1, 3}, np[] = {12, 5, 3};
  const int32_t table[] = {0, 1, 2, -1, 0, 1, 3, -1, 4, -1, -1, -1};
  memcpy(b->nc, nc, sizeof nc);
  memcpy(b->ns, ns, sizeof ns);
  memcpy(b->np, np, sizeof np);
  memcpy(b->table, table, sizeof table);
  for (int i = 0; i < 48; i++) b->ids[i] = 100 + i;
  const int32_t drafts[] = {11, -1, 12, 0}, offsets[] = {0, 0, 3, 3};
  memcpy(b->drafts, drafts, sizeof drafts);
  memcpy(b->draft_offsets, offsets, sizeof offsets);
  memset(&b->step, 0, sizeof b->step);
  b->step.num_reqs = 3;
  b->step.block_table_stride = 4;
  b->step.token_ids_stride = 16;
  base_point(b);
}

/* Everything the plan reports, deep-copied. */
typedef struct snapshot {
  uattn_plan_info info;
  int32_t rows[7][64];
  int64_t slots[64];
  int32_t logits[3][64];
  int32_t shared[64];
  uattn_shared_span spans[64];
  uattn_unique_block unique[64];
} snapshot;

/* memcpy that accepts an empty NULL source (an empty list may have no buffer yet). */
static void copy(void *dst, const void *src, size_t bytes) {
  if (bytes) memcpy(dst, src, bytes);
}

static void take(const uattn_plan *plan, snapshot *s) {
  memset(s, 0, sizeof *s);
  cr_assert_eq(uattn_plan_get_info(plan, &s->info), UATTN_OK);
  const uattn_plan_info *in = &s->info;
  cr_assert(in->num_tokens <= 64);
  const int32_t *rows[] = {in->token_groups, in->token_offsets,   in->token_positions, in->token_context_lens,
                           in->token_ids,    in->query_start_loc, in->seq_lens};
  const int32_t lens[] = {in->num_tokens, in->num_tokens,   in->num_tokens, in->num_tokens,
                          in->num_tokens, in->num_reqs + 1, in->num_reqs};
  for (int k = 0; k < 7; k++)
    if (rows[k]) copy(s->rows[k], rows[k], sizeof(int32_t) * (size_t)lens[k]);
  copy(s->slots, in->slot_mapping, sizeof(int64_t) * (size_t)in->num_tokens);
  copy(s->logits[0], in->logits_indices, sizeof(int32_t) * (size_t)in->num_logits);
  copy(s->logits[1], in->logits_groups, sizeof(int32_t) * (size_t)in->num_logits);
  copy(s->logits[2], in->new_token_positions, sizeof(int32_t) * (size_t)in->num_logits);
  copy(s->shared, in->shared_blocks, sizeof(int32_t) * (size_t)in->num_shared_blocks);
  copy(s->spans, in->shared_spans, sizeof(uattn_shared_span) * (size_t)in->num_shared_spans);
  copy(s->unique, in->unique_blocks, sizeof(uattn_unique_block) * (size_t)in->num_unique_blocks);
}

static uattn_plan *plan;
static base good;
static snapshot before;

static void setup(void) {
  uattn_plan_config cfg = uattn_plan_config_default(4, 8, 3, 16, 64);
  cr_assert_eq(uattn_plan_create(&cfg, &plan), UATTN_OK, "%s", uattn_last_error());
  base_init(&good);
  cr_assert_eq(uattn_plan_step(plan, &good.step), UATTN_OK, "%s", uattn_last_error());
  take(plan, &before);
}

static void teardown(void) { uattn_plan_destroy(plan); }

/* Runs a bad step: the status must match, the message must say something, the plan must not change. */
static void expect_refused(const uattn_step *step, uattn_status want, const char *needle) {
  uattn_status st = uattn_plan_step(plan, step);
  cr_assert_eq(st, want, "got %s (%s), want %s", uattn_status_name(st), uattn_last_error(), uattn_status_name(want));
  cr_assert_neq(strlen(uattn_last_error()), 0, "a refused call says why");
  if (needle)
    cr_assert_not_null(strstr(uattn_last_error(), needle), "message '%s' lacks '%s'", uattn_last_error(), needle);
  snapshot after;
  take(plan, &after);
  cr_assert_eq(memcmp(&before, &after, sizeof before), 0, "a refused step changed the plan");
}

TestSuite(planner_errors, .init = setup, .fini = teardown);

Test(planner_errors, null_pointers) {
  cr_assert_eq(uattn_plan_step(NULL, &good.step), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_plan_step(plan, NULL), UATTN_ERR_INVALID_ARGUMENT);
  base b = good;
  base_point(&b);
  b.step.num_computed = NULL;
  expect_refused(&b.step, UATTN_ERR_INVALID_ARGUMENT, "num_computed");
  b = good, base_point(&b);
  b.step.block_table = NULL;
  expect_refused(&b.step, UATTN_ERR_INVALID_ARGUMENT, "block_table");
  b = good, base_point(&b);
  b.step.draft_tokens = NULL;
  expect_refused(&b.step, UATTN_ERR_INVALID_ARGUMENT, "draft_tokens");
  cr_assert_eq(uattn_plan_get_info(plan, NULL), UATTN_ERR_INVALID_ARGUMENT);
}

Test(planner_errors, counts) {
  base b;
  b = good, base_point(&b), b.step.num_reqs = -1;
  expect_refused(&b.step, UATTN_ERR_INVALID_ARGUMENT, "num_reqs");
  b = good, base_point(&b), b.step.num_reqs = 4;
  expect_refused(&b.step, UATTN_ERR_CAPACITY, "max_num_seqs");
  b = good, base_point(&b), b.nc[1] = -3;
  expect_refused(&b.step, UATTN_ERR_INVALID_ARGUMENT, "num_computed[1]");
  b = good, base_point(&b), b.ns[0] = 0;
  expect_refused(&b.step, UATTN_ERR_INVALID_ARGUMENT, "num_scheduled[0]");
  b = good, base_point(&b), b.ns[2] = -2;
  expect_refused(&b.step, UATTN_ERR_INVALID_ARGUMENT, "num_scheduled[2]");
  b = good, base_point(&b), b.np[2] = 0;
  expect_refused(&b.step, UATTN_ERR_INVALID_ARGUMENT, "num_prompt[2]");
  b = good, base_point(&b), b.step.block_table_stride = 0;
  expect_refused(&b.step, UATTN_ERR_INVALID_ARGUMENT, "block_table_stride");
  b = good, base_point(&b), b.step.token_ids_stride = 0;
  expect_refused(&b.step, UATTN_ERR_INVALID_ARGUMENT, "token_ids_stride");
}

Test(planner_errors, limits_and_overflow) {
  base b;
  b = good, base_point(&b), b.nc[0] = INT32_MAX - 2;
  expect_refused(&b.step, UATTN_ERR_OVERFLOW, "overflows int32");
  b = good, base_point(&b), b.nc[2] = 60, b.np[2] = 70, b.ns[2] = 8; /* position 67 >= max_model_len 64 */
  expect_refused(&b.step, UATTN_ERR_CAPACITY, "max_model_len");
  b = good, base_point(&b), b.ns[2] = 10, b.np[2] = 10; /* 4 + 3 + 10 > 16 */
  expect_refused(&b.step, UATTN_ERR_CAPACITY, "max_num_batched_tokens");
}

Test(planner_errors, positions_and_block_ids) {
  base b;
  b = good, base_point(&b), b.ns[0] = 5, b.np[0] = 13; /* position 12 needs a fourth block: the row has -1 there */
  expect_refused(&b.step, UATTN_ERR_OUT_OF_RANGE, "block_table[0][3] = -1");
  b = good, base_point(&b), b.step.block_table_stride = 2; /* request 0 needs 3 blocks */
  expect_refused(&b.step, UATTN_ERR_OUT_OF_RANGE, "past its block-table row");
  b = good, base_point(&b), b.table[8] = -7;
  expect_refused(&b.step, UATTN_ERR_OUT_OF_RANGE, "-7");
  b = good, base_point(&b), b.table[8] = 8; /* the cache has 8 blocks: 0..7 */
  expect_refused(&b.step, UATTN_ERR_OUT_OF_RANGE, "8 blocks");
  b = good, base_point(&b), b.step.token_ids_stride = 10; /* request 0 reaches position 11 */
  expect_refused(&b.step, UATTN_ERR_OUT_OF_RANGE, "token-id row");
}

Test(planner_errors, broken_block_tables) {
  base b;
  /* block 1 at position 4 in requests 0 and 1, but at position 0 of request 2 */
  b = good, base_point(&b), b.table[8] = 1;
  expect_refused(&b.step, UATTN_ERR_INCONSISTENT, "broken block table");
  /* the same block twice in one row */
  b = good, base_point(&b), b.table[6] = 0;
  expect_refused(&b.step, UATTN_ERR_INCONSISTENT, "broken block table");
  /* request 0 writes block 2 (positions 8..11); request 1 holds it at the same position */
  b = good, base_point(&b), b.table[6] = 2;
  expect_refused(&b.step, UATTN_ERR_INCONSISTENT, "written this step");
}

Test(planner_errors, drafts) {
  base b;
  b = good, base_point(&b), b.draft_offsets[2] = 0, b.draft_offsets[1] = 2; /* decreasing */
  expect_refused(&b.step, UATTN_ERR_INVALID_ARGUMENT, "draft_offsets");
  b = good, base_point(&b), b.drafts[1] = -5;
  expect_refused(&b.step, UATTN_ERR_INVALID_ARGUMENT, "draft_tokens[1]");
  b = good, base_point(&b), b.draft_offsets[0] = -1;
  expect_refused(&b.step, UATTN_ERR_INVALID_ARGUMENT, "draft_offsets[0] = -1");
}

/* Found by tests/fuzz/fuzz_plan: offsets that rise and fall back to their start list drafts,
 * although first == last; the planner read them through a NULL draft_tokens (SIGSEGV). */
Test(planner_errors, draft_offsets_falling_back_without_draft_tokens) {
  base b = good;
  base_point(&b);
  b.step.num_reqs = 2;
  b.draft_offsets[0] = 0, b.draft_offsets[1] = 2, b.draft_offsets[2] = 0;
  b.step.draft_tokens = NULL;
  expect_refused(&b.step, UATTN_ERR_INVALID_ARGUMENT, "draft_offsets[2] = 0 < draft_offsets[1] = 2");
  b.step.draft_tokens = b.drafts; /* with the drafts there, the offsets are still refused */
  expect_refused(&b.step, UATTN_ERR_INVALID_ARGUMENT, "non-decreasing");
}

Test(planner_errors, config) {
  uattn_plan *p = NULL;
  uattn_plan_config c = uattn_plan_config_default(0, 8, 3, 16, 64);
  cr_assert_eq(uattn_plan_create(&c, &p), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(uattn_last_error(), "block_size"));
  c = uattn_plan_config_default(256, INT32_MAX / 16, 3, 16, 64);
  cr_assert_eq(uattn_plan_create(&c, &p), UATTN_ERR_OVERFLOW);
  c = uattn_plan_config_default(4, 8, 0, 16, 64);
  cr_assert_eq(uattn_plan_create(&c, &p), UATTN_ERR_INVALID_ARGUMENT);
  c = uattn_plan_config_default(4, 8, 3, 16, 64);
  c.chunk_size = -1;
  cr_assert_eq(uattn_plan_create(&c, &p), UATTN_ERR_INVALID_ARGUMENT);
  c = uattn_plan_config_default(4, 8, 3, 16, 64);
  c.bucketing.mode = UATTN_BUCKETING_CUSTOM;
  cr_assert_eq(uattn_plan_create(&c, &p), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(uattn_last_error(), "bucketing.fn"));
  c = uattn_plan_config_default(4, 8, 3, 16, 64);
  uattn_allocator half = {.alloc = NULL, .free = NULL, .user = NULL};
  half.free = (void (*)(void *, void *))0x1; /* free without alloc */
  c.allocator = &half;
  cr_assert_eq(uattn_plan_create(&c, &p), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_null(p, "nothing is returned on failure");
  cr_assert_eq(uattn_plan_create(NULL, &p), UATTN_ERR_INVALID_ARGUMENT);
}

/* Context parallelism's fields: each bad value refused with its name, nothing returned; 0 is the default. */
Test(planner_errors, context_parallel_config) {
  struct {
    int32_t size, rank, interleave;
    uattn_status want;
    const char *needle;
  } cases[] = {
      {-1, 0, 1, UATTN_ERR_INVALID_ARGUMENT, "cp_size = -1"},
      {2, 2, 1, UATTN_ERR_INVALID_ARGUMENT, "cp_rank = 2 must be in [0, cp_size = 2)"},
      {2, -1, 1, UATTN_ERR_INVALID_ARGUMENT, "cp_rank = -1"},
      {0, 1, 1, UATTN_ERR_INVALID_ARGUMENT, "cp_size = 1"}, /* 0 is one rank: rank 1 is not there */
      {2, 0, -3, UATTN_ERR_INVALID_ARGUMENT, "cp_interleave = -3"},
      {65536, 0, 65536, UATTN_ERR_OVERFLOW, "cp_size * cp_interleave"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    uattn_plan_config c = uattn_plan_config_default(4, 8, 3, 16, 64);
    c.cp_size = cases[i].size, c.cp_rank = cases[i].rank, c.cp_interleave = cases[i].interleave;
    uattn_plan *p = NULL;
    cr_assert_eq(uattn_plan_create(&c, &p), cases[i].want, "case %zu: %s", i, uattn_last_error());
    cr_assert_not_null(strstr(uattn_last_error(), cases[i].needle), "case %zu: %s", i, uattn_last_error());
    cr_assert_null(p, "nothing is returned on failure");
  }
  uattn_plan_config c = uattn_plan_config_default(4, 8, 3, 16, 64);
  cr_assert_eq(c.cp_size * 100 + c.cp_rank * 10 + c.cp_interleave, 101, "the defaults are 1, 0, 1");
  c.cp_size = c.cp_rank = c.cp_interleave = 0; /* a zeroed config: the defaults */
  uattn_plan *p = NULL;
  cr_assert_eq(uattn_plan_create(&c, &p), UATTN_OK, "%s", uattn_last_error());
  uattn_plan_destroy(p);
}

/* A rank's block table covers its local positions: a row too short for them is refused, the plan kept. */
Test(planner_errors, context_parallel_local_table_too_short) {
  uattn_plan_config c = uattn_plan_config_default(4, 8, 3, 16, 64);
  c.cp_size = 2, c.cp_rank = 0, c.cp_interleave = 3;
  uattn_plan *p;
  cr_assert_eq(uattn_plan_create(&c, &p), UATTN_OK, "%s", uattn_last_error());
  /* a decode at position 20: rank 0 holds 0-2, 6-8, 12-14, 18-20, 12 keys, 3 local blocks */
  int32_t nc = 20, ns = 1, np = 4, table[3] = {5, 1, 7};
  uattn_step s = step_requests(1, &nc, &ns, &np, table, 3);
  cr_assert_eq(uattn_plan_step(p, &s), UATTN_OK, "%s", uattn_last_error());
  uattn_plan_info info;
  uattn_plan_get_info(p, &info);
  cr_assert_eq(info.slot_mapping[0], 7 * 4 + 3, "local position 11 is slot 3 of the third block");
  cr_assert_eq(info.token_context_lens[0], 12);
  s.block_table_stride = 2;
  cr_assert_eq(uattn_plan_step(p, &s), UATTN_ERR_OUT_OF_RANGE);
  cr_assert_not_null(strstr(uattn_last_error(), "local position 11 is past its block-table row"), "%s",
                     uattn_last_error());
  uattn_plan_get_info(p, &info);
  cr_assert_eq(info.slot_mapping[0], 7 * 4 + 3, "the plan still holds the previous step");
  uattn_plan_destroy(p);
}

static uattn_status shrinking_policy(void *user, bool prompts, const uattn_bucket *exact, uattn_bucket *out) {
  (void)user, (void)prompts;
  *out = *exact;
  out->query_len -= 1;
  return UATTN_OK;
}

static uattn_status failing_policy(void *user, bool prompts, const uattn_bucket *exact, uattn_bucket *out) {
  (void)user, (void)prompts, (void)exact, (void)out;
  return UATTN_ERR_UNSUPPORTED;
}

static int32_t negative_padding(void *user, int32_t size) {
  (void)user, (void)size;
  return -1;
}

Test(planner_errors, bucketing_callbacks) {
  base b;
  base_init(&b);
  uattn_bucketing_mode modes[] = {UATTN_BUCKETING_CUSTOM, UATTN_BUCKETING_CUSTOM, UATTN_BUCKETING_NONE};
  uattn_bucket_fn fns[] = {shrinking_policy, failing_policy, NULL};
  uattn_status want[] = {UATTN_ERR_INCONSISTENT, UATTN_ERR_UNSUPPORTED, UATTN_ERR_INCONSISTENT};
  for (int i = 0; i < 3; i++) {
    uattn_plan_config c = uattn_plan_config_default(4, 8, 3, 16, 64);
    c.bucketing.mode = modes[i];
    c.bucketing.fn = fns[i];
    if (i == 2) c.bucketing.dp_padding = negative_padding;
    uattn_plan *p;
    cr_assert_eq(uattn_plan_create(&c, &p), UATTN_OK);
    cr_assert_eq(uattn_plan_step(p, &b.step), want[i], "case %d: %s", i, uattn_last_error());
    uattn_plan_destroy(p);
  }
}

Test(planner_errors, materialize_refuses_a_shared_bias_over_the_limit) {
  uattn_plan_config c = uattn_plan_config_default(4, 8, 3, 16, 64);
  c.shared_bias_byte_limit = 64; /* [10 rows, 2 shared blocks, 4] floats = 320 bytes */
  uattn_plan *p;
  cr_assert_eq(uattn_plan_create(&c, &p), UATTN_OK);
  cr_assert_eq(uattn_plan_step(p, &good.step), UATTN_OK, "%s", uattn_last_error());
  uattn_graph_tensors t;
  memset(&t, 0x5a, sizeof t);
  uattn_graph_tensors untouched = t;
  cr_assert_eq(uattn_plan_materialize(p, UATTN_GRAPH_SHARED_BIAS | UATTN_GRAPH_CAUSAL_BIAS, &t), UATTN_ERR_TOO_LARGE);
  cr_assert_not_null(strstr(uattn_last_error(), "shared_bias_byte_limit"));
  cr_assert_eq(memcmp(&t, &untouched, sizeof t), 0, "nothing written on refusal");
  cr_assert_eq(uattn_plan_materialize(p, 1u << 20, &t), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_plan_materialize(p, UATTN_GRAPH_SHARED_USAGE, &t), UATTN_OK, "the dense usage table is fine");
  uattn_plan_destroy(p);
}

Test(planner_errors, bucket_range_arguments) {
  int32_t out[11], n;
  cr_assert_eq(uattn_bucket_range(5, 4, 1, out, 11, &n), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_bucket_range(0, 64, 0, out, 11, &n), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_bucket_range(1, 4096, 1, out, 3, &n), UATTN_ERR_CAPACITY);
  cr_assert_eq(uattn_bucket_range(1, 4096, 1, NULL, 11, &n), UATTN_ERR_INVALID_ARGUMENT);
}
