#include "bench/scenarios.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/random.h"

const bench_preset bench_presets[] = {
    {"llama3-8b", "Llama-3-8B: 32 query heads, 8 KV heads, head dim 128", 32, 8, 128, 0, 0, false, 0, BENCH_CASES_ALL},
    {"llama3-70b-tp8", "Llama-3-70B, one rank of tensor parallel 8: 8 query heads, 1 KV head, head dim 128", 8, 1, 128,
     0, 0, false, 0, BENCH_CASES_ALL},
    {"qwen2-7b", "Qwen2-7B: 28 query heads, 4 KV heads, head dim 128", 28, 4, 128, 0, 0, false, 0, BENCH_CASES_ALL},
    {"falcon-7b", "Falcon-7B, multi-query: 71 query heads, 1 KV head, head dim 64", 71, 1, 64, 0, 0, false, 0,
     BENCH_CASES_ALL},
    {"gemma2-9b", "Gemma-2-9B, a global layer: 16 query heads, 8 KV heads, head dim 256, soft cap 50", 16, 8, 256, 50,
     0, false, 0, BENCH_CASES_ALL},
    /* multi-head latent attention: the model's scale is 1/sqrt(192), the head dim of its expanded keys, in both
     * forms */
    {"deepseek-v3",
     "DeepSeek-V3, absorbed MLA: 128 query heads, 1 latent KV head of 576 (values its first 512), scale 1/sqrt(192)",
     128, 1, 576, 0, 512, true, 0.07216878365f, BENCH_CASES_DECODE},
    {"deepseek-v3-prefill",
     "DeepSeek-V3, expanded MLA: 128 query heads, 128 KV heads, keys 192, values 128, scale 1/sqrt(192)", 128, 128, 192,
     0, 128, false, 0.07216878365f, BENCH_CASES_PROMPT},
};
const int bench_num_presets = (int)(sizeof bench_presets / sizeof *bench_presets);

#define DECODES(n, lo, hi)                                                                                             \
  { n, lo, hi, 1, false }
#define VERIFY(n, ctx, rows)                                                                                           \
  { n, ctx, ctx, rows, false }
#define PROMPT(ctx, rows)                                                                                              \
  { 1, ctx, ctx, rows, true }

const bench_case bench_cases[] = {
    {"decode-heavy",
     "decode-heavy 64+1",
     "64 decodes over 256-3840 cached keys and a 128-token prompt chunk after 1024",
     0,
     {DECODES(64, 256, 3840), PROMPT(1024, 128)},
     false},
    /* its two kinds of work alone: one core cannot hide the chunk's products under the decodes' reads (whose own
     * products already keep it busy), so the whole takes about the sum of these two, and its fraction of the read
     * bandwidth is bounded by theirs */
    {"decode-heavy", "decode-heavy 64 alone", "decode-heavy's 64 decodes alone", 0, {DECODES(64, 256, 3840)}, false},
    {"decode-heavy",
     "decode-heavy +1 alone",
     "decode-heavy's 128-token prompt chunk after 1024 cached keys alone",
     0,
     {PROMPT(1024, 128)},
     false},
    {"prefill", "prefill 2048", "one 2048-token prompt, nothing cached", 0, {PROMPT(0, 2048)}, false},
    {"chunked-prefill",
     "chunked-prefill 512/8k",
     "a 512-token prompt chunk over 8192 cached keys",
     0,
     {PROMPT(8192, 512)},
     false},
    {"mixed", "mixed trace step", "a continuous-batching step: prompt chunks, decodes, verifications", 0, {{0}}, true},
    {"shared-prefix",
     "shared-prefix 64x4k",
     "64 decodes sharing a 4096-key prefix, 64 keys of their own each",
     4096,
     {DECODES(64, 4096 + 64, 4096 + 64)},
     false},
    {"spec-decode",
     "spec-decode 32x2",
     "32 requests verify 1 draft (2 rows each) over 2048 cached keys",
     0,
     {VERIFY(32, 2048, 2)},
     false},
    {"spec-decode",
     "spec-decode 16x4",
     "16 requests verify 3 drafts (4 rows each) over 2048 cached keys",
     0,
     {VERIFY(16, 2048, 4)},
     false},
    {"spec-decode",
     "spec-decode 16x8",
     "16 requests verify 7 drafts (8 rows each) over 2048 cached keys",
     0,
     {VERIFY(16, 2048, 8)},
     false},
    {"spec-decode",
     "spec-decode 8x16",
     "8 requests verify 15 drafts (16 rows each) over 2048 cached keys",
     0,
     {VERIFY(8, 2048, 16)},
     false},
    {"spec-decode",
     "spec-decode 4x32",
     "4 requests verify 31 drafts (32 rows each) over 2048 cached keys",
     0,
     {VERIFY(4, 2048, 32)},
     false},
    {"spec-decode",
     "spec-decode 4x63",
     "4 requests verify 62 drafts (63 rows each) over 2048 cached keys",
     0,
     {VERIFY(4, 2048, 63)},
     false},
    {"decode-long", "decode-long 1x32k", "one decode over 32768 cached keys", 0, {DECODES(1, 32768, 32768)}, false},
    {"decode-long", "decode-long 32x4k", "32 decodes over 4096 cached keys each", 0, {DECODES(32, 4096, 4096)}, false},
    /* too short to split: its units are the KV heads of its decode calls (units.c's all_heads_group) */
    {"decode-short", "decode-short 1x4k", "one decode over 4096 cached keys", 0, {DECODES(1, 4096, 4096)}, false},
};
const int bench_num_cases = (int)(sizeof bench_cases / sizeof *bench_cases);

bool bench_preset_runs(const bench_preset *p, const bench_case *c) {
  if (p->cases == BENCH_CASES_ALL) return true;
  if (c->from_trace) return false; /* a trace step mixes prompts with decodes */
  for (int g = 0; g < 2; g++)
    if (c->groups[g].count > 0 && c->groups[g].prompt != (p->cases == BENCH_CASES_PROMPT)) return false;
  return true;
}

int32_t bench_head_dim_v(const bench_preset *p) { return p->head_dim_v ? p->head_dim_v : p->head_dim; }

static int32_t blocks_for(int32_t keys, int32_t block_size) { return (keys + block_size - 1) / block_size; }

/* Renumbers the ids [first, end) of a table of n entries in a shuffled order (fixed seed): a block table as
 * an engine's cache holds it once requests have come and gone. Returns -1 when out of memory. */
static int scatter_blocks(int32_t *table, size_t n, int32_t first, int32_t end) {
  int32_t *id = malloc(sizeof(int32_t) * (size_t)(end > first ? end - first : 1));
  if (!id) return -1;
  for (int32_t i = first; i < end; i++) id[i - first] = i;
  uint64_t rng = 11;
  perf_random_shuffle(id, end - first, &rng);
  for (size_t i = 0; i < n; i++)
    if (table[i] >= first) table[i] = id[table[i] - first];
  free(id);
  return 0;
}

static int32_t group_context(const bench_group *g, int32_t i) {
  return g->count > 1 ? g->context_lo + (int32_t)((int64_t)(g->context_hi - g->context_lo) * i / (g->count - 1))
                      : g->context_lo;
}

/* A fixed batch: requests in group order, the shared prefix's blocks first and in every request's row, the
 * other blocks numbered as they are handed out, or (scatter) in a shuffled order. */
static int build_groups(const bench_case *c, int32_t bs, bool scatter, bench_step *out) {
  int32_t reqs = 0, stride = 1, tokens = 0, max_len = 1;
  for (int g = 0; g < 2; g++) {
    const bench_group *gr = &c->groups[g];
    for (int32_t i = 0; i < gr->count; i++) {
      const int32_t len = group_context(gr, i) + gr->queries;
      stride = blocks_for(len, bs) > stride ? blocks_for(len, bs) : stride;
      max_len = len > max_len ? len : max_len;
    }
    reqs += gr->count;
    tokens += gr->count * gr->queries;
  }
  int32_t *a = malloc(sizeof(int32_t) * (size_t)reqs * (size_t)(3 + stride));
  if (!a) return -1;
  int32_t *nc = a, *ns = a + reqs, *np = a + 2 * reqs, *table = a + 3 * reqs;
  const int32_t prefix_blocks = c->shared_prefix / bs;
  int32_t next = prefix_blocks, r = 0;
  for (int g = 0; g < 2; g++) {
    const bench_group *gr = &c->groups[g];
    for (int32_t i = 0; i < gr->count; i++, r++) {
      nc[r] = group_context(gr, i);
      ns[r] = gr->queries;
      np[r] = gr->prompt ? nc[r] + ns[r] : 1;
      const int32_t need = blocks_for(nc[r] + ns[r], bs);
      for (int32_t b = 0; b < stride; b++)
        table[(size_t)r * stride + b] = b >= need ? -1 : b < prefix_blocks ? b : next++;
    }
  }
  if (scatter && scatter_blocks(table, (size_t)reqs * (size_t)stride, prefix_blocks, next)) {
    free(a);
    return -1;
  }
  out->arrays = a;
  out->num_blocks = next;
  out->max_model_len = max_len;
  out->max_tokens = tokens;
  out->step = (uattn_step){.num_reqs = reqs,
                           .num_computed = nc,
                           .num_scheduled = ns,
                           .num_prompt = np,
                           .block_table = table,
                           .block_table_stride = stride};
  snprintf(out->what, sizeof out->what, "%s", c->what);
  return 0;
}

/* A step of the serving trace: the first one after the trace has filled up that holds prompt chunks and
 * at least 32 decodes and verifications (a step with 1024 tokens of budget, 64 requests at most). */
enum { TRACE_KEYS = 65536, TRACE_MAX_LEN = 4096, TRACE_BUDGET = 1024, TRACE_SEQS = 64, TRACE_STEPS = 2000 };

static int build_trace(const bench_case *c, int32_t bs, bench_step *out, char *err, size_t err_size) {
  trace_config tc = trace_config_default(bs, blocks_for(TRACE_KEYS, bs), TRACE_SEQS, TRACE_BUDGET, TRACE_MAX_LEN);
  tc.system_prompt_len = 512;
  tc.prompt_min = 128;
  tc.prompt_max = 1536;
  tc.output_min = 32;
  tc.output_max = 512;
  out->tr = trace_create(&tc);
  if (!out->tr) {
    snprintf(err, err_size, "cannot create the serving trace with block size %d", bs);
    return -1;
  }
  trace_step_mix mix;
  for (int i = 1; i <= TRACE_STEPS && trace_next(out->tr, &out->step, &mix); i++)
    if (mix.prefills > 0 && mix.prefill_tokens >= 512 && mix.decodes + mix.spec_decodes >= 32) {
      out->num_blocks = tc.num_blocks;
      out->max_model_len = TRACE_MAX_LEN;
      out->max_tokens = TRACE_BUDGET;
      snprintf(out->what, sizeof out->what,
               "serving-trace step %d: prompt chunks %d (%d tokens), decodes %d, verifications %d (%d rows); "
               "a 512-key system prompt shared by all",
               i, mix.prefills, mix.prefill_tokens, mix.decodes, mix.spec_decodes, mix.spec_tokens);
      return 0;
    }
  snprintf(err, err_size, "the serving trace made no mixed step with block size %d", bs);
  return -1;
}

int bench_step_build(const bench_case *c, int32_t block_size, bool scatter, bench_step *out, char *err,
                     size_t err_size) {
  memset(out, 0, sizeof *out);
  if (c->from_trace) return build_trace(c, block_size, out, err, err_size);
  if (build_groups(c, block_size, scatter, out) == 0) return 0;
  snprintf(err, err_size, "out of memory");
  return -1;
}

void bench_step_free(bench_step *s) {
  free(s->arrays);
  trace_destroy(s->tr);
  memset(s, 0, sizeof *s);
}

int bench_count_work(const uattn_plan *plan, const uattn_step *step, int32_t num_blocks, const bench_preset *p,
                     int32_t elem_bytes, int32_t cache_elem_bytes, bench_work *out) {
  uattn_plan_info in;
  uattn_plan_get_info(plan, &in);
  /* keys_used[b]: how many keys of block b some row reads from the cache */
  int32_t *keys_used = calloc((size_t)num_blocks, sizeof(int32_t));
  if (!keys_used) return -1;
  const int32_t bs = in.block_size;
  double pairs = 0, cached_keys = 0;
  for (int32_t r = 0; r < in.num_reqs; r++) {
    int32_t keys = 0;
    for (int32_t t = in.query_start_loc[r]; t < in.query_start_loc[r + 1]; t++) {
      keys = in.token_context_lens[t] > keys ? in.token_context_lens[t] : keys;
      pairs += in.token_positions[t] + 1;
    }
    for (int32_t b = 0; b * bs < keys; b++) {
      const int32_t id = step->block_table[(size_t)r * step->block_table_stride + b];
      const int32_t used = keys - b * bs < bs ? keys - b * bs : bs;
      keys_used[id] = used > keys_used[id] ? used : keys_used[id];
    }
  }
  for (int32_t b = 0; b < num_blocks; b++) cached_keys += keys_used[b];
  free(keys_used);
  const double d = p->head_dim, dv = bench_head_dim_v(p);
  /* a key's elements over its KV heads: its key and value rows, or its latent alone (which is its value too) */
  const double kv_elems = p->hkv * (p->kv_latent ? d : d + dv);
  out->tokens = in.num_tokens;
  out->cache_bytes = cached_keys * kv_elems * cache_elem_bytes;
  /* q and out, k and v in, k and v into the cache (in the cache's dtype) */
  out->io_bytes = in.num_tokens * ((p->hq * (d + dv) + kv_elems) * elem_bytes + kv_elems * cache_elem_bytes);
  out->flops = pairs * p->hq * 2.0 * (d + dv);
  return 0;
}
