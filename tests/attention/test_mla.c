/* Multi-head latent attention (uattn.h: uattn_layer.head_dim_v and kv_latent) through uattn_forward against the
 * dense fp64 oracle: the expanded form (values of another width than the keys, a value cache of Dv-long rows) and
 * the absorbed form (one latent per token whose first head_dim_v dims are its value, no value cache), every kind of
 * batch, three dtypes, bf16, f32 and fp8 caches, NHD and HND (and TILED for the expanded form), chunked shared
 * parts, split decodes, the score rules, thread counts, out_f32 and lse, every kernel level; then the identity the
 * absorbed form rests on, the two forms of one model agreeing through uattn_forward.
 * Tolerances: attention_case.c's precision contract (attention_run_bound), the one every attention suite uses: the
 * forms change widths, not arithmetic. Its f32 term (1e-5 of the largest output) holds the scores' fp32 dot
 * products at the widths f32 layers have here (up to 80 dims, as the attention suite's up to 256); the 192- and
 * 576-dim cases are bf16, whose output rounding (4e-3) dwarfs them. A latent's value is read from the key cache
 * with the key's own rounding and scale, the bits the oracle reads, so the absorbed form adds no term. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/attention_case.h"
#include "common/case_names.h"

/* The expanded form: 4 query heads on 2 KV heads, keys D long and values DV long. */
#define EXPANDED(D, DV) .num_q_heads = 4, .num_kv_heads = 2, .head_dim = D, .head_dim_v = DV
/* The absorbed form: 16 query heads on one latent of 72 dims, its first 64 the value. */
#define ABSORBED .num_q_heads = 16, .num_kv_heads = 1, .head_dim = 72, .head_dim_v = 64, .kv_latent = true
#define TYPES(dt, cdt, lay) .dtype = dt, .cache_dtype = cdt, .layout = lay

/* clang-format off */
static const attention_case expanded_kinds[] = {
    {.name = "expanded 48/32 decode",         .kind = BATCH_DECODE,         .block_size = 16, EXPANDED(48, 32), TYPES(F32,  F32,  NHD),   .seed = 301},
    {.name = "expanded 48/32 prefill",        .kind = BATCH_PREFILL,        .block_size = 16, EXPANDED(48, 32), TYPES(BF16, BF16, HND),   .seed = 302},
    {.name = "expanded 48/32 prefix prefill", .kind = BATCH_PREFIX_PREFILL, .block_size = 32, EXPANDED(48, 32), TYPES(F16,  F16,  TILED), .seed = 303},
    {.name = "expanded 48/32 chunked, long",  .kind = BATCH_CHUNKED_LONG,   .block_size = 16, EXPANDED(48, 32), TYPES(F32,  BF16, NHD),   .seed = 304},
    {.name = "expanded 48/32 mixed",          .kind = BATCH_MIXED,          .block_size = 16, EXPANDED(48, 32), TYPES(BF16, BF16, TILED), .seed = 305},
    {.name = "expanded 48/32 spec decode",    .kind = BATCH_SPEC_DECODE,    .block_size = 16, EXPANDED(48, 32), TYPES(BF16, F32,  HND),   .seed = 306},
    {.name = "expanded 48/32 shared prefix",  .kind = BATCH_SHARED_PREFIX,  .block_size = 16, EXPANDED(48, 32), TYPES(F16,  F16,  NHD),   .seed = 307},
    {.name = "expanded 48/32 empty",          .kind = BATCH_EMPTY,          .block_size = 16, EXPANDED(48, 32), TYPES(F32,  F32,  NHD),   .seed = 308},
    {.name = "expanded 32/48 decode",         .kind = BATCH_DECODE,         .block_size = 16, EXPANDED(32, 48), TYPES(BF16, BF16, TILED), .seed = 311},
    {.name = "expanded 32/48 prefill",        .kind = BATCH_PREFILL,        .block_size = 16, EXPANDED(32, 48), TYPES(F32,  F32,  NHD),   .seed = 312},
    {.name = "expanded 32/48 prefix prefill", .kind = BATCH_PREFIX_PREFILL, .block_size = 16, EXPANDED(32, 48), TYPES(BF16, BF16, NHD),   .seed = 313},
    {.name = "expanded 32/48 chunked, long",  .kind = BATCH_CHUNKED_LONG,   .block_size = 16, EXPANDED(32, 48), TYPES(F16,  F16,  HND),   .seed = 314},
    {.name = "expanded 32/48 mixed",          .kind = BATCH_MIXED,          .block_size = 16, EXPANDED(32, 48), TYPES(F32,  F32,  HND),   .seed = 315},
    {.name = "expanded 32/48 spec decode",    .kind = BATCH_SPEC_DECODE,    .block_size = 32, EXPANDED(32, 48), TYPES(F32,  F32,  TILED), .seed = 316},
    {.name = "expanded 32/48 shared prefix",  .kind = BATCH_SHARED_PREFIX,  .block_size = 16, EXPANDED(32, 48), TYPES(BF16, BF16, HND),   .seed = 317},
    {.name = "expanded 32/48 mixed, f16 in, bf16 cache",
                                              .kind = BATCH_MIXED,          .block_size = 16, EXPANDED(32, 48), TYPES(F16,  BF16, NHD),   .seed = 318},
};

static const attention_case absorbed_kinds[] = {
    {.name = "absorbed decode",         .kind = BATCH_DECODE,         .block_size = 16, ABSORBED, TYPES(BF16, BF16, NHD), .seed = 321},
    {.name = "absorbed prefill",        .kind = BATCH_PREFILL,        .block_size = 16, ABSORBED, TYPES(F32,  F32,  HND), .seed = 322},
    {.name = "absorbed prefix prefill", .kind = BATCH_PREFIX_PREFILL, .block_size = 32, ABSORBED, TYPES(F16,  F16,  NHD), .seed = 323},
    {.name = "absorbed chunked, long",  .kind = BATCH_CHUNKED_LONG,   .block_size = 16, ABSORBED, TYPES(BF16, BF16, HND), .seed = 324},
    {.name = "absorbed mixed",          .kind = BATCH_MIXED,          .block_size = 16, ABSORBED, TYPES(F32,  F32,  NHD), .seed = 325},
    {.name = "absorbed spec decode",    .kind = BATCH_SPEC_DECODE,    .block_size = 16, ABSORBED, TYPES(F16,  F16,  HND), .seed = 326},
    {.name = "absorbed shared prefix",  .kind = BATCH_SHARED_PREFIX,  .block_size = 16, ABSORBED, TYPES(BF16, BF16, NHD), .seed = 327},
    {.name = "absorbed empty",          .kind = BATCH_EMPTY,          .block_size = 16, ABSORBED, TYPES(BF16, BF16, NHD), .seed = 328},
    {.name = "absorbed mixed, f32 in, bf16 cache",
                                        .kind = BATCH_MIXED,          .block_size = 16, ABSORBED, TYPES(F32,  BF16, HND), .seed = 329},
    {.name = "absorbed decode, bf16 in, f32 cache",
                                        .kind = BATCH_DECODE,         .block_size = 32, ABSORBED, TYPES(BF16, F32,  NHD), .seed = 330},
};

/* fp8: the expanded form's scales apart from 1 and each other (a scale on the wrong side shows); the absorbed
 * form's equal (uattn.h), apart from 1 both ways. */
static const attention_case fp8_cases[] = {
    {.name = "expanded 48/32 fp8 e4m3 mixed",      .kind = BATCH_MIXED,         .block_size = 16, EXPANDED(48, 32), TYPES(BF16, E4M3, NHD),   .seed = 341, .k_scale = 0.5f, .v_scale = 3.0f},
    {.name = "expanded 32/48 fp8 e4m3 decode",     .kind = BATCH_DECODE,        .block_size = 16, EXPANDED(32, 48), TYPES(F32,  E4M3, HND),   .seed = 342, .k_scale = 3.0f, .v_scale = 0.5f},
    {.name = "expanded 48/32 fp8 e4m3 shared, TILED",
                                                   .kind = BATCH_SHARED_PREFIX, .block_size = 16, EXPANDED(48, 32), TYPES(BF16, E4M3, TILED), .seed = 343, .k_scale = 0.5f, .v_scale = 3.0f},
    {.name = "expanded 32/48 fp8 e5m2 spec decode",.kind = BATCH_SPEC_DECODE,   .block_size = 16, EXPANDED(32, 48), TYPES(BF16, E5M2, NHD),   .seed = 344, .k_scale = 3.0f, .v_scale = 0.5f},
    {.name = "absorbed fp8 e4m3 decode",           .kind = BATCH_DECODE,        .block_size = 16, ABSORBED, TYPES(BF16, E4M3, NHD), .seed = 345, .k_scale = 0.5f, .v_scale = 0.5f},
    {.name = "absorbed fp8 e4m3 mixed, HND",       .kind = BATCH_MIXED,         .block_size = 16, ABSORBED, TYPES(F32,  E4M3, HND), .seed = 346, .k_scale = 3.0f, .v_scale = 3.0f},
    {.name = "absorbed fp8 e4m3 shared prefix",    .kind = BATCH_SHARED_PREFIX, .block_size = 32, ABSORBED, TYPES(BF16, E4M3, NHD), .seed = 347, .k_scale = 3.0f, .v_scale = 3.0f},
    {.name = "absorbed fp8 e5m2 spec decode, HND", .kind = BATCH_SPEC_DECODE,   .block_size = 16, ABSORBED, TYPES(BF16, E5M2, HND), .seed = 348, .k_scale = 0.5f, .v_scale = 0.5f},
};

/* Chunked shared parts, split decodes and the score rules, each on both forms. */
static const attention_case features[] = {
    {.name = "expanded 48/32 shared, chunk 1",   .kind = BATCH_SHARED_PREFIX, .block_size = 16, EXPANDED(48, 32), TYPES(F32,  F32,  NHD),   .seed = 351, .chunk_size = 1},
    {.name = "expanded 32/48 shared, chunk 3",   .kind = BATCH_SHARED_PREFIX, .block_size = 16, EXPANDED(32, 48), TYPES(BF16, BF16, TILED), .seed = 352, .chunk_size = 3},
    {.name = "absorbed shared, chunk 2",         .kind = BATCH_SHARED_PREFIX, .block_size = 16, ABSORBED, TYPES(BF16, BF16, NHD), .seed = 353, .chunk_size = 2},
    {.name = "absorbed shared, chunk 7, HND",    .kind = BATCH_SHARED_PREFIX, .block_size = 16, ABSORBED, TYPES(F32,  F32,  HND), .seed = 354, .chunk_size = 7},
    {.name = "expanded 48/32 split-K decodes",   .kind = BATCH_DECODE,        .block_size = 16, EXPANDED(48, 32), TYPES(F32,  F32,  NHD),   .seed = 355, .split_min_keys = 64, .split_keys = 48},
    {.name = "expanded 32/48 split-K spec, TILED",
                                                 .kind = BATCH_SPEC_DECODE,   .block_size = 16, EXPANDED(32, 48), TYPES(BF16, BF16, TILED), .seed = 356, .split_min_keys = 100, .split_keys = 200},
    {.name = "absorbed split-K decodes",         .kind = BATCH_DECODE,        .block_size = 16, ABSORBED, TYPES(BF16, BF16, NHD), .seed = 357, .split_min_keys = 64, .split_keys = 48},
    {.name = "absorbed split-K spec, HND",       .kind = BATCH_SPEC_DECODE,   .block_size = 16, ABSORBED, TYPES(F16,  F16,  HND), .seed = 358, .split_min_keys = 100, .split_keys = 200},
    {.name = "expanded 48/32 window",            .kind = BATCH_MIXED,         .block_size = 16, EXPANDED(48, 32), TYPES(F32,  F32,  HND),   .seed = 359, .sliding_window = 37},
    {.name = "absorbed window, long",            .kind = BATCH_CHUNKED_LONG,  .block_size = 16, ABSORBED, TYPES(BF16, BF16, NHD), .seed = 360, .sliding_window = 100},
    {.name = "absorbed window, decodes",         .kind = BATCH_DECODE,        .block_size = 16, ABSORBED, TYPES(F32,  F32,  HND), .seed = 361, .sliding_window = 90},
    {.name = "expanded 32/48 soft cap",          .kind = BATCH_MIXED,         .block_size = 16, EXPANDED(32, 48), TYPES(F32,  F32,  NHD),   .seed = 362, .soft_cap = 5.0f},
    {.name = "absorbed soft cap",                .kind = BATCH_MIXED,         .block_size = 16, ABSORBED, TYPES(F32,  F32,  NHD), .seed = 363, .soft_cap = 5.0f},
    {.name = "expanded 48/32 sinks",             .kind = BATCH_SPEC_DECODE,   .block_size = 16, EXPANDED(48, 32), TYPES(BF16, BF16, NHD),   .seed = 364, .sinks = true},
    {.name = "absorbed sinks",                   .kind = BATCH_DECODE,        .block_size = 16, ABSORBED, TYPES(BF16, BF16, HND), .seed = 365, .sinks = true},
    {.name = "expanded 32/48 ALiBi",             .kind = BATCH_MIXED,         .block_size = 16, EXPANDED(32, 48), TYPES(F16,  F16,  HND),   .seed = 366, .alibi = true},
    {.name = "absorbed ALiBi",                   .kind = BATCH_MIXED,         .block_size = 16, ABSORBED, TYPES(F32,  F32,  NHD), .seed = 367, .alibi = true},
    {.name = "absorbed causal slices",           .kind = BATCH_MIXED,         .block_size = 16, ABSORBED, TYPES(F32,  F32,  HND), .seed = 368, .causal_width = 7},
    {.name = "expanded 48/32 everything, TILED", .kind = BATCH_SHARED_PREFIX, .block_size = 32, EXPANDED(48, 32), TYPES(BF16, BF16, TILED), .seed = 369,
     .soft_cap = 30.0f, .sliding_window = 50, .sinks = true, .alibi = true, .chunk_size = 2},
    {.name = "absorbed everything",              .kind = BATCH_SHARED_PREFIX, .block_size = 32, ABSORBED, TYPES(BF16, BF16, HND), .seed = 370,
     .soft_cap = 30.0f, .sliding_window = 50, .sinks = true, .alibi = true, .chunk_size = 2},
    {.name = "absorbed everything, split-K",     .kind = BATCH_DECODE,        .block_size = 16, ABSORBED, TYPES(F16,  F16,  NHD), .seed = 371,
     .soft_cap = 20.0f, .sliding_window = 60, .sinks = true, .alibi = true, .split_min_keys = 64, .split_keys = 48},
};

/* DeepSeek-V3's widths: the absorbed form's 576-dim latent with a 512-dim value (scale 1/sqrt(192), the model's),
 * decodes over a few hundred keys; the expanded form's 192-dim keys and 128-dim values on a mixed batch. */
static const attention_case deepseek[] = {
    {.name = "DeepSeek absorbed 576/512 decodes", .kind = BATCH_DECODE, .block_size = 64, .num_q_heads = 16, .num_kv_heads = 1,
     .head_dim = 576, .head_dim_v = 512, .kv_latent = true, TYPES(BF16, BF16, NHD), .seed = 381},
    {.name = "DeepSeek absorbed 576/512 split-K decodes, fp8", .kind = BATCH_DECODE, .block_size = 64, .num_q_heads = 16,
     .num_kv_heads = 1, .head_dim = 576, .head_dim_v = 512, .kv_latent = true, TYPES(BF16, E4M3, NHD), .seed = 382,
     .split_min_keys = 256, .split_keys = 128, .k_scale = 0.5f, .v_scale = 0.5f},
    {.name = "DeepSeek expanded 192/128 mixed", .kind = BATCH_MIXED, .block_size = 64, .num_q_heads = 8, .num_kv_heads = 8,
     .head_dim = 192, .head_dim_v = 128, TYPES(BF16, BF16, NHD), .seed = 383},
};
/* clang-format on */

#define COUNT(table) (sizeof table / sizeof *table)

/* The layer's scale: 1/sqrt(192) on the DeepSeek cases, as the model's (uattn_layer_default's 1/sqrt(576) is not). */
static void build(attention_run *run, const attention_case *c) {
  attention_run_build(run, c);
  if (c->head_dim == 576) run->layer.scale = 1.0f / sqrtf(192.0f);
}

static void run_case(const attention_case *c, bool poisoned) {
  attention_run run;
  build(&run, c);
  if (poisoned) attention_run_poison_unseen(&run);
  attention_run_check(&run);
  attention_run_free(&run);
}

static void run_table(const attention_case *cases, size_t n, bool poisoned) {
  for (size_t i = 0; i < n; i++) run_case(&cases[i], poisoned);
}

Test(mla, expanded_every_kind_of_batch, .timeout = 300) { run_table(expanded_kinds, COUNT(expanded_kinds), false); }

Test(mla, absorbed_every_kind_of_batch, .timeout = 300) { run_table(absorbed_kinds, COUNT(absorbed_kinds), false); }

Test(mla, fp8_caches, .timeout = 300) { run_table(fp8_cases, COUNT(fp8_cases), false); }

Test(mla, chunks_splits_and_score_rules, .timeout = 300) { run_table(features, COUNT(features), false); }

Test(mla, deepseek_sized, .timeout = 300) { run_table(deepseek, COUNT(deepseek), false); }

/* ---- threads, out_f32 ---------------------------------------------------------------------------------- */

/* The answer must not depend on how many threads run the units: outputs, lse and caches bit for bit. */
Test(mla, bitwise_identical_for_any_thread_count, .timeout = 300) {
  /* clang-format off */
  static const attention_case cases[] = {
      {.name = "threads: expanded mixed",          .kind = BATCH_MIXED,         .block_size = 16, EXPANDED(48, 32), TYPES(BF16, BF16, HND),   .seed = 391, .sinks = true, .chunk_size = 3},
      {.name = "threads: expanded TILED decodes, split-K",
                                                   .kind = BATCH_DECODE,        .block_size = 16, EXPANDED(32, 48), TYPES(BF16, BF16, TILED), .seed = 392, .split_min_keys = 64, .split_keys = 48},
      {.name = "threads: absorbed decodes",        .kind = BATCH_DECODE,        .block_size = 16, ABSORBED, TYPES(BF16, BF16, NHD), .seed = 393},
      {.name = "threads: absorbed prefills in tiles", .kind = BATCH_PREFILL,    .block_size = 16, ABSORBED, TYPES(F32,  F32,  HND), .seed = 394, .causal_width = 16},
      {.name = "threads: absorbed shared, split-K, fp8",
                                                   .kind = BATCH_SHARED_PREFIX, .block_size = 16, ABSORBED, TYPES(F16,  E4M3, NHD), .seed = 395, .alibi = true,
       .chunk_size = 2, .split_min_keys = 100, .split_keys = 64, .k_scale = 0.5f},
      {.name = "threads: DeepSeek absorbed decodes", .kind = BATCH_DECODE,      .block_size = 64, .num_q_heads = 16, .num_kv_heads = 1, .head_dim = 576,
       .head_dim_v = 512, .kv_latent = true, TYPES(BF16, BF16, NHD), .seed = 396},
  };
  /* clang-format on */
  const int32_t threads[] = {2, 3, 4, 8};
  for (size_t i = 0; i < COUNT(cases); i++) {
    attention_run run;
    build(&run, &cases[i]);
    uattn_tensors ref = attention_run_forward(&run, NULL);
    const size_t lse_bytes = sizeof(float) * (size_t)run.info.num_tokens * cases[i].num_q_heads;
    for (size_t k = 0; k < COUNT(threads); k++) {
      uattn_runtime_config cfg = uattn_runtime_config_default();
      cfg.num_threads = threads[k];
      uattn_runtime *rt;
      cr_assert_eq(uattn_runtime_create(&cfg, &rt), UATTN_OK, "%s", uattn_last_error());
      uattn_tensors t = attention_run_forward(&run, rt);
      const char *name = cases[i].name;
      cr_assert_eq(memcmp(t.out, ref.out, run.out_bytes), 0, "%s: %d threads change the output", name, threads[k]);
      cr_assert_eq(memcmp(t.lse, ref.lse, lse_bytes), 0, "%s: %d threads change the lse", name, threads[k]);
      cr_assert_eq(memcmp(t.key_cache, ref.key_cache, run.cache_bytes), 0, "%s: the key cache", name);
      if (!cases[i].kv_latent)
        cr_assert_eq(memcmp(t.value_cache, ref.value_cache, run.value_cache_bytes), 0, "%s: the value cache", name);
      attention_tensors_free(&t);
      uattn_runtime_destroy(rt);
    }
    attention_tensors_free(&ref);
    attention_run_free(&run);
  }
}

/* out_f32 is the result before its one rounding: rounded by the oracle's own conversion it is the dtype output bit
 * for bit ([T, Hq, Dv] both), with the same lse and caches, and it is no dtype output in disguise. */
Test(mla, out_f32_is_the_unrounded_output, .timeout = 300) {
  /* clang-format off */
  static const attention_case cases[] = {
      {.name = "out_f32: expanded 48/32 bf16 mixed", .kind = BATCH_MIXED,  .block_size = 16, EXPANDED(48, 32), TYPES(BF16, BF16, NHD),   .seed = 401, .sinks = true},
      {.name = "out_f32: expanded 32/48 f16 split-K, TILED",
                                                     .kind = BATCH_DECODE, .block_size = 16, EXPANDED(32, 48), TYPES(F16,  F16,  TILED), .seed = 402, .split_min_keys = 64, .split_keys = 48},
      {.name = "out_f32: absorbed bf16 decodes",     .kind = BATCH_DECODE, .block_size = 16, ABSORBED, TYPES(BF16, BF16, NHD), .seed = 403},
      {.name = "out_f32: absorbed f16 mixed, HND",   .kind = BATCH_MIXED,  .block_size = 16, ABSORBED, TYPES(F16,  F16,  HND), .seed = 404, .alibi = true},
      {.name = "out_f32: absorbed bf16 split-K spec", .kind = BATCH_SPEC_DECODE, .block_size = 16, ABSORBED, TYPES(BF16, BF16, NHD), .seed = 405,
       .split_min_keys = 100, .split_keys = 200},
  };
  /* clang-format on */
  for (size_t i = 0; i < COUNT(cases); i++) {
    const attention_case *c = &cases[i];
    attention_run run;
    build(&run, c);
    uattn_tensors narrow = attention_run_forward(&run, NULL), wide = attention_tensors(&run);
    attention_tensors_out_f32(&run, &wide);
    cr_assert_eq(uattn_forward(run.plan, &run.layer, &wide, NULL), UATTN_OK, "%s: %s", c->name, uattn_last_error());
    const size_t not_dtype = attention_check_out_f32(&run, &narrow, &wide);
    cr_assert(run.info.num_tokens == 0 || not_dtype > 0, "%s: every fp32 output is a dtype value: rounded already",
              c->name);
    attention_tensors_free(&narrow);
    attention_tensors_free(&wide);
    attention_run_free(&run);
  }
}

/* ---- every kernel level, over caches whose unseen entries are NaN ------------------------------------------ */

/* Every table above on every level of the ladder (a level this CPU lacks through its twin: the suites run with
 * UATTN_TWINS), each layer on the level at or below the named one that keeps its precision, within that level's
 * contract, with every cache entry no query sees NaN or -inf (attention_run_poison_unseen; on the absorbed form the
 * latent's value dims too): a kernel that scores such a key or weighs such a value by zero returns NaN. */
static const char *const ladder[] = {"portable", "avx2", "avx512", "avx512bf16", "amx"};

ParameterizedTestParameters(mla, every_level_over_poisoned_caches) {
  static size_t levels[COUNT(ladder)];
  for (size_t k = 0; k < COUNT(ladder); k++) levels[k] = k;
  return cr_make_param_array(size_t, levels, COUNT(ladder));
}

/* Each level its own test, so each has the whole timeout (a twin's pass takes minutes under ASan). */
ParameterizedTest(size_t *level, mla, every_level_over_poisoned_caches, .timeout = 600) {
  const char *forced = getenv("UATTN_ISA");
  if (attention_force_level(ladder[*level], "mla, unseen entries poisoned")) {
    run_table(expanded_kinds, COUNT(expanded_kinds), true);
    run_table(absorbed_kinds, COUNT(absorbed_kinds), true);
    run_table(fp8_cases, COUNT(fp8_cases), true);
    run_table(features, COUNT(features), true);
    run_table(deepseek, COUNT(deepseek), true);
  }
  attention_restore_isa(forced);
}

/* ---- the identity multi-head latent attention rests on --------------------------------------------------- */

/* A model's attention in both forms. Per token a latent c (DC dims) and a rope key kr (DR); per query head h a
 * query (q_nope: DN dims, q_rope: DR) and up-projections W_UK_h [DC][DN], W_UV_h [DC][DVH]. Expanded: keys per head
 * [c W_UK_h, kr] (DN + DR dims), values c W_UV_h (DVH), one KV head a query head. Absorbed: queries
 * [q_nope W_UK_h^T, q_rope] (DC + DR dims), one KV head whose latent [c, kr] is the key and whose first DC dims
 * are the value, the output then times W_UV_h. The scores are equal (q_nope . c W_UK_h = q_nope W_UK_h^T . c) and
 * so are the outputs (sum_j p_j c_j W_UV_h = (sum_j p_j c_j) W_UV_h): the two forms through uattn_forward may differ
 * by their rounding only. */
enum { MH = 8, DC = 64, DR = 16, DN = 32, DVH = 32, DE = DN + DR, DA = DC + DR };

static double w_uk[MH][DC][DN], w_uv[MH][DC][DVH];

/* An f32 value in [-1, 1] (an input as stored), the same for the same (seed, a, b, i). */
static double input_value(uint64_t seed, int32_t a, int32_t b, int32_t i) {
  test_rng g = {seed * 0x9e3779b97f4a7c15ull ^ ((uint64_t)(uint32_t)a << 40) ^ ((uint64_t)(uint32_t)b << 20) ^
                (uint64_t)(uint32_t)i};
  test_rng_next(&g);
  return (double)(float)(2.0 * test_rng_unit(&g) - 1.0);
}

/* Token (request r, position p)'s latent and rope key, [c, kr]: DA values. */
static void token_latent(int32_t r, int32_t p, double *x) {
  for (int32_t i = 0; i < DA; i++) x[i] = input_value(1, r, p, i);
}

/* The expanded key and value of the token for head h, each rounded to f32 once (the model computes them in fp32). */
static void expanded_kv(const double *lat, int32_t h, double *k, double *v) {
  for (int32_t n = 0; n < DN; n++) {
    double s = 0;
    for (int32_t c = 0; c < DC; c++) s += lat[c] * w_uk[h][c][n];
    k[n] = (double)(float)s;
  }
  for (int32_t i = 0; i < DR; i++) k[DN + i] = lat[DC + i];
  for (int32_t e = 0; e < DVH; e++) {
    double s = 0;
    for (int32_t c = 0; c < DC; c++) s += lat[c] * w_uv[h][c][e];
    v[e] = (double)(float)s;
  }
}

/* Query row's head h in both forms: [q_nope, q_rope] and [q_nope W_UK_h^T (rounded to f32), q_rope]. */
static void queries(int32_t row, int32_t h, double *qe, double *qa) {
  for (int32_t i = 0; i < DE; i++) qe[i] = input_value(2, row, h, i);
  for (int32_t c = 0; c < DC; c++) {
    double s = 0;
    for (int32_t n = 0; n < DN; n++) s += qe[n] * w_uk[h][c][n];
    qa[c] = (double)(float)s;
  }
  for (int32_t i = 0; i < DR; i++) qa[DC + i] = qe[DN + i];
}

/* sum |a_i b_i| */
static double dot(const double *a, const double *b, int32_t n) {
  double s = 0;
  for (int32_t i = 0; i < n; i++) s += fabs(a[i] * b[i]);
  return s;
}

/* Fills both runs' q, k, v and caches with the model's tensors: the cached tokens' in the caches, the step's in
 * k and v (row q0 + i of request r at position num_computed + i). */
static void fill_model(attention_run *e, attention_run *a, const oracle_step *s) {
  const int32_t bs = e->c.block_size;
  double lat[DA], k[DE], v[DVH];
  int32_t q0 = 0;
  for (int32_t r = 0; r < s->num_reqs; q0 += s->num_scheduled[r], r++) {
    const int32_t nc = s->num_computed[r], n = nc + s->num_scheduled[r];
    for (int32_t p = 0; p < n; p++) {
      const int32_t row = q0 + p - nc;
      token_latent(r, p, lat);
      const int64_t slot = (int64_t)s->block_table[(size_t)r * s->block_table_stride + p / bs] * bs + p % bs;
      for (int32_t h = 0; h < MH; h++) {
        expanded_kv(lat, h, k, v);
        for (int32_t d = 0; d < DE; d++) {
          if (p < nc)
            oracle_store(e->key_cache0, F32, oracle_cache_index(&e->layer, bs, slot, h, d, false), k[d]);
          else
            oracle_store(e->k, F32, ((size_t)row * MH + h) * DE + d, k[d]);
        }
        for (int32_t d = 0; d < DVH; d++) {
          if (p < nc)
            oracle_store(e->value_cache0, F32, oracle_cache_index(&e->layer, bs, slot, h, d, true), v[d]);
          else
            oracle_store(e->v, F32, ((size_t)row * MH + h) * DVH + d, v[d]);
        }
      }
      for (int32_t d = 0; d < DA; d++) {
        if (p < nc)
          oracle_store(a->key_cache0, F32, oracle_cache_index(&a->layer, bs, slot, 0, d, false), lat[d]);
        else
          oracle_store(a->k, F32, (size_t)row * DA + d, lat[d]);
      }
    }
  }
  double qe[DE], qa[DA];
  for (int32_t t = 0; t < e->info.num_tokens; t++)
    for (int32_t h = 0; h < MH; h++) {
      queries(t, h, qe, qa);
      for (int32_t d = 0; d < DE; d++) oracle_store(e->q, F32, ((size_t)t * MH + h) * DE + d, qe[d]);
      for (int32_t d = 0; d < DA; d++) oracle_store(a->q, F32, ((size_t)t * MH + h) * DA + d, qa[d]);
    }
}

/* How far apart the two forms may be. u = 2^-24, fp32's unit roundoff. Each form's logit s = scale <q, k> is
 * computed from fp32 inputs each within u of the exact model's (c, kr, q_nope, q_rope are exact; c W_UK_h and
 * q_nope W_UK_h^T are rounded once) by an fp32 dot product over D dims (within D u of sum |q_i k_i|), so it lies
 * within delta = (D + 2) u scale max sum |q_i k_i| of the exact model's: delta_e (D 48) and delta_a (D 80). Logits
 * moved by up to delta_e + delta_a apart move each weight by a factor within e^(+-2 (delta_e + delta_a)), so the
 * outputs by up to (e^(2 (delta_e + delta_a)) - 1) max |v| (v the expanded values), and lse by delta_e + delta_a.
 * Beside that each form's own fp32 evaluation of the softmax and its weighted sum is within the f32 contract
 * (attention_tolerance: of its largest output), the absorbed form's carried through the up-projection, which
 * multiplies an error of each latent output dim by |W_UV_h[c][d]| (at most max_d sum_c |W_UV_h[c][d]|). */
typedef struct identity_bound {
  double out, lse_delta;
} identity_bound;

static identity_bound derive_bound(const attention_run *e, const oracle_step *s, double max_out_e, double max_out_lat) {
  const double u = 0x1p-24, scale = (double)e->layer.scale;
  double qe[DE], qa[DA], v[DVH], se = 0, sa = 0, vmax = 0, w1 = 0;
  int32_t row = 0;
  for (int32_t r = 0; r < s->num_reqs; r++) {
    /* every key of the request, more than a row sees: a safe bound */
    const int32_t n = s->num_computed[r] + s->num_scheduled[r];
    double *lat = malloc(sizeof(double) * (size_t)n * DA), *k = malloc(sizeof(double) * (size_t)n * MH * DE);
    for (int32_t p = 0; p < n; p++) {
      token_latent(r, p, lat + (size_t)p * DA);
      for (int32_t h = 0; h < MH; h++) {
        expanded_kv(lat + (size_t)p * DA, h, k + ((size_t)p * MH + h) * DE, v);
        for (int32_t d = 0; d < DVH; d++) vmax = fmax(vmax, fabs(v[d]));
      }
    }
    for (int32_t i = 0; i < s->num_scheduled[r]; i++, row++)
      for (int32_t h = 0; h < MH; h++) {
        queries(row, h, qe, qa);
        for (int32_t p = 0; p < n; p++) {
          se = fmax(se, dot(qe, k + ((size_t)p * MH + h) * DE, DE));
          sa = fmax(sa, dot(qa, lat + (size_t)p * DA, DA));
        }
      }
    free(lat);
    free(k);
  }
  for (int32_t h = 0; h < MH; h++)
    for (int32_t d = 0; d < DVH; d++) {
      double col = 0;
      for (int32_t c = 0; c < DC; c++) col += fabs(w_uv[h][c][d]);
      w1 = fmax(w1, col);
    }
  const double delta = (DE + 2) * u * scale * se + (DA + 2) * u * scale * sa, tol = attention_tolerance(F32, F32);
  return (identity_bound){.out = expm1(2 * delta) * vmax + tol * (max_out_e + max_out_lat * w1), .lse_delta = delta};
}

/* The absorbed output of (row, h) times W_UV_h: DVH values. */
static void up_project(const double *lat_out, int32_t h, double *y) {
  for (int32_t d = 0; d < DVH; d++) {
    double x = 0;
    for (int32_t c = 0; c < DC; c++) x += lat_out[c] * w_uv[h][c][d];
    y[d] = x;
  }
}

/* Checks the expanded output/lse against the absorbed one projected; `who` names the pair in messages. */
static void expect_identity(const char *who, const attention_run *e, const oracle_step *s, const double *out_e,
                            const double *lse_e, const double *out_a, const double *lse_a) {
  const int32_t T = e->info.num_tokens;
  double max_e = 0, max_lat = 0, err = 0;
  for (size_t i = 0; i < (size_t)T * MH * DVH; i++) max_e = fmax(max_e, fabs(out_e[i]));
  for (size_t i = 0; i < (size_t)T * MH * DC; i++) max_lat = fmax(max_lat, fabs(out_a[i]));
  const identity_bound b = derive_bound(e, s, max_e, max_lat);
  const double tol = attention_tolerance(F32, F32);
  for (int32_t t = 0; t < T; t++)
    for (int32_t h = 0; h < MH; h++) {
      double y[DVH];
      up_project(out_a + ((size_t)t * MH + h) * DC, h, y);
      for (int32_t d = 0; d < DVH; d++) {
        const double x = out_e[((size_t)t * MH + h) * DVH + d], diff = fabs(x - y[d]);
        err = fmax(err, diff);
        cr_assert(diff <= b.out, "%s: %s: row %d head %d dim %d: expanded %.9g, absorbed %.9g (bound %.3g)", e->c.name,
                  who, t, h, d, x, y[d], b.out);
      }
      const double le = lse_e[(size_t)t * MH + h], la = lse_a[(size_t)t * MH + h];
      /* each form's lse within the attention suites' fp32 allowance (attention_case.c) of its own exact value */
      const double lb = b.lse_delta + 2 * (10 * tol * fmax(1.0, fabs(le)) + 1e-5);
      cr_assert(fabs(le - la) <= lb, "%s: %s: row %d head %d: lse %.9g and %.9g (bound %.3g)", e->c.name, who, t, h, le,
                la, lb);
    }
  fprintf(stderr, "%-34s %-8s max |expanded - absorbed W_UV| %.3g, bound %.3g (max |out| %.3g)\n", e->c.name, who, err,
          b.out, max_e);
}

Test(mla, expanded_and_absorbed_forms_agree, .timeout = 300) {
  test_rng g = {77};
  for (int32_t h = 0; h < MH; h++)
    for (int32_t c = 0; c < DC; c++) {
      for (int32_t n = 0; n < DN; n++) w_uk[h][c][n] = (2.0 * test_rng_unit(&g) - 1.0) / 8.0; /* 1/sqrt(DC) */
      for (int32_t n = 0; n < DVH; n++) w_uv[h][c][n] = (2.0 * test_rng_unit(&g) - 1.0) / 8.0;
    }
  const batch_kind kinds[] = {BATCH_DECODE, BATCH_CHUNKED_LONG};
  const char *names[] = {"identity: decodes", "identity: chunked prefill"};
  for (size_t i = 0; i < COUNT(kinds); i++) {
    /* the same kind, block size and seed: the same batch and block tables (make_batch draws them first) */
    const attention_case ce = {.name = names[i],
                               .kind = kinds[i],
                               .block_size = 16,
                               .num_q_heads = MH,
                               .num_kv_heads = MH,
                               .head_dim = DE,
                               .head_dim_v = DVH,
                               TYPES(F32, F32, NHD),
                               .seed = 411 + i};
    attention_case ca = ce;
    ca.num_kv_heads = 1, ca.head_dim = DA, ca.head_dim_v = DC, ca.kv_latent = true;
    attention_run e, a;
    attention_run_build(&e, &ce);
    attention_run_build(&a, &ca);
    cr_assert_eq(e.info.num_tokens, a.info.num_tokens);
    cr_assert_eq(memcmp(e.batch.block_table, a.batch.block_table, sizeof e.batch.block_table), 0);
    e.layer.scale = a.layer.scale = 1.0f / sqrtf((float)DE); /* the model's, in both forms */
    int32_t eff[RB_MAX_REQS], eff_a[RB_MAX_REQS];
    const oracle_step s = attention_oracle_step(&e, eff), sa = attention_oracle_step(&a, eff_a);
    fill_model(&e, &a, &s);

    const size_t T = (size_t)e.info.num_tokens;
    double *oe = malloc(sizeof(double) * (T * MH * DVH + 1)), *le = malloc(sizeof(double) * (T * MH + 1));
    double *oa = malloc(sizeof(double) * (T * MH * DC + 1)), *la = malloc(sizeof(double) * (T * MH + 1));
    /* the oracle first: the identity holds for the reference itself within the bound */
    uattn_tensors re = attention_tensors(&e), ra = attention_tensors(&a);
    cr_assert_eq(oracle_write_cache(&s, &e.layer, &re), 0, "%s", oracle_last_error());
    cr_assert_eq(oracle_attention(&s, &e.layer, &re, oe, le), 0, "%s", oracle_last_error());
    cr_assert_eq(oracle_write_cache(&sa, &a.layer, &ra), 0, "%s", oracle_last_error());
    cr_assert_eq(oracle_attention(&sa, &a.layer, &ra, oa, la), 0, "%s", oracle_last_error());
    expect_identity("oracle", &e, &s, oe, le, oa, la);

    /* then uattn_forward, each form on its own layer */
    uattn_tensors te = attention_run_forward(&e, NULL), ta = attention_run_forward(&a, NULL);
    for (size_t x = 0; x < T * MH * DVH; x++) oe[x] = ((const float *)te.out)[x];
    for (size_t x = 0; x < T * MH * DC; x++) oa[x] = ((const float *)ta.out)[x];
    for (size_t x = 0; x < T * MH; x++) le[x] = te.lse[x], la[x] = ta.lse[x];
    expect_identity("forward", &e, &s, oe, le, oa, la);

    attention_tensors_free(&re), attention_tensors_free(&ra);
    attention_tensors_free(&te), attention_tensors_free(&ta);
    free(oe), free(le), free(oa), free(la);
    attention_run_free(&e);
    attention_run_free(&a);
  }
}
