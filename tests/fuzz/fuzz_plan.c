/* libFuzzer target: uattn_plan_create and up to three uattn_plan_step calls on a config and steps decoded
 * from the input (every field of uattn_step, drafts and block tables included, each pointer NULL when an
 * input bit says so), then uattn_plan_get_info, uattn_plan_get_stats, uattn_plan_buckets and
 * uattn_plan_materialize, whose arrays are read in full so ASan checks the lengths the header gives them.
 * Findings besides crashes: a refused call without a message, a failed create that returns a plan, and a
 * refused step that changes what the plan reports. Sizes stay small so one input runs in microseconds. */
#include <stdio.h>

#include "fuzz_input.h"
#include "uattn.h"

#define FUZZ_CHECK(cond, what)                                                                                         \
  do {                                                                                                                 \
    if (!(cond)) {                                                                                                     \
      fprintf(stderr, "fuzz_plan: %s (%s)\n", what, uattn_last_error());                                               \
      abort();                                                                                                         \
    }                                                                                                                  \
  } while (0)

/* An allocator that refuses its n-th request, so the planner's out-of-memory paths run too. */
typedef struct failing_allocator {
  int32_t calls, fail_at; /* fail_at 0: never */
} failing_allocator;

static void *failing_alloc(void *user, size_t bytes) {
  failing_allocator *a = user;
  if (++a->calls == a->fail_at) return NULL;
  return aligned_alloc(64, (bytes + 63) / 64 * 64);
}

static void plain_free(void *user, void *ptr) {
  (void)user;
  free(ptr);
}

/* A custom bucket policy that adds the input's padding to each dimension; negative padding is a policy
 * that breaks its contract (the planner must refuse the shape). */
static uattn_status padding_policy(void *user, bool prompts, const uattn_bucket *exact, uattn_bucket *out) {
  const int32_t *pad = user;
  (void)prompts;
  if (pad[0] == 7) return UATTN_ERR_UNSUPPORTED;
  out->query_len = exact->query_len + pad[0];
  out->shared_blocks = exact->shared_blocks + pad[1];
  out->unique_blocks = exact->unique_blocks + pad[2];
  out->logits = exact->logits + pad[3];
  return UATTN_OK;
}

static int32_t dp_padding(void *user, int32_t size) {
  (void)size;
  return *(const int32_t *)user;
}

/* Sums the bytes of an array the plan reports: reading each one is what lets ASan check its length. */
static uint64_t sum_bytes(const void *p, size_t bytes) {
  const uint8_t *b = p;
  uint64_t s = 0;
  for (size_t i = 0; i < bytes; i++) s = s * 31 + b[i];
  return s;
}

#define SUM(p, n) ((p) ? sum_bytes((p), sizeof *(p) * (size_t)(n)) : 7)

/* Everything get_info reports, read in full and folded into one number. */
static uint64_t info_digest(const uattn_plan *plan) {
  uattn_plan_info in;
  FUZZ_CHECK(uattn_plan_get_info(plan, &in) == UATTN_OK, "get_info failed on a live plan");
  FUZZ_CHECK(in.num_reqs >= 0 && in.num_tokens >= 0 && in.num_logits >= 0, "negative counts in the info");
  const int32_t R = in.num_reqs, T = in.num_tokens;
  uint64_t s = sum_bytes(&in.exact, sizeof in.exact) + sum_bytes(&in.padded, sizeof in.padded);
  s = s * 3 + SUM(in.num_scheduled, R) + SUM(in.query_start_loc, R + 1) + SUM(in.seq_lens, R) + SUM(in.is_prompt, R) +
      SUM(in.num_output_tokens, R);
  s = s * 3 + SUM(in.token_groups, T) + SUM(in.token_offsets, T) + SUM(in.token_positions, T) + SUM(in.token_ids, T) +
      SUM(in.slot_mapping, T) + SUM(in.token_context_lens, T);
  s = s * 3 + SUM(in.logits_indices, in.num_logits) + SUM(in.logits_groups, in.num_logits) +
      SUM(in.new_token_positions, in.num_logits) + SUM(in.invalid_req_indices, in.num_invalid_reqs);
  s = s * 3 + SUM(in.shared_blocks, in.num_shared_blocks) + SUM(in.shared_spans, in.num_shared_spans) +
      SUM(in.unique_blocks, in.num_unique_blocks);
  return s + (uint64_t)R * 7 + (uint64_t)T * 11 + in.contains_prompts + in.bucket_fallback;
}

static void materialize(uattn_plan *plan, unsigned what) {
  uattn_graph_tensors t;
  memset(&t, FUZZ_PATTERN, sizeof t);
  const uattn_status st = uattn_plan_materialize(plan, what, &t);
  if (st != UATTN_OK) {
    FUZZ_CHECK(uattn_last_error()[0], "a refused materialize gives no message");
    FUZZ_CHECK(fuzz_untouched(&t, sizeof t), "a refused materialize wrote its output");
    return;
  }
  uattn_plan_info in;
  uattn_plan_get_info(plan, &in);
  const size_t tq = (size_t)t.shape.query_len, ts = (size_t)t.shape.shared_blocks, tu = (size_t)t.shape.unique_blocks,
               tl = (size_t)t.shape.logits, bs = (size_t)in.block_size;
  volatile uint64_t sink = 0;
  if (what & UATTN_GRAPH_CAUSAL_BIAS) sink += SUM(t.causal_bias, tq * tq);
  if (what & UATTN_GRAPH_SHARED_BIAS) sink += SUM(t.shared_bias, tq * ts * bs);
  if (what & UATTN_GRAPH_SHARED_USAGE) sink += SUM(t.shared_usage, tq * ts);
  if (what & UATTN_GRAPH_UNIQUE_BIAS) sink += SUM(t.unique_bias, tu * bs) + SUM(t.unique_block_mapping, tu);
  if (what & UATTN_GRAPH_PADDED_IDS)
    sink += SUM(t.slot_mapping, tq) + SUM(t.token_ids, tq) + SUM(t.token_positions, tq) + SUM(t.logits_indices, tl);
  (void)sink;
}

/* The arrays of one decoded step; NULL fields were not given. */
typedef struct step_arrays {
  int32_t *nc, *ns, *np, *table, *ids, *drafts, *offsets;
} step_arrays;

static void step_arrays_free(step_arrays *a) {
  free(a->nc), free(a->ns), free(a->np), free(a->table), free(a->ids), free(a->drafts), free(a->offsets);
}

/* CSR offsets: mostly non-decreasing from 0 (a request gets 0..3 drafts), sometimes arbitrary values. */
static int32_t *decode_offsets(fuzz_input *in, int32_t n, int32_t *max_offset) {
  int32_t *o = malloc(sizeof(int32_t) * (size_t)(n + 1));
  if (!o) abort();
  const bool arbitrary = fuzz_u8(in) < 32;
  o[0] = arbitrary ? fuzz_range(in, -1, 3) : 0;
  *max_offset = o[0] > 0 ? o[0] : 0;
  for (int32_t r = 0; r < n; r++) {
    o[r + 1] = arbitrary ? fuzz_range(in, -2, 12) : o[r] + fuzz_range(in, 0, 3);
    if (o[r + 1] > *max_offset) *max_offset = o[r + 1];
  }
  return o;
}

static void decode_step(fuzz_input *in, const uattn_plan_config *c, uattn_step *s, step_arrays *a) {
  memset(s, 0, sizeof *s);
  memset(a, 0, sizeof *a);
  const uint8_t nulls = fuzz_u8(in); /* a set bit drops that pointer */
  const int32_t max_seqs = c->max_num_seqs > 0 && c->max_num_seqs < 8 ? c->max_num_seqs : 8;
  s->num_reqs = fuzz_count(in, 0, max_seqs + 1);
  const int32_t n = s->num_reqs > 0 && s->num_reqs <= 9 ? s->num_reqs : 0; /* the arrays' real length */
  const int32_t blocks = c->num_blocks > 0 && c->num_blocks < 64 ? c->num_blocks : 64;
  s->block_table_stride = fuzz_size(in, 0, 8);
  const int32_t stride = s->block_table_stride > 0 && s->block_table_stride <= 8 ? s->block_table_stride : 1;
  if (!(nulls & 1)) a->nc = fuzz_ints(in, n, 0, 24);
  if (!(nulls & 2)) a->ns = fuzz_ints(in, n, 0, 8);
  if (!(nulls & 4)) a->np = fuzz_ints(in, n, 0, 32);
  if (!(nulls & 8)) {
    /* ids mostly in order (requests share a prefix), sometimes any: broken tables are refused */
    a->table = malloc(sizeof(int32_t) * (size_t)(n * stride + 1));
    if (!a->table) abort();
    for (int32_t i = 0; i < n * stride; i++) {
      const uint8_t b = fuzz_u8(in);
      a->table[i] = b < 128   ? (i % stride + (b & 3) * stride) % blocks
                    : b < 240 ? (int32_t)(b % (blocks + 2)) - 1
                              : fuzz_count(in, -1, blocks);
    }
  }
  if (nulls & 16) {
    s->token_ids_stride = fuzz_count(in, 0, 40);
    const int32_t ts = s->token_ids_stride > 0 && s->token_ids_stride <= 40 ? s->token_ids_stride : 0;
    a->ids = fuzz_ints(in, n * ts, 0, 100);
    if (ts == 0) s->token_ids_stride = -fuzz_range(in, 0, 1); /* a stride that cannot be right */
  }
  if (nulls & 32) {
    int32_t max_offset = 0;
    a->offsets = decode_offsets(in, n, &max_offset);
    if (!(nulls & 64)) a->drafts = fuzz_ints(in, max_offset, -2, 50);
  }
  s->num_computed = a->nc;
  s->num_scheduled = a->ns;
  s->num_prompt = a->np;
  s->block_table = a->table;
  s->token_ids = a->ids;
  s->draft_tokens = a->drafts;
  s->draft_offsets = a->offsets;
  s->async_scheduling = nulls & 128;
  /* a count past the arrays' length reads past them; the planner cannot know, so only counts it refuses
   * on their own (negative, over max_num_seqs) are passed with shorter arrays */
  if (s->num_reqs > n && s->num_reqs <= c->max_num_seqs) s->num_reqs = n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_input in = {data, size, 0};
  static const int32_t block_sizes[] = {1, 2, 3, 4, 8, 16, 0, -1};
  uattn_plan_config c = uattn_plan_config_default(block_sizes[fuzz_range(&in, 0, 7)], fuzz_size(&in, 1, 48),
                                                  fuzz_size(&in, 1, 6), fuzz_size(&in, 1, 64), fuzz_size(&in, 1, 128));
  c.chunk_size = fuzz_count(&in, 0, 3);
  int32_t pad[4] = {0, 0, 0, 0}, dp = 0;
  const uint8_t mode = fuzz_u8(&in);
  c.bucketing.mode = (uattn_bucketing_mode)(mode % 4); /* 3 is out of range */
  if (c.bucketing.mode == UATTN_BUCKETING_CUSTOM && !(mode & 16)) c.bucketing.fn = padding_policy;
  c.bucketing.fn_user = pad;
  for (int i = 0; i < 4; i++) pad[i] = fuzz_range(&in, -1, 7);
  if (mode & 32) {
    c.bucketing.dp_padding = dp_padding;
    c.bucketing.dp_padding_user = &dp;
    dp = fuzz_range(&in, -1, 3);
  }
  c.shared_bias_byte_limit = mode & 64 ? (size_t)fuzz_range(&in, 1, 4096) : 0;
  c.split_min_keys = fuzz_count(&in, 0, 16);
  c.split_keys = fuzz_count(&in, 0, 8);
  failing_allocator fa = {0, 0};
  uattn_allocator allocator = {failing_alloc, plain_free, &fa};
  if (mode & 128) {
    fa.fail_at = fuzz_range(&in, 0, 40);
    c.allocator = &allocator;
  }

  uattn_plan *plan = NULL;
  uattn_status st = uattn_plan_create(&c, &plan);
  if (st != UATTN_OK) {
    FUZZ_CHECK(plan == NULL, "a failed uattn_plan_create returned a plan");
    FUZZ_CHECK(uattn_last_error()[0], "a refused uattn_plan_create gives no message");
    return 0;
  }
  const int steps = fuzz_range(&in, 1, 3);
  for (int k = 0; k < steps; k++) {
    uattn_step step;
    step_arrays arrays;
    decode_step(&in, &c, &step, &arrays);
    const uint64_t before = info_digest(plan);
    st = uattn_plan_step(plan, &step);
    if (st != UATTN_OK) {
      FUZZ_CHECK(uattn_last_error()[0], "a refused uattn_plan_step gives no message");
      FUZZ_CHECK(info_digest(plan) == before, "a refused uattn_plan_step changed the plan");
    } else {
      (void)info_digest(plan);
      materialize(plan, fuzz_u8(&in) | (fuzz_bool(&in) ? 1u << 20 : 0));
    }
    step_arrays_free(&arrays);
  }
  uattn_plan_stats stats;
  FUZZ_CHECK(uattn_plan_get_stats(plan, &stats) == UATTN_OK, "get_stats failed on a live plan");
  int32_t cap = fuzz_range(&in, -1, 64), count = 0;
  uattn_bucket *buckets = fuzz_output(sizeof(uattn_bucket) * (size_t)(cap > 0 ? cap : 0));
  bool *causal = fuzz_output((size_t)(cap > 0 ? cap : 0));
  st = uattn_plan_buckets(plan, cap > 0 ? buckets : NULL, cap > 0 && fuzz_bool(&in) ? causal : NULL, cap, &count);
  if (st != UATTN_OK) FUZZ_CHECK(uattn_last_error()[0], "a refused uattn_plan_buckets gives no message");
  free(buckets);
  free(causal);
  uattn_plan_destroy(plan);

  /* the seed's range builder, on its own arguments */
  int32_t range[16], n = 0;
  const int32_t lo = fuzz_count(&in, 0, 64), hi = fuzz_count(&in, 0, 4096), round = fuzz_count(&in, 0, 64);
  if (uattn_bucket_range(lo, hi, round, range, fuzz_range(&in, 0, 16), &n) == UATTN_OK)
    FUZZ_CHECK(n >= 0 && n <= 16, "uattn_bucket_range's count is past its cap");
  return 0;
}
