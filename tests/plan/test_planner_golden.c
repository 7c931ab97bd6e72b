/* The planner against golden outputs of an independent numpy re-statement of the seed
 * (tests/ref/seed_unified_batch.py, run by ctest before this suite). Every case is checked against the
 * reference's uattn mode on every output, and against its literal seed mode on the outputs where the seed is
 * right for that batch (the case's "parity" list). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/support.h"

#define MAX_INTS (1 << 20)

static cJSON *golden;

static void load(void) {
  golden = test_load_json(test_fixture_path("planner_golden.json"));
  cr_assert_not_null(golden, "run ctest (it makes the fixture), or %s tests/ref/seed_unified_batch.py golden",
                     test_env("UATTN_PYTHON", "/usr/bin/python3"));
}

static void unload(void) { cJSON_Delete(golden); }

/* A whole JSON int array, flattening one level of nesting ([[..],[..]] rows). */
static int32_t json_flat(const cJSON *a, int32_t *out, int32_t cap, int32_t *cols) {
  int32_t n = 0;
  *cols = 0;
  const cJSON *item;
  cJSON_ArrayForEach(item, a) {
    if (cJSON_IsArray(item)) {
      int32_t k = test_json_ints(item, out + n, cap - n);
      cr_assert(k >= 0, "bad nested array");
      if (*cols == 0) *cols = k;
      n += k;
    } else {
      cr_assert(cJSON_IsNumber(item) && n < cap);
      out[n++] = (int32_t)item->valuedouble;
    }
  }
  return n;
}

typedef struct loaded_step {
  int32_t nc[1024], ns[1024], np[1024], offsets[1025];
  int32_t *table, *ids, *drafts;
  uattn_step step;
} loaded_step;

static void load_step(const cJSON *js, loaded_step *l) {
  memset(&l->step, 0, sizeof l->step);
  int32_t cols;
  const int32_t n = json_flat(cJSON_GetObjectItem(js, "num_computed"), l->nc, 1024, &cols);
  json_flat(cJSON_GetObjectItem(js, "num_scheduled"), l->ns, 1024, &cols);
  json_flat(cJSON_GetObjectItem(js, "num_prompt"), l->np, 1024, &cols);
  l->table = malloc(sizeof(int32_t) * MAX_INTS);
  l->ids = malloc(sizeof(int32_t) * MAX_INTS);
  l->drafts = malloc(sizeof(int32_t) * MAX_INTS);
  json_flat(cJSON_GetObjectItem(js, "block_table"), l->table, MAX_INTS, &l->step.block_table_stride);
  l->step.num_reqs = n;
  l->step.num_computed = l->nc;
  l->step.num_scheduled = l->ns;
  l->step.num_prompt = l->np;
  l->step.block_table = l->table;
  const cJSON *ids = cJSON_GetObjectItem(js, "token_ids");
  if (cJSON_IsArray(ids)) {
    json_flat(ids, l->ids, MAX_INTS, &l->step.token_ids_stride);
    l->step.token_ids = l->ids;
  }
  const cJSON *drafts = cJSON_GetObjectItem(js, "draft_tokens");
  if (cJSON_IsArray(drafts)) {
    int32_t k = 0, r = 0;
    const cJSON *row;
    l->offsets[0] = 0;
    cJSON_ArrayForEach(row, drafts) {
      k += test_json_ints(row, l->drafts + k, MAX_INTS - k);
      l->offsets[++r] = k;
    }
    l->step.draft_tokens = l->drafts;
    l->step.draft_offsets = l->offsets;
  }
  l->step.async_scheduling = cJSON_IsTrue(cJSON_GetObjectItem(js, "async_scheduling"));
}

static void free_step(loaded_step *l) {
  free(l->table);
  free(l->ids);
  free(l->drafts);
}

static uattn_plan_config load_config(const cJSON *c) {
#define INT(k) (int32_t) cJSON_GetObjectItem(c, k)->valuedouble
  uattn_plan_config cfg = uattn_plan_config_default(INT("block_size"), INT("num_blocks"), INT("max_num_seqs"),
                                                    INT("max_num_batched_tokens"), INT("max_model_len"));
  cfg.chunk_size = INT("chunk_size");
#undef INT
  cfg.bucketing.mode = strcmp(cJSON_GetObjectItem(c, "bucketing")->valuestring, "seed") == 0
                           ? UATTN_BUCKETING_EXPONENTIAL
                           : UATTN_BUCKETING_NONE;
  cfg.shared_bias_byte_limit = (size_t)1 << 30;
  return cfg;
}

/* Everything the C planner reports, in the reference's representation. */
typedef struct actual {
  const char *key;
  int32_t *v;
  int32_t n;
} actual;

typedef struct actuals {
  actual a[40];
  int count;
  int32_t *storage;
  int32_t used;
} actuals;

static int32_t *put(actuals *s, const char *key, int32_t n) {
  cr_assert(s->used + n <= MAX_INTS);
  actual *a = &s->a[s->count++];
  a->key = key;
  a->v = s->storage + s->used;
  a->n = n;
  s->used += n;
  return a->v;
}

static void put_copy(actuals *s, const char *key, const int32_t *x, int32_t n) {
  int32_t *v = put(s, key, n);
  if (n) memcpy(v, x, sizeof(int32_t) * (size_t)n);
}

static void collect(uattn_plan *plan, actuals *s) {
  uattn_plan_info in;
  uattn_plan_get_info(plan, &in);
  const int32_t T = in.num_tokens, R = in.num_reqs, S = in.num_shared_blocks;
  put_copy(s, "num_scheduled", in.num_scheduled, R);
  put_copy(s, "query_start_loc", in.query_start_loc, R + 1);
  put_copy(s, "seq_lens", in.seq_lens, R);
  int32_t *v = put(s, "is_prompt", R);
  for (int32_t r = 0; r < R; r++) v[r] = in.is_prompt[r];
  put_copy(s, "num_output_tokens", in.num_output_tokens, R);
  put_copy(s, "token_groups", in.token_groups, T);
  put_copy(s, "token_offsets", in.token_offsets, T);
  put_copy(s, "token_positions", in.token_positions, T);
  if (in.token_ids) put_copy(s, "token_ids", in.token_ids, T);
  v = put(s, "slot_mapping", T);
  for (int32_t t = 0; t < T; t++) v[t] = (int32_t)in.slot_mapping[t];
  put_copy(s, "token_context_lens", in.token_context_lens, T);
  put_copy(s, "logits_indices", in.logits_indices, in.num_logits);
  put_copy(s, "logits_groups", in.logits_groups, in.num_logits);
  put_copy(s, "new_token_positions", in.new_token_positions, in.num_logits);
  put_copy(s, "invalid_req_indices", in.invalid_req_indices, in.num_invalid_reqs);
  put_copy(s, "shared_blocks", in.shared_blocks, S);
  v = put(s, "unique_blocks", 4 * in.num_unique_blocks);
  for (int32_t k = 0; k < in.num_unique_blocks; k++) {
    v[4 * k] = in.unique_blocks[k].block;
    v[4 * k + 1] = in.unique_blocks[k].token;
    v[4 * k + 2] = in.unique_blocks[k].block_start;
    v[4 * k + 3] = in.unique_blocks[k].usage;
  }
  const uattn_bucket *bk[2] = {&in.exact, &in.padded};
  const char *bkey[2] = {"exact_bucket", "padded_bucket"};
  for (int i = 0; i < 2; i++) {
    v = put(s, bkey[i], 4);
    v[0] = bk[i]->query_len, v[1] = bk[i]->shared_blocks, v[2] = bk[i]->unique_blocks, v[3] = bk[i]->logits;
  }
  *put(s, "bucket_fallback", 1) = in.bucket_fallback;

  /* the dense tensors, through the seed-format export; the padding around them is checked here */
  uattn_graph_tensors t;
  cr_assert_eq(uattn_plan_materialize(plan,
                                      UATTN_GRAPH_CAUSAL_BIAS | UATTN_GRAPH_SHARED_USAGE | UATTN_GRAPH_SHARED_BIAS |
                                          UATTN_GRAPH_UNIQUE_BIAS | UATTN_GRAPH_PADDED_IDS,
                                      &t),
               UATTN_OK, "%s", uattn_last_error());
  const int32_t tq = t.shape.query_len, ts = t.shape.shared_blocks, tu = t.shape.unique_blocks, bs = in.block_size;
  v = put(s, "shared_usage", T * S);
  for (int32_t i = 0; i < tq; i++)
    for (int32_t j = 0; j < ts; j++) {
      const int32_t u = t.shared_usage[i * ts + j];
      /* the bias agrees with the usage: u visible keys, then -inf */
      for (int32_t k = 0; k < bs; k++) {
        const float b = t.shared_bias[((size_t)i * ts + j) * bs + k];
        cr_assert(k < u ? b == 0.0f : (isinf(b) && b < 0), "shared bias [%d,%d,%d] vs usage %d", i, j, k, u);
      }
      if (i < T && j < S)
        v[i * S + j] = u;
      else
        cr_assert_eq(u, 0, "padding of the usage table is 0");
    }
  if (T <= 64) {
    v = put(s, "causal_mask", T * T);
    for (int32_t i = 0; i < tq; i++)
      for (int32_t j = 0; j < tq; j++) {
        const float b = t.causal_bias[(size_t)i * tq + j];
        if (i < T && j < T)
          v[i * T + j] = b == 0.0f;
        else
          cr_assert(isinf(b), "padding of the causal bias is -inf");
      }
  }
  const int32_t U = in.exact.unique_blocks;
  int32_t *map = put(s, "unique_block_mapping", U), *usage = put(s, "unique_usage", U);
  for (int32_t b = 0; b < tu; b++) {
    int32_t u = 0;
    while (u < bs && t.unique_bias[(size_t)b * bs + u] == 0.0f) u++;
    if (b < U) {
      map[b] = t.unique_block_mapping[b];
      usage[b] = u;
    } else {
      cr_assert(t.unique_block_mapping[b] == -1 && u == 0, "padding of the unique tensors");
    }
  }
  for (int32_t i = 0; i < tq; i++) {
    cr_assert_eq(t.slot_mapping[i], i < T ? in.slot_mapping[i] : -1);
    cr_assert_eq(t.token_positions[i], i < T ? in.token_positions[i] : -1);
  }
  for (int32_t i = 0; i < t.shape.logits; i++)
    cr_assert_eq(t.logits_indices[i], i < in.num_logits ? in.logits_indices[i] : -1);
}

static const actual *find(const actuals *s, const char *key) {
  for (int i = 0; i < s->count; i++)
    if (!strcmp(s->a[i].key, key)) return &s->a[i];
  return NULL;
}

static bool in_list(const cJSON *list, const char *key) {
  const cJSON *item;
  cJSON_ArrayForEach(item, list) if (cJSON_IsString(item) && !strcmp(item->valuestring, key)) return true;
  return false;
}

/* Compares every expected key (of `keys`, or all of them) with what the planner reported. */
static int compare(const char *name, const char *mode, const cJSON *expected, const cJSON *keys, const actuals *s,
                   int32_t *buf) {
  int checked = 0;
  const cJSON *item;
  cJSON_ArrayForEach(item, expected) {
    const char *key = item->string;
    if (!strcmp(key, "parity") || !strcmp(key, "buckets")) continue;
    if (keys && !in_list(keys, key)) continue;
    if (cJSON_IsNull(item)) {
      cr_assert(!strcmp(key, "causal_mask") || !strcmp(key, "token_ids"), "%s: %s is null", name, key);
      continue;
    }
    int32_t n, cols;
    if (cJSON_IsBool(item) || cJSON_IsNumber(item)) {
      buf[0] = cJSON_IsBool(item) ? cJSON_IsTrue(item) : (int32_t)item->valuedouble;
      n = 1;
    } else {
      n = json_flat(item, buf, MAX_INTS, &cols);
    }
    const actual *a = find(s, key);
    cr_assert_not_null(a, "%s: the planner reports no %s", name, key);
    cr_assert_eq(a->n, n, "%s (%s mode): %s has %d values, the reference %d", name, mode, key, a->n, n);
    for (int32_t i = 0; i < n; i++)
      cr_assert_eq(a->v[i], buf[i], "%s (%s mode): %s[%d] = %d, the reference says %d", name, mode, key, i, a->v[i],
                   buf[i]);
    checked++;
  }
  return checked;
}

Test(planner_golden, every_case_matches_the_numpy_reference, .init = load, .fini = unload, .timeout = 300) {
  const cJSON *cases = cJSON_GetObjectItem(golden, "cases");
  cr_assert(cJSON_GetArraySize(cases) >= 100, "the fixture holds too few cases");
  int32_t *buf = malloc(sizeof(int32_t) * MAX_INTS);
  actuals s = {.storage = malloc(sizeof(int32_t) * MAX_INTS)};
  int seed_checks = 0, cases_run = 0;
  const cJSON *c;
  cJSON_ArrayForEach(c, cases) {
    const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
    uattn_plan_config cfg = load_config(cJSON_GetObjectItem(c, "config"));
    uattn_plan *plan;
    cr_assert_eq(uattn_plan_create(&cfg, &plan), UATTN_OK, "%s: %s", name, uattn_last_error());
    loaded_step l;
    load_step(cJSON_GetObjectItem(c, "step"), &l);
    cr_assert_eq(uattn_plan_step(plan, &l.step), UATTN_OK, "%s: %s", name, uattn_last_error());
    s.count = 0, s.used = 0;
    collect(plan, &s);
    compare(name, "uattn", cJSON_GetObjectItem(c, "uattn"), NULL, &s, buf);
    const cJSON *seed = cJSON_GetObjectItem(c, "seed");
    seed_checks += compare(name, "seed", seed, cJSON_GetObjectItem(seed, "parity"), &s, buf);

    /* the bucket list, where the case carries one */
    const cJSON *buckets = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "uattn"), "buckets");
    if (cJSON_GetArraySize(buckets) > 0) {
      int32_t n = 0;
      cr_assert_eq(uattn_plan_buckets(plan, NULL, NULL, 0, &n), UATTN_OK);
      cr_assert_eq(n, cJSON_GetArraySize(buckets), "%s: %d buckets, the reference %d", name, n,
                   cJSON_GetArraySize(buckets));
      uattn_bucket *list = malloc(sizeof *list * (size_t)n);
      bool *causal = malloc(sizeof *causal * (size_t)n);
      cr_assert_eq(uattn_plan_buckets(plan, list, causal, n, &n), UATTN_OK);
      int32_t i = 0;
      const cJSON *b;
      cJSON_ArrayForEach(b, buckets) {
        int32_t want[4];
        test_json_ints(b, want, 4);
        cr_assert(list[i].query_len == want[0] && list[i].shared_blocks == want[1] &&
                      list[i].unique_blocks == want[2] && causal[i] == want[3],
                  "%s: bucket %d is (%d,%d,%d,%d), the reference (%d,%d,%d,%d)", name, i, list[i].query_len,
                  list[i].shared_blocks, list[i].unique_blocks, causal[i], want[0], want[1], want[2], want[3]);
        i++;
      }
      free(list);
      free(causal);
    }
    free_step(&l);
    uattn_plan_destroy(plan);
    cases_run++;
  }
  cr_assert(seed_checks > 1000, "parity with the literal seed was checked on only %d outputs", seed_checks);
  free(buf);
  free(s.storage);
}

Test(planner_golden, bucket_ranges_match_the_seed, .init = load, .fini = unload) {
  const cJSON *ranges = cJSON_GetObjectItem(golden, "bucket_ranges"), *r;
  cr_assert(cJSON_GetArraySize(ranges) > 0);
  cJSON_ArrayForEach(r, ranges) {
    const int32_t min = (int32_t)cJSON_GetObjectItem(r, "min")->valuedouble,
                  max = (int32_t)cJSON_GetObjectItem(r, "max")->valuedouble,
                  round_up = (int32_t)cJSON_GetObjectItem(r, "round_up")->valuedouble;
    int32_t want[16], got[16], n;
    const int32_t nw = test_json_ints(cJSON_GetObjectItem(r, "values"), want, 16);
    cr_assert_eq(uattn_bucket_range(min, max, round_up, got, 16, &n), UATTN_OK, "%s", uattn_last_error());
    cr_assert_eq(n, nw, "range (%d, %d, %d): %d points, the reference %d", min, max, round_up, n, nw);
    for (int32_t i = 0; i < n; i++) cr_assert_eq(got[i], want[i], "range (%d, %d, %d)[%d]", min, max, round_up, i);
  }
}
