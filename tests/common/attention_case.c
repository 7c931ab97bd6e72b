#include "common/attention_case.h"

#ifdef UATTN_TEST_STANDALONE
#include "common/standalone_assert.h" /* built into the ThreadSanitizer tests, without Criterion */
#else
#include <criterion/criterion.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

/* ---- batches ------------------------------------------------------------------------------------------ */

static rb_pool pool; /* large: off the stack */

static void batch_begin(rb_batch *b, int32_t bs, test_rng *rng) {
  memset(b, 0, sizeof *b);
  b->stride = (RB_MAX_LEN + bs - 1) / bs;
  rb_pool_init(&pool, rng, RB_MAX_BLOCKS);
  b->has_ids = false;
}

/* Adds a request whose first prefix_blocks blocks are `prefix` (already cached, shared). real_drafts > 0
 * makes it a spec-decode request (ns must be 1 then); placeholders -1 are added after the real drafts. */
static bool batch_add(rb_batch *b, int32_t bs, int32_t nc, int32_t ns, int32_t np, const int32_t *prefix,
                      int32_t prefix_blocks, int32_t real_drafts, int32_t placeholders, test_rng *rng) {
  const int32_t r = b->num_reqs, ns_real = real_drafts > 0 ? real_drafts + 1 : ns;
  int32_t tokens = 0;
  for (int32_t i = 0; i < r; i++) {
    const int32_t d = b->draft_offsets[i + 1] - b->draft_offsets[i];
    int32_t real = 0;
    for (int32_t k = 0; k < d; k++) real += b->draft_tokens[b->draft_offsets[i] + k] != -1;
    tokens += d > 0 ? real + 1 : b->num_scheduled[i];
  }
  if (r >= RB_MAX_REQS || tokens + ns_real > RB_MAX_TOKENS || nc + ns_real > RB_MAX_LEN) return false;
  if (real_drafts + placeholders > RB_MAX_DRAFTS) return false;
  b->num_computed[r] = nc;
  b->num_scheduled[r] = real_drafts > 0 ? 1 + real_drafts + placeholders : ns; /* as a scheduler reports */
  b->num_prompt[r] = np;
  int32_t d = b->draft_offsets[r];
  for (int32_t k = 0; k < real_drafts; k++) b->draft_tokens[d++] = test_rng_range(rng, 0, 1000);
  for (int32_t k = 0; k < placeholders; k++) b->draft_tokens[d++] = -1;
  b->draft_offsets[r + 1] = d;
  b->has_drafts |= d > 0;
  int32_t *row = b->block_table + (size_t)r * b->stride;
  for (int32_t i = 0; i < b->stride; i++) row[i] = -1;
  const int32_t nblocks = (nc + ns_real + bs - 1) / bs;
  for (int32_t i = 0; i < nblocks; i++) row[i] = i < prefix_blocks ? prefix[i] : pool.ids[pool.next++];
  b->num_reqs = r + 1;
  return true;
}

static void make_batch(batch_kind kind, int32_t bs, test_rng *rng, rb_batch *b) {
  batch_begin(b, bs, rng);
  int32_t prefix[RB_MAX_LEN];
  const int32_t prefix_blocks = test_rng_range(rng, 1, 400 / bs + 1);
  for (int32_t i = 0; i < prefix_blocks; i++) prefix[i] = pool.ids[pool.next++];
  const int32_t hit = prefix_blocks * bs;
  switch (kind) {
  case BATCH_DECODE:
    for (int32_t r = test_rng_range(rng, 1, 8); r > 0; r--) {
      const int32_t nc = test_rng_range(rng, 1, 900);
      batch_add(b, bs, nc, 1, test_rng_range(rng, 1, nc), NULL, 0, 0, 0, rng);
    }
    break;
  case BATCH_PREFILL:
    for (int32_t r = test_rng_range(rng, 1, 4); r > 0; r--) {
      const int32_t n = test_rng_range(rng, 1, 120);
      batch_add(b, bs, 0, n, n, NULL, 0, 0, 0, rng);
    }
    break;
  case BATCH_PREFIX_PREFILL:
    for (int32_t r = test_rng_range(rng, 1, 4); r > 0; r--) {
      const int32_t n = test_rng_range(rng, 1, 100);
      batch_add(b, bs, hit, n, hit + n, prefix, prefix_blocks, 0, 0, rng);
    }
    break;
  case BATCH_CHUNKED_LONG: {
    const int32_t nc = test_rng_range(rng, 600, 880), n = test_rng_range(rng, 32, 120);
    batch_add(b, bs, nc, n, nc + n + 50, NULL, 0, 0, 0, rng);
    batch_add(b, bs, 700, 1, 300, NULL, 0, 0, 0, rng); /* a decode alongside */
    break;
  }
  case BATCH_MIXED:
    batch_add(b, bs, 0, 40, 40, NULL, 0, 0, 0, rng);
    batch_add(b, bs, hit, 30, hit + 60, prefix, prefix_blocks, 0, 0, rng); /* a partial chunk */
    batch_add(b, bs, 200, 50, 250, NULL, 0, 0, 0, rng);                    /* the chunk that finishes */
    for (int32_t r = 0; r < 3; r++) batch_add(b, bs, test_rng_range(rng, 1, 500), 1, 1, NULL, 0, 0, 0, rng);
    batch_add(b, bs, 300, 1, 100, NULL, 0, 3, 1, rng);
    break;
  case BATCH_SPEC_DECODE:
    for (int32_t r = test_rng_range(rng, 1, 6); r > 0; r--)
      batch_add(b, bs, test_rng_range(rng, 1, 800), 1, 1, NULL, 0, test_rng_range(rng, 1, 7), test_rng_range(rng, 0, 1),
                rng);
    break;
  case BATCH_SHARED_PREFIX:
    for (int32_t r = 0; r < 8; r++)
      batch_add(b, bs, hit + test_rng_range(rng, 0, 100), 1, hit, prefix, prefix_blocks, 0, 0, rng);
    for (int32_t r = 0; r < 2; r++) batch_add(b, bs, hit + 5, 1, hit, prefix, prefix_blocks, 4, 0, rng);
    for (int32_t r = 0; r < 2; r++) batch_add(b, bs, hit, 20, hit + 20, prefix, prefix_blocks, 0, 0, rng);
    break;
  case BATCH_EMPTY: break;
  }
}

/* ---- inputs -------------------------------------------------------------------------------------------- */

static void *random_array(uattn_dtype dtype, size_t n, test_rng *rng) {
  void *x = malloc(n * oracle_dtype_size(dtype) + 1);
  for (size_t i = 0; i < n; i++) oracle_store(x, dtype, i, 2.0 * test_rng_unit(rng) - 1.0);
  return x;
}

static void *copy_of(const void *x, size_t bytes) {
  void *y = malloc(bytes + 1);
  memcpy(y, x, bytes);
  return y;
}

/* The pool hands out ids from the whole id space; a cache that large would dwarf the test. Renames the ids
 * handed out to a random permutation of [0, used + 3) (blocks_in_order: to [0, used) in the order they were
 * handed out), so the cache holds what the step uses and a few blocks nobody does. */
static void compact_block_ids(attention_run *run, test_rng *rng) {
  static int32_t rename[RB_MAX_BLOCKS], perm[RB_MAX_BLOCKS];
  run->num_blocks = pool.next + 3;
  for (int32_t i = 0; i < run->num_blocks; i++) perm[i] = i;
  for (int32_t i = run->num_blocks - 1; i > 0 && !run->c.blocks_in_order; i--) {
    const int32_t j = test_rng_range(rng, 0, i), x = perm[i];
    perm[i] = perm[j];
    perm[j] = x;
  }
  for (int32_t i = 0; i < pool.next; i++) rename[pool.ids[i]] = perm[i];
  rb_batch *b = &run->batch;
  for (int32_t i = 0; i < b->num_reqs * b->stride; i++)
    if (b->block_table[i] >= 0) b->block_table[i] = rename[b->block_table[i]];
  for (int32_t r = 0; r < b->num_reqs; r++)
    for (int32_t k = 0; k * run->c.block_size < run->encoder_lens[r]; k++)
      run->cross_table[r * 64 + k] = rename[run->cross_table[r * 64 + k]];
}

void attention_run_build(attention_run *run, const attention_case *c) {
  memset(run, 0, sizeof *run);
  run->c = *c;
  test_rng rng = {c->seed};
  make_batch(c->kind, c->block_size, &rng, &run->batch);
  const bool cross = c->attn_type == UATTN_ATTENTION_ENCODER_DECODER;
  if (cross) /* each request's encoder sequence in blocks of its own; one request may have none */
    for (int32_t r = 0; r < run->batch.num_reqs; r++) {
      run->encoder_lens[r] = r == 1 ? 0 : test_rng_range(&rng, 1, 200);
      for (int32_t b = 0; b * c->block_size < run->encoder_lens[r]; b++)
        run->cross_table[r * 64 + b] = pool.ids[pool.next++];
    }
  run->cross = (uattn_cross){run->encoder_lens, run->cross_table, 64};
  compact_block_ids(run, &rng);

  uattn_plan_config pc =
      uattn_plan_config_default(c->block_size, run->num_blocks, RB_MAX_REQS, RB_MAX_TOKENS, RB_MAX_LEN);
  pc.split_min_keys = c->split_min_keys;
  pc.split_keys = c->split_keys;
  cr_assert_eq(uattn_plan_create(&pc, &run->plan), UATTN_OK, "%s: %s", c->name, uattn_last_error());
  uattn_step step = rb_step(&run->batch);
  cr_assert_eq(uattn_plan_step(run->plan, &step), UATTN_OK, "%s: %s", c->name, uattn_last_error());
  uattn_plan_get_info(run->plan, &run->info);

  uattn_layer *L = &run->layer;
  *L = uattn_layer_default(c->num_q_heads, c->num_kv_heads, c->head_dim, c->dtype);
  L->cache_dtype = c->cache_dtype;
  L->kv_layout = c->layout;
  L->attn_type = c->attn_type;
  L->soft_cap = c->soft_cap;
  L->sliding_window = c->sliding_window;
  L->chunk_size = c->chunk_size;
  L->causal_width = c->causal_width;
  if (c->k_scale > 0) L->k_scale = c->k_scale;
  if (c->v_scale > 0) L->v_scale = c->v_scale;
  L->head_dim_v = c->head_dim_v;
  L->kv_latent = c->kv_latent;
  if (c->kv_latent && c->v_scale <= 0) L->v_scale = L->k_scale; /* a latent's values are its keys' bytes */
  for (int32_t h = 0; h < c->num_q_heads && h < 64; h++) {
    run->sinks[h] = (float)(2.0 * test_rng_unit(&rng) - 1.0);
    run->slopes[h] = (float)(0.05 * pow(0.5, h % 8));
  }
  if (c->sinks) L->sinks = run->sinks;
  if (c->alibi) L->alibi_slopes = run->slopes;

  run->head_dim_v = oracle_value_dim(L);
  const size_t T = (size_t)run->info.num_tokens, D = (size_t)c->head_dim, Dv = (size_t)run->head_dim_v;
  const size_t slots = (size_t)run->num_blocks * c->block_size;
  run->q_bytes = T * c->num_q_heads * D * oracle_dtype_size(c->dtype);
  run->kv_bytes = T * c->num_kv_heads * D * oracle_dtype_size(c->dtype);
  run->v_bytes = c->kv_latent ? 0 : T * c->num_kv_heads * Dv * oracle_dtype_size(c->dtype);
  run->out_bytes = T * c->num_q_heads * Dv * oracle_dtype_size(c->dtype);
  run->cache_bytes = slots * c->num_kv_heads * D * oracle_dtype_size(c->cache_dtype);
  run->value_cache_bytes = c->kv_latent ? 0 : slots * c->num_kv_heads * Dv * oracle_dtype_size(c->cache_dtype);
  run->q = random_array(c->dtype, T * c->num_q_heads * D, &rng);
  run->k = random_array(c->dtype, T * c->num_kv_heads * D, &rng);
  if (!c->kv_latent) run->v = random_array(c->dtype, T * c->num_kv_heads * Dv, &rng);
  /* the caches hold random "earlier" keys everywhere: only what the step reads may matter */
  run->key_cache0 = random_array(c->cache_dtype, slots * c->num_kv_heads * D, &rng);
  if (!c->kv_latent) run->value_cache0 = random_array(c->cache_dtype, slots * c->num_kv_heads * Dv, &rng);
}

/* Whether a key position of request r can be seen by one of its queries: below its length after the step
 * and, with a sliding window, inside the first query's window (later queries' windows start later). */
static bool position_seen(const attention_run *run, int32_t r, int32_t p, const int32_t *effective) {
  const int32_t nc = run->batch.num_computed[r], w = run->c.sliding_window;
  return p < nc + effective[r] && (w <= 0 || p > nc - w);
}

void attention_run_poison_unseen(attention_run *run) {
  const attention_case *c = &run->c;
  const int32_t bs = c->block_size, H = c->num_kv_heads, D = c->head_dim, Dv = run->head_dim_v;
  const size_t slots = (size_t)run->num_blocks * bs;
  bool *seen = calloc(slots + 1, 1);
  int32_t effective[RB_MAX_REQS];
  attention_oracle_step(run, effective);
  const rb_batch *b = &run->batch;
  for (int32_t r = 0; r < b->num_reqs; r++) {
    for (int32_t i = 0; i < b->stride; i++) {
      const int32_t id = b->block_table[(size_t)r * b->stride + i];
      if (id < 0) continue;
      for (int32_t o = 0; o < bs; o++) seen[(size_t)id * bs + o] |= position_seen(run, r, i * bs + o, effective);
    }
    for (int32_t p = 0; p < run->encoder_lens[r]; p++) /* cross attention: keys [0, encoder_lens[r]) */
      seen[(size_t)run->cross_table[r * 64 + p / bs] * bs + p % bs] = true;
  }
  for (size_t s = 0; s < slots; s++) {
    if (seen[s]) continue;
    for (int32_t h = 0; h < H; h++) {
      /* a latent's first Dv dims are its value too: they take the values' poison */
      for (int32_t d = 0; d < D; d++)
        oracle_store(run->key_cache0, c->cache_dtype, oracle_cache_index(&run->layer, bs, (int64_t)s, h, d, false),
                     d % 2 ? NAN : (c->kv_latent && d < Dv ? -INFINITY : -NAN));
      for (int32_t d = 0; d < Dv && !c->kv_latent; d++)
        oracle_store(run->value_cache0, c->cache_dtype, oracle_cache_index(&run->layer, bs, (int64_t)s, h, d, true),
                     d % 2 ? NAN : -INFINITY);
    }
  }
  free(seen);
}

void attention_run_free(attention_run *run) {
  uattn_plan_destroy(run->plan);
  free(run->q);
  free(run->k);
  free(run->v);
  free(run->key_cache0);
  free(run->value_cache0);
}

uattn_tensors attention_tensors(const attention_run *run) {
  uattn_tensors t;
  memset(&t, 0, sizeof t);
  t.q = run->q;
  t.k = run->k;
  t.v = run->v;
  t.key_cache = copy_of(run->key_cache0, run->cache_bytes);
  t.value_cache = run->c.kv_latent ? NULL : copy_of(run->value_cache0, run->value_cache_bytes);
  t.num_blocks = run->num_blocks;
  t.block_size = run->c.block_size;
  t.out = calloc(run->out_bytes + 1, 1);
  t.lse = calloc((size_t)run->info.num_tokens * run->c.num_q_heads + 1, sizeof(float));
  if (run->c.attn_type == UATTN_ATTENTION_ENCODER_DECODER) t.cross = &run->cross;
  return t;
}

void attention_tensors_free(uattn_tensors *t) {
  free(t->key_cache);
  free(t->value_cache);
  free(t->out);
  free(t->lse);
}

void attention_tensors_out_f32(const attention_run *run, uattn_tensors *t) {
  free(t->out);
  t->out = calloc((size_t)run->info.num_tokens * run->c.num_q_heads * run->head_dim_v + 1, sizeof(float));
  t->out_f32 = true;
}

uattn_tensors attention_run_forward(const attention_run *run, uattn_runtime *rt) {
  uattn_tensors t = attention_tensors(run);
  cr_assert_eq(uattn_forward(run->plan, &run->layer, &t, rt), UATTN_OK, "%s: %s", run->c.name, uattn_last_error());
  return t;
}

/* ---- checking ------------------------------------------------------------------------------------------ */

/* The storage precision bounds the error: fp32 accumulation alone stays far inside 1e-5 of the largest
 * output; a bf16 (8 significant bits) or f16 (11) output is rounded once, by up to 2^-8 or 2^-11 of itself. The cache
 * dtype adds nothing of its own: the forward and the oracle read every key as the cache holds it, this
 * step's own too (uattn.h, uattn_forward; dense_oracle.h), from caches checked equal bit for bit, so a
 * narrower cache's rounding is in both. On an fp8 cache what is left besides is k_scale folded into the score
 * scale (one more fp32 rounding of a factor of every logit, 2^-24 of it) and v_scale applied in fp32: the
 * input dtype's tolerance (measured, tests/attention/test_attention.c's fp8 cases: see its comment). */
double attention_tolerance(uattn_dtype dtype, uattn_dtype cache_dtype) {
  (void)cache_dtype;
  const double t[3] = {1e-5, 4e-3, 1e-3};
  return t[dtype];
}

/* Sets of fp32 products (portable, avx2, avx512) keep the dtypes' tolerance above. A set that rounds its inputs to
 * bf16 (uattn_kernel_caps.bf16_inputs: avx512bf16) is given only bf16 queries on bf16 or fp8 caches, which it reads exactly, so the same
 * tolerance holds, plus, where it rounds the weights P to bf16 (probs_fp32 false), each weight p_j rounded by up
 * to 2^-8 p_j, which moves an output by up to 2^-8 sum_j p_j |v_j| / l <= 2^-8 max |v|: not proportional to the
 * output, which over long contexts averages down to a few hundredths while that term stays. Any other layer on
 * such a set breaks the dispatch's rule (kernels.h: uattn_kernels_keep_precision), and the contract gives it
 * nothing more, so a test of it fails. */
precision_contract attention_contract(const char *kernel_set, uattn_dtype dtype, uattn_dtype cache_dtype,
                                      bool probs_fp32) {
  bool bf16_inputs = false;
  for (size_t i = 0; i < uattn_isa_registry_size; i++)
    if (!strcmp(uattn_isa_registry[i].name, kernel_set)) bf16_inputs = uattn_isa_registry[i].set->caps.bf16_inputs;
  const bool exact_in_bf16 = dtype == UATTN_BF16 && (cache_dtype == UATTN_BF16 || oracle_is_fp8(cache_dtype));
  return (precision_contract){.rel = attention_tolerance(dtype, cache_dtype),
                              .abs = bf16_inputs && exact_in_bf16 && !probs_fp32 ? 0x1p-8 : 0.0};
}

precision_contract attention_run_contract(const attention_run *run) {
  uattn_kernel_report r;
  cr_assert_eq(uattn_describe_kernels(&run->layer, run->c.block_size, &r), UATTN_OK, "%s", uattn_last_error());
  return attention_contract(r.kernel_set, run->layer.dtype, run->layer.cache_dtype, run->layer.probs_fp32);
}

double attention_run_bound(const attention_run *run, double max_out) {
  const precision_contract p = attention_run_contract(run);
  /* the values the tests make lie in [-1, 1]; an fp8 cache's read v_scale (a latent's k_scale) times codes in [-1, 1] */
  const double vs = run->layer.kv_latent ? run->layer.k_scale : run->layer.v_scale;
  const double max_v = oracle_is_fp8(run->layer.cache_dtype) ? fmax(1.0, vs) : 1.0;
  return p.rel * fmax(max_out, 1e-30) + p.abs * max_v;
}

oracle_step attention_oracle_step(const attention_run *run, int32_t effective[RB_MAX_REQS]) {
  /* the oracle takes the step as the scheduler gave it, with the drafts' effective token counts (real
   * drafts + 1), counted here rather than taken from the planner under test */
  for (int32_t r = 0; r < run->batch.num_reqs; r++) {
    const int32_t b0 = run->batch.draft_offsets[r], b1 = run->batch.draft_offsets[r + 1];
    int32_t real = 0;
    for (int32_t k = b0; k < b1; k++) real += run->batch.draft_tokens[k] != -1;
    effective[r] = (run->batch.has_drafts && b1 > b0) ? real + 1 : run->batch.num_scheduled[r];
  }
  return (oracle_step){.num_reqs = run->batch.num_reqs,
                       .block_size = run->c.block_size,
                       .num_computed = run->batch.num_computed,
                       .num_scheduled = effective,
                       .num_prompt = run->batch.num_prompt,
                       .block_table = run->batch.block_table,
                       .block_table_stride = run->batch.stride};
}

double attention_run_error(attention_run *run, double *scale_out) {
  const attention_case *c = &run->c;
  const size_t n = (size_t)run->info.num_tokens * c->num_q_heads * run->head_dim_v;
  uattn_tensors t = attention_run_forward(run, NULL), ref = attention_tensors(run);
  int32_t effective[RB_MAX_REQS];
  const oracle_step s = attention_oracle_step(run, effective);
  double *out = malloc(sizeof(double) * (n + 1));
  double *lse = malloc(sizeof(double) * ((size_t)run->info.num_tokens * c->num_q_heads + 1));
  cr_assert_eq(oracle_write_cache(&s, &run->layer, &ref), 0, "%s: oracle: %s", c->name, oracle_last_error());
  cr_assert_eq(oracle_attention(&s, &run->layer, &ref, out, lse), 0, "%s: oracle: %s", c->name, oracle_last_error());
  double scale = 0, err = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(out[i]));
  for (size_t i = 0; i < n; i++) err = fmax(err, fabs(oracle_load(t.out, c->dtype, i) - out[i]));
  free(out), free(lse);
  attention_tensors_free(&t), attention_tensors_free(&ref);
  *scale_out = scale;
  return err;
}

void attention_run_check(attention_run *run) {
  const attention_case *c = &run->c;
  const int32_t T = run->info.num_tokens, Hq = c->num_q_heads, D = run->head_dim_v; /* out's rows are Dv long */
  uattn_tensors t = attention_run_forward(run, NULL), ref = attention_tensors(run);
  int32_t effective[RB_MAX_REQS];
  const oracle_step s = attention_oracle_step(run, effective);
  cr_assert_eq(oracle_write_cache(&s, &run->layer, &ref), 0, "%s: oracle: %s", c->name, oracle_last_error());
  cr_assert_eq(memcmp(t.key_cache, ref.key_cache, run->cache_bytes), 0, "%s: the key cache differs", c->name);
  if (c->kv_latent)
    cr_assert(t.value_cache == NULL, "%s: a latent layer's value cache appeared", c->name);
  else
    cr_assert_eq(memcmp(t.value_cache, ref.value_cache, run->value_cache_bytes), 0, "%s: the value cache differs",
                 c->name);

  double *out = malloc(sizeof(double) * ((size_t)T * Hq * D + 1)), *lse = malloc(sizeof(double) * ((size_t)T * Hq + 1));
  cr_assert_eq(oracle_attention(&s, &run->layer, &ref, out, lse), 0, "%s: oracle: %s", c->name, oracle_last_error());
  double scale = 0.0, err = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < (size_t)T * Hq * D; i++) scale = fmax(scale, fabs(out[i]));
  for (size_t i = 0; i < (size_t)T * Hq * D; i++) {
    const double got = oracle_load(t.out, c->dtype, i), e = fabs(got - out[i]);
    cr_assert(!isnan(got), "%s: NaN at %zu", c->name, i);
    if (e > err) err = e, worst = i;
  }
  const double tol = attention_tolerance(c->dtype, c->cache_dtype), bound = attention_run_bound(run, scale);
  uattn_kernel_report r;
  cr_assert_eq(uattn_describe_kernels(&run->layer, c->block_size, &r), UATTN_OK, "%s", uattn_last_error());
  cr_assert(err <= bound, "%s (%s): max error %.3g at element %zu (row %zu, head %zu) exceeds %.3g (max |out| %.3g)",
            c->name, r.kernel_set, err, worst, worst / ((size_t)Hq * D), worst / D % Hq, bound, scale);
  for (size_t i = 0; i < (size_t)T * Hq; i++) {
    const double got = t.lse[i];
    if (isinf(lse[i])) {
      cr_assert(isinf(got) && got < 0, "%s: lse[%zu] = %g, want -inf", c->name, i, got);
      continue;
    }
    cr_assert(fabs(got - lse[i]) <= 10 * tol * fmax(1.0, fabs(lse[i])) + 1e-5, "%s: lse[%zu] = %.7g, the oracle %.7g",
              c->name, i, got, lse[i]);
  }
  free(out);
  free(lse);
  attention_tensors_free(&t);
  attention_tensors_free(&ref);
}

void attention_restore_isa(const char *forced) {
  if (forced)
    setenv("UATTN_ISA", forced, 1);
  else
    unsetenv("UATTN_ISA");
}

size_t attention_check_out_f32(const attention_run *run, const uattn_tensors *narrow, const uattn_tensors *wide) {
  const attention_case *c = &run->c;
  const size_t rows = (size_t)run->info.num_tokens * c->num_q_heads, n = rows * (size_t)run->head_dim_v;
  const float *w = wide->out;
  const uint16_t *d = narrow->out;
  size_t not_dtype = 0;
  for (size_t x = 0; x < n; x++) {
    const uint16_t want = c->dtype == UATTN_BF16 ? oracle_float_to_bf16(w[x]) : oracle_float_to_f16(w[x]);
    cr_assert_eq(d[x], want, "%s: element %zu: dtype output 0x%04x, the fp32 output %.9g rounds to 0x%04x", c->name, x,
                 d[x], w[x], want);
    not_dtype += (double)w[x] != oracle_load(d, c->dtype, x);
  }
  cr_assert_eq(memcmp(wide->lse, narrow->lse, sizeof(float) * rows), 0, "%s: the lse differs", c->name);
  cr_assert_eq(memcmp(wide->key_cache, narrow->key_cache, run->cache_bytes), 0, "%s: the key cache", c->name);
  if (!c->kv_latent)
    cr_assert_eq(memcmp(wide->value_cache, narrow->value_cache, run->value_cache_bytes), 0, "%s: the value cache",
                 c->name);
  return not_dtype;
}

bool attention_force_level(const char *isa, const char *label) {
  setenv("UATTN_ISA", isa, 1);
  const char *why;
  const char *ran = uattn_kernel_set(&why);
  const bool itself = strcmp(ran, isa) == 0;
  fprintf(stderr, "%s: UATTN_ISA=%s runs %s (%s)%s\n", label, isa, ran, why,
          itself ? "" : " (a lower level's test runs that set: skipped)");
  return itself;
}
