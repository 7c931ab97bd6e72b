/* uattn_forward against the dense double-precision oracle: every kind of batch, block sizes 16-256, head
 * dims 64-256, GQA 1-8 and MQA, three dtypes, the three layouts (NHD, HND and uattn's TILED), soft cap,
 * sliding window, sinks, ALiBi, encoder and cross attention, the empty batch and a row with no key; and all of
 * it again over caches whose entries no query sees are NaN.
 * Tolerances: attention_case.c. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/attention_case.h"

static void run_case(const attention_case *c) {
  attention_run run;
  attention_run_build(&run, c);
  attention_run_check(&run);
  attention_run_free(&run);
}

#define F32 UATTN_F32
#define BF16 UATTN_BF16
#define F16 UATTN_F16
#define NHD UATTN_LAYOUT_NHD
#define HND UATTN_LAYOUT_HND
#define TILED UATTN_LAYOUT_TILED
#define DEC UATTN_ATTENTION_DECODER

/* name, kind, bs, Hq, Hkv, D, dtype, cache dtype, layout, type, soft cap, window, sinks, alibi, chunk, width, seed */
static const attention_case kinds[] = {
    {"pure decode", BATCH_DECODE, 16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 1},
    {"pure prefill", BATCH_PREFILL, 16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 2},
    {"prefix prefill", BATCH_PREFIX_PREFILL, 16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 3},
    {"chunked prefill, long context", BATCH_CHUNKED_LONG, 16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 4},
    {"mixed batch", BATCH_MIXED, 16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 5},
    {"spec decode", BATCH_SPEC_DECODE, 16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 6},
    {"shared prefix", BATCH_SHARED_PREFIX, 16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 7},
    {"empty batch", BATCH_EMPTY, 16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 8},
    {"mixed, small causal slices", BATCH_MIXED, 16, 4, 4, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 7, 9},
};

Test(attention, every_kind_of_batch, .timeout = 300) {
  for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) run_case(&kinds[i]);
}

static const attention_case shapes[] = {
    {"block 32, D 80", BATCH_MIXED, 32, 8, 8, 80, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 11},
    {"block 64, D 96, MQA", BATCH_MIXED, 64, 8, 1, 96, F32, F32, HND, DEC, 0, 0, 0, 0, 0, 0, 12},
    {"block 128, D 128, GQA 4", BATCH_SHARED_PREFIX, 128, 8, 2, 128, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 13},
    {"block 256, D 192, GQA 8", BATCH_SPEC_DECODE, 256, 8, 1, 192, F32, F32, HND, DEC, 0, 0, 0, 0, 0, 0, 14},
    {"block 16, D 256, GQA 2", BATCH_CHUNKED_LONG, 16, 4, 2, 256, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 15},
    {"block 16, HND, GQA 1", BATCH_MIXED, 16, 4, 4, 64, F32, F32, HND, DEC, 0, 0, 0, 0, 0, 0, 16},
};

Test(attention, block_sizes_head_dims_gqa_and_layouts, .timeout = 300) {
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) run_case(&shapes[i]);
}

static const attention_case dtypes[] = {
    {"bf16", BATCH_MIXED, 16, 8, 2, 64, BF16, BF16, NHD, DEC, 0, 0, 0, 0, 0, 0, 21},
    {"f16", BATCH_MIXED, 16, 8, 2, 64, F16, F16, HND, DEC, 0, 0, 0, 0, 0, 0, 22},
    {"f32 in, bf16 cache", BATCH_SPEC_DECODE, 16, 8, 2, 64, F32, BF16, NHD, DEC, 0, 0, 0, 0, 0, 0, 23},
    {"bf16 in, f32 cache", BATCH_SHARED_PREFIX, 16, 8, 2, 64, BF16, F32, HND, DEC, 0, 0, 0, 0, 0, 0, 24},
    {"f16 in, bf16 cache", BATCH_MIXED, 32, 8, 4, 128, F16, BF16, NHD, DEC, 0, 0, 0, 0, 0, 0, 25},
};

Test(attention, dtypes, .timeout = 300) {
  for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++) run_case(&dtypes[i]);
}

static const attention_case features[] = {
    {"soft cap", BATCH_MIXED, 16, 8, 2, 64, F32, F32, NHD, DEC, 5.0f, 0, 0, 0, 0, 0, 31},
    {"sliding window", BATCH_MIXED, 16, 8, 2, 64, F32, F32, NHD, DEC, 0, 37, 0, 0, 0, 0, 32},
    {"sliding window, long context", BATCH_CHUNKED_LONG, 16, 8, 2, 64, F32, F32, HND, DEC, 0, 100, 0, 0, 0, 0, 33},
    {"sinks", BATCH_SPEC_DECODE, 16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 1, 0, 0, 0, 34},
    {"alibi", BATCH_MIXED, 16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 1, 0, 0, 35},
    {"everything at once, bf16", BATCH_SHARED_PREFIX, 32, 8, 2, 64, BF16, BF16, HND, DEC, 30.0f, 50, 1, 1, 2, 0, 36},
    {"encoder (bidirectional)", BATCH_PREFIX_PREFILL, 16, 8, 2, 64, F32, F32, NHD, UATTN_ATTENTION_ENCODER_ONLY, 0, 0,
     0, 0, 0, 0, 37},
    {"encoder, mixed chunks", BATCH_MIXED, 16, 8, 2, 64, F32, F32, HND, UATTN_ATTENTION_ENCODER, 0, 0, 1, 1, 0, 0, 38},
    {"cross attention, a row with no key", BATCH_MIXED, 16, 8, 2, 64, F32, F32, NHD, UATTN_ATTENTION_ENCODER_DECODER, 0,
     0, 0, 0, 0, 0, 39},
    {"cross attention, sinks", BATCH_DECODE, 32, 8, 2, 64, F16, F16, HND, UATTN_ATTENTION_ENCODER_DECODER, 0, 0, 1, 0,
     0, 0, 40},
};

Test(attention, features, .timeout = 300) {
  for (size_t i = 0; i < sizeof features / sizeof *features; i++) run_case(&features[i]);
}

/* PR 784: the shared part chunk_size blocks at a time with an online merge equals the whole shared part. */
Test(attention, chunked_and_whole_shared_agree, .timeout = 300) {
  const int32_t chunks[] = {1, 2, 3, 7, 64};
  for (size_t i = 0; i < sizeof chunks / sizeof *chunks; i++) {
    attention_case c = {
        "chunked shared", BATCH_SHARED_PREFIX, 16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, chunks[i], 0, 50};
    run_case(&c);
    /* TILED: a chunk's blocks are read tile by tile (block 32: two tiles a block) */
    attention_case t = c;
    t.name = "chunked shared, TILED", t.block_size = 32, t.dtype = t.cache_dtype = BF16, t.layout = TILED, t.seed = 51;
    run_case(&t);
  }
}

/* One forward of the run on a new runtime of `threads` workers, returned in *rt for the caller to destroy
 * once done with the tensors. */
static uattn_tensors forward_on_threads(const attention_run *run, int32_t threads, uattn_runtime **rt) {
  uattn_runtime_config cfg = uattn_runtime_config_default();
  cfg.num_threads = threads;
  cr_assert_eq(uattn_runtime_create(&cfg, rt), UATTN_OK, "%s", uattn_last_error());
  return attention_run_forward(run, *rt);
}

/* The run's output on each of `n` thread counts is the one thread's, bit for bit; with everything, its lse
 * and both caches after the step too. */
static void check_same_bits_on_threads(const attention_run *run, const int32_t *threads, size_t n, bool everything) {
  uattn_tensors ref = attention_run_forward(run, NULL);
  for (size_t k = 0; k < n; k++) {
    uattn_runtime *rt;
    uattn_tensors t = forward_on_threads(run, threads[k], &rt);
    cr_assert_eq(memcmp(t.out, ref.out, run->out_bytes), 0, "%s: %d threads change the output", run->c.name,
                 threads[k]);
    if (everything) {
      cr_assert_eq(memcmp(t.lse, ref.lse, sizeof(float) * (size_t)run->info.num_tokens * run->c.num_q_heads), 0,
                   "%s: %d threads change the lse", run->c.name, threads[k]);
      cr_assert_eq(memcmp(t.key_cache, ref.key_cache, run->cache_bytes), 0);
      cr_assert_eq(memcmp(t.value_cache, ref.value_cache, run->cache_bytes), 0);
    }
    attention_tensors_free(&t);
    uattn_runtime_destroy(rt);
  }
  attention_tensors_free(&ref);
}

/* The work is split into units that each write their own rows, so the answer must not depend on how many
 * threads run them: bitwise, outputs, lse and caches. */
Test(attention, bitwise_identical_for_any_thread_count, .timeout = 300) {
  const attention_case cases[] = {
      {"threads: mixed bf16", BATCH_MIXED, 16, 8, 2, 64, BF16, BF16, HND, DEC, 0, 0, 1, 0, 3, 0, 61},
      {"threads: shared prefix", BATCH_SHARED_PREFIX, 32, 8, 1, 128, F32, F32, NHD, DEC, 0, 0, 0, 1, 0, 0, 62},
      {"threads: long chunk", BATCH_CHUNKED_LONG, 16, 4, 4, 64, F16, F16, NHD, DEC, 0, 0, 0, 0, 0, 32, 63},
      {"threads: TILED mixed bf16", BATCH_MIXED, 16, 8, 2, 64, BF16, BF16, TILED, DEC, 0, 0, 1, 0, 0, 0, 64},
      {"threads: TILED decodes, split-K", BATCH_DECODE, 128, 32, 8, 128, BF16, BF16, TILED, DEC, 0, 0, 0, 0, 0, 0, 65,
       64, 48},
      /* few decodes: on 2-4 threads their all-heads units take fewer KV heads each (units.c's all_heads_group) */
      {"threads: NHD decodes, bf16", BATCH_DECODE, 128, 32, 8, 128, BF16, BF16, NHD, DEC, 0, 0, 0, 0, 0, 0, 67},
      {"threads: NHD decodes, f16, window, sinks", BATCH_DECODE, 16, 16, 4, 64, F16, F16, NHD, DEC, 0, 90, 1, 0, 0, 0,
       68},
      /* one KV head: a prompt's row tiles (causal width) are units of their own (units.c's item_tiles) */
      {"threads: MQA prefills in tiles", BATCH_PREFILL, 16, 8, 1, 64, BF16, BF16, NHD, DEC, 0, 0, 0, 0, 0, 16, 69},
      {"threads: MQA mixed in tiles, window", BATCH_MIXED, 16, 8, 1, 64, F32, F32, HND, DEC, 0, 40, 1, 0, 0, 24, 70},
      {"threads: MQA verifications in tiles, split-K", BATCH_SPEC_DECODE, 16, 8, 1, 64, F32, F32, NHD, DEC, 0, 0, 0, 0,
       0, 3, 71, 100, 200},
      /* clang-format off */
      {"threads: TILED shared prefix, fp8", BATCH_SHARED_PREFIX, 16, 8, 2, 64, F32, UATTN_FP8_E4M3, TILED, DEC, 0, 0, 0, 1,
       2, 0, 66, 0, 0, 0.5f, 3.0f},
      /* clang-format on */
  };
  const int32_t threads[] = {1, 2, 3, 4, 8}; /* 8 on fewer cores too: small head groups (all_heads_group) */
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    attention_run run;
    attention_run_build(&run, &cases[i]);
    check_same_bits_on_threads(&run, threads, sizeof threads / sizeof *threads, true);
    attention_run_free(&run);
  }
}

/* Split-K: long decodes computed as key ranges and merged in split order. Small thresholds here so that
 * the test batches split often, including ranges that hold no block and verification rows. */
Test(attention, split_k_decodes, .timeout = 300) {
  const attention_case cases[] = {
      {"split-K decodes", BATCH_DECODE, 16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 71, 64, 48},
      {"split-K spec decode, bf16", BATCH_SPEC_DECODE, 16, 8, 2, 64, BF16, BF16, HND, DEC, 0, 0, 1, 0, 0, 0, 72, 100,
       200},
      {"split-K shared prefix, chunked", BATCH_SHARED_PREFIX, 32, 8, 1, 128, F32, F32, NHD, DEC, 0, 40, 0, 1, 2, 0, 73,
       128, 96},
      {"split-K mixed, window", BATCH_MIXED, 16, 4, 4, 64, F16, F16, NHD, DEC, 3.0f, 90, 0, 0, 0, 5, 74, 32, 32},
      {"split-K decodes, TILED, bf16", BATCH_DECODE, 16, 8, 2, 64, BF16, BF16, TILED, DEC, 0, 0, 1, 0, 0, 0, 75, 64,
       48},
      {"split-K decodes, TILED, block 128, D 128", BATCH_DECODE, 128, 32, 8, 128, BF16, BF16, TILED, DEC, 0, 0, 0, 0, 0,
       0, 76, 100, 200},
      {"split-K spec decode, TILED, f32", BATCH_SPEC_DECODE, 32, 8, 2, 80, F32, F32, TILED, DEC, 0, 0, 0, 1, 0, 0, 77,
       100, 200},
      {"split-K shared prefix, chunked, TILED", BATCH_SHARED_PREFIX, 32, 8, 1, 128, F16, F16, TILED, DEC, 0, 40, 0, 0,
       2, 0, 78, 128, 96},
      /* verifications of up to 8 rows in tiles of 3 (causal width): each (split, tile) a unit of its own */
      {"split-K spec decode in tiles, MQA", BATCH_SPEC_DECODE, 16, 8, 1, 64, F32, F32, NHD, DEC, 0, 0, 1, 0, 0, 3, 79,
       100, 200},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    attention_run run;
    attention_run_build(&run, &cases[i]);
    attention_run_check(&run);
    /* and the split answer is the same on any number of threads */
    check_same_bits_on_threads(&run, (const int32_t[]){2, 3}, 2, false);
    attention_run_free(&run);
  }
}

/* A request's blocks go to the decode kernel as one call of up to UATTN_DECODE_MAX_KEYS keys, a list of
 * blocks wherever they lie on NHD and HND (parts.c's unique_run, shared_run), and at block sizes that take
 * no list (not a power of two, or under 8 keys) a run of adjacent NHD blocks, at most MAX_DECODE_BLOCKS of
 * them (5-key blocks): decodes and verifications over such runs against the oracle, their blocks in order
 * (one stretch of the cache) and scattered (the block tables' usual random order), with split-K cutting
 * runs, windows, sinks, fp8 and caches whose unseen entries are NaN, and the same bits on any number of
 * threads. TILED and HND at such block sizes (one block a call) ride along. */
Test(attention, decodes_over_runs_of_blocks, .timeout = 300) {
  /* clang-format off */
  const attention_case cases[] = {
      {"decodes, block 16", BATCH_DECODE, 16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 81},
      {"decodes, MQA, bf16", BATCH_DECODE, 16, 8, 1, 64, BF16, BF16, NHD, DEC, 0, 0, 0, 0, 0, 0, 82},
      {"split-K decodes, window, sinks", BATCH_DECODE, 16, 16, 4, 64, F16, F16, NHD, DEC, 0, 90, 1, 0, 0, 0,
       83, 64, 48},
      {"spec decode, bf16", BATCH_SPEC_DECODE, 16, 8, 2, 64, BF16, BF16, NHD, DEC, 0, 0, 1, 0, 0, 0, 84, 100,
       200},
      {"decodes, block 128, D 128", BATCH_DECODE, 128, 32, 8, 128, BF16, BF16, NHD, DEC, 0, 0, 0, 0, 0, 0, 85},
      {"mixed, soft cap, ALiBi", BATCH_MIXED, 32, 8, 2, 80, F32, F32, NHD, DEC, 20.0f, 0, 0, 1, 0, 0, 86},
      {"decodes, fp8", BATCH_DECODE, 16, 8, 2, 128, BF16, UATTN_FP8_E4M3, NHD, DEC, 0, 0, 0, 0, 0, 0, 87,
       .k_scale = 0.5f, .v_scale = 2.0f},
      {"shared prefix", BATCH_SHARED_PREFIX, 16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 88},
      {"split-K spec decode, window, f16", BATCH_SPEC_DECODE, 16, 8, 2, 64, F16, F16, NHD, DEC, 0, 40, 0, 0,
       0, 0, 90, 100, 200},
      {"shared prefix, HND", BATCH_SHARED_PREFIX, 16, 8, 2, 64, F32, F32, HND, DEC, 0, 0, 0, 0, 0, 0, 91},
      {"decodes, HND, fp8 E5M2", BATCH_DECODE, 16, 8, 2, 128, BF16, UATTN_FP8_E5M2, HND, DEC, 0, 0, 0, 0, 0, 0, 92,
       .k_scale = 2.0f, .v_scale = 0.25f},
      {"split-K spec decode, HND, window, ALiBi", BATCH_SPEC_DECODE, 32, 8, 2, 64, F16, F16, HND, DEC, 0, 40, 0, 1, 0,
       0, 93, 100, 200},
      {"decodes, TILED", BATCH_DECODE, 16, 8, 2, 64, BF16, BF16, TILED, DEC, 0, 0, 0, 0, 0, 0, 89},
      {"decodes, block 24", BATCH_DECODE, 24, 8, 2, 64, BF16, BF16, NHD, DEC, 0, 0, 0, 0, 0, 0, 94},
      {"decodes, block 5", BATCH_DECODE, 5, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 95},
      {"shared prefix, block 48", BATCH_SHARED_PREFIX, 48, 8, 2, 64, F16, F16, NHD, DEC, 0, 0, 0, 0, 0, 0, 96},
      {"split-K spec decode, block 24, window", BATCH_SPEC_DECODE, 24, 8, 2, 64, F16, F16, NHD, DEC, 0, 40, 0, 0, 0,
       0, 97, 100, 200},
      {"decodes, block 24, HND", BATCH_DECODE, 24, 8, 2, 64, BF16, BF16, HND, DEC, 0, 0, 0, 0, 0, 0, 98},
  };
  /* clang-format on */
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    for (int scattered = 0; scattered < 2; scattered++) {
      attention_case c = cases[i];
      char name[96];
      snprintf(name, sizeof name, "%s, blocks %s", c.name, scattered ? "scattered" : "in order");
      c.name = name, c.blocks_in_order = !scattered;
      attention_run run;
      attention_run_build(&run, &c);
      attention_run_check(&run);
      check_same_bits_on_threads(&run, (const int32_t[]){2, 4, 8}, 3, false);
      attention_run_poison_unseen(&run);
      attention_run_check(&run);
      attention_run_free(&run);
    }
}

/* ---- the avx512bf16 level against the oracle ------------------------------------------------------------ */

/* bf16 models on the avx512bf16 level (UATTN_ISA names it; a CPU without AVX512-BF16 runs its exact twin), P in
 * bf16 (the default) and in fp32, every kind of batch and every score rule, against the dense fp64 oracle
 * within the level's precision contract (attention_case.c: attention_contract). Each error is printed beside
 * the avx512 level's. */
Test(attention, bf16_level_against_the_oracle, .timeout = 300) {
  static const attention_case cases[] = {
      {"bf16 decode", BATCH_DECODE, 128, 32, 8, 128, BF16, BF16, NHD, DEC, 0, 0, 0, 0, 0, 0, 81},
      {"bf16 prefill", BATCH_PREFILL, 16, 8, 2, 128, BF16, BF16, NHD, DEC, 0, 0, 0, 0, 0, 0, 82},
      {"bf16 prefix prefill", BATCH_PREFIX_PREFILL, 128, 8, 2, 128, BF16, BF16, HND, DEC, 0, 0, 0, 0, 0, 0, 83},
      {"bf16 chunked, long", BATCH_CHUNKED_LONG, 16, 8, 1, 64, BF16, BF16, NHD, DEC, 0, 0, 0, 0, 0, 0, 84},
      {"bf16 mixed", BATCH_MIXED, 128, 32, 8, 128, BF16, BF16, NHD, DEC, 0, 0, 0, 0, 0, 0, 85},
      {"bf16 spec decode", BATCH_SPEC_DECODE, 16, 8, 2, 128, BF16, BF16, NHD, DEC, 0, 0, 1, 0, 0, 0, 86},
      {"bf16 shared prefix, chunked", BATCH_SHARED_PREFIX, 16, 8, 2, 80, BF16, BF16, NHD, DEC, 0, 0, 0, 0, 2, 0, 87},
      {"bf16 everything at once", BATCH_MIXED, 32, 8, 2, 64, BF16, BF16, HND, DEC, 30.0f, 50, 1, 1, 2, 0, 88},
      {"bf16 decode, TILED", BATCH_DECODE, 128, 32, 8, 128, BF16, BF16, TILED, DEC, 0, 0, 0, 0, 0, 0, 89},
      {"bf16 mixed, TILED", BATCH_MIXED, 16, 8, 2, 128, BF16, BF16, TILED, DEC, 0, 0, 1, 0, 0, 0, 90},
  };
  const char *forced = getenv("UATTN_ISA");
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    attention_run run;
    attention_run_build(&run, &cases[i]);
    double err[3], scale; /* avx512bf16 with P in bf16, in fp32; the avx512 level */
    const char *level = NULL;
    for (int k = 0; k < 3; k++) {
      setenv("UATTN_ISA", k < 2 ? "avx512bf16" : "avx512", 1);
      if (k == 0) level = uattn_kernel_set(NULL);
      run.layer.probs_fp32 = k == 1;
      if (k > 0) attention_run_check(&run);
      err[k] = attention_run_error(&run, &scale);
      const double bound = attention_run_bound(&run, scale);
      cr_assert(err[k] <= bound, "%s (%s, P %s): max error %.3g exceeds %.3g (max |out| %.3g)", cases[i].name,
                uattn_kernel_set(NULL), k == 1 ? "fp32" : "bf16", err[k], bound, scale);
      err[k] /= scale;
    }
    run.layer.probs_fp32 = false;
    fprintf(stderr, "%-28s error / max|out| against fp64: %s P bf16 %.3g, P fp32 %.3g; avx512 level %.3g\n",
            cases[i].name, level, err[0], err[1], err[2]);
    attention_run_free(&run);
  }
  attention_restore_isa(forced);
}

/* ---- fp8 caches ------------------------------------------------------------------------------------------ */

#define E4M3 UATTN_FP8_E4M3
#define E5M2 UATTN_FP8_E5M2
#define CROSS UATTN_ATTENTION_ENCODER_DECODER

/* Every part on fp8 caches (causal: prefills; shared: shared prefixes, whole and chunked; unique: decodes;
 * split-K: decodes over more than split_min_keys keys; cross attention), both formats, both layouts, f32
 * and bf16 inputs, with k_scale 0.5 and v_scale 3 (and the reverse) so that a scale applied to the wrong
 * side, twice or not at all shows. The random cache contents are codes in [-1, 1]; the step's k/v in [-1, 1]
 * are stored as fp8(k / k_scale). Tolerance: attention_case.c's attention_tolerance, the input dtype's own
 * (1e-5 of the largest output for f32, 4e-3 for bf16), as the oracle computes on the same dequantized
 * values; each case prints its measured error / max |out|. */
/* clang-format off */
static const attention_case fp8_cases[] = {
    {"fp8 e4m3 mixed", BATCH_MIXED, 16, 8, 2, 64, F32, E4M3, NHD, DEC, 0, 0, 0, 0, 0, 0, 101, 0, 0, 0.5f, 3.0f},
    {"fp8 e5m2 mixed, bf16, HND",
     BATCH_MIXED, 16, 8, 2, 64, BF16, E5M2, HND, DEC, 0, 0, 0, 0, 0, 0, 102, 0, 0, 3.0f, 0.5f},
    {"fp8 e4m3 prefill, bf16, HND",
     BATCH_PREFILL, 16, 8, 2, 64, BF16, E4M3, HND, DEC, 0, 0, 0, 0, 0, 0, 103, 0, 0, 0.5f, 3.0f},
    {"fp8 e5m2 prefix prefill",
     BATCH_PREFIX_PREFILL, 16, 8, 2, 64, F32, E5M2, NHD, DEC, 0, 0, 0, 0, 0, 0, 104, 0, 0, 0.5f, 3.0f},
    {"fp8 e4m3 shared prefix, HND",
     BATCH_SHARED_PREFIX, 16, 8, 2, 64, F32, E4M3, HND, DEC, 0, 0, 0, 0, 0, 0, 105, 0, 0, 0.5f, 3.0f},
    {"fp8 e5m2 shared prefix, chunked",
     BATCH_SHARED_PREFIX, 16, 8, 2, 64, BF16, E5M2, NHD, DEC, 0, 0, 0, 0, 2, 0, 106, 0, 0, 0.5f, 3.0f},
    {"fp8 e4m3 shared prefix, chunked, bf16",
     BATCH_SHARED_PREFIX, 32, 8, 1, 128, BF16, E4M3, NHD, DEC, 0, 0, 0, 0, 3, 0, 107, 0, 0, 3.0f, 0.5f},
    {"fp8 e5m2 shared prefix, chunked, HND",
     BATCH_SHARED_PREFIX, 16, 8, 2, 64, F32, E5M2, HND, DEC, 0, 0, 0, 0, 1, 0, 108, 0, 0, 0.5f, 3.0f},
    {"fp8 e4m3 decode", BATCH_DECODE, 16, 8, 2, 64, F32, E4M3, NHD, DEC, 0, 0, 0, 0, 0, 0, 109, 0, 0, 0.5f, 3.0f},
    {"fp8 e5m2 decode, bf16, HND",
     BATCH_DECODE, 16, 8, 2, 64, BF16, E5M2, HND, DEC, 0, 0, 0, 0, 0, 0, 110, 0, 0, 0.5f, 3.0f},
    {"fp8 e4m3 decode, block 128, D 128, GQA 4",
     BATCH_DECODE, 128, 32, 8, 128, BF16, E4M3, NHD, DEC, 0, 0, 0, 0, 0, 0, 111, 0, 0, 0.5f, 3.0f},
    {"fp8 e5m2 decode, block 128, D 128, HND",
     BATCH_DECODE, 128, 32, 8, 128, BF16, E5M2, HND, DEC, 0, 0, 0, 0, 0, 0, 112, 0, 0, 3.0f, 0.5f},
    {"fp8 e4m3 split-K decodes",
     BATCH_DECODE, 16, 8, 2, 64, F32, E4M3, NHD, DEC, 0, 0, 0, 0, 0, 0, 113, 64, 48, 0.5f, 3.0f},
    {"fp8 e5m2 split-K decodes, bf16, HND",
     BATCH_DECODE, 16, 8, 2, 64, BF16, E5M2, HND, DEC, 0, 0, 0, 0, 0, 0, 114, 64, 48, 0.5f, 3.0f},
    {"fp8 e4m3 split-K spec decode, HND",
     BATCH_SPEC_DECODE, 16, 8, 2, 64, F32, E4M3, HND, DEC, 0, 0, 1, 0, 0, 0, 115, 100, 200, 3.0f, 0.5f},
    {"fp8 e5m2 chunked prefill, long",
     BATCH_CHUNKED_LONG, 16, 8, 2, 64, F32, E5M2, NHD, DEC, 0, 0, 0, 0, 0, 0, 116, 0, 0, 0.5f, 3.0f},
    {"fp8 e4m3 cross attention",
     BATCH_MIXED, 16, 8, 2, 64, F32, E4M3, NHD, CROSS, 0, 0, 0, 0, 0, 0, 117, 0, 0, 0.5f, 3.0f},
    {"fp8 e5m2 cross attention, bf16, HND",
     BATCH_DECODE, 32, 8, 2, 64, BF16, E5M2, HND, CROSS, 0, 0, 1, 0, 0, 0, 118, 0, 0, 0.5f, 3.0f},
    {"fp8 e4m3 everything at once, bf16",
     BATCH_SHARED_PREFIX, 32, 8, 2, 64, BF16, E4M3, HND, DEC, 30.0f, 50, 1, 1, 2, 0, 119, 0, 0, 0.5f, 3.0f},
};
/* clang-format on */

Test(attention, fp8_caches, .timeout = 300) {
  for (size_t i = 0; i < sizeof fp8_cases / sizeof *fp8_cases; i++) {
    attention_run run;
    attention_run_build(&run, &fp8_cases[i]);
    attention_run_check(&run);
    double scale;
    const double err = attention_run_error(&run, &scale);
    fprintf(stderr, "%-42s error / max|out| against fp64: %.3g (max |out| %.3g, %s)\n", fp8_cases[i].name,
            err / fmax(scale, 1e-30), scale, uattn_kernel_set(NULL));
    attention_run_free(&run);
  }
}

/* ---- fp32 outputs (uattn_tensors.out_f32) ------------------------------------------------------------ */

/* out_f32 is the result before its one rounding to the layer's dtype: on identical inputs and fresh copies
 * of the caches, the fp32 output rounded to nearest even to bf16 / f16 (the oracle's own rounding, not the
 * library's) is the dtype output bit for bit, the lse is identical and so are the caches after the step;
 * the fp32 output is no dtype output in disguise (some element is not a dtype value). Mixed batches (the
 * tile merge), split-K decodes (the split merge) and decodes served by the decode kernel. */
Test(attention, out_f32_is_the_unrounded_output, .timeout = 300) {
  /* clang-format off */
  static const attention_case cases[] = {
      {"out_f32: bf16 mixed",            BATCH_MIXED,       16,  8,  2, 64,  BF16, BF16, NHD, DEC, 0, 0, 1, 0, 0, 0, 91},
      {"out_f32: f16 mixed, HND",        BATCH_MIXED,       16,  8,  2, 64,  F16,  F16,  HND, DEC, 0, 0, 0, 1, 0, 5, 92},
      {"out_f32: bf16 split-K decodes",  BATCH_DECODE,      16,  8,  2, 64,  BF16, BF16, NHD, DEC, 0, 0, 0, 0, 0, 0, 93, 64, 48},
      {"out_f32: f16 split-K spec, HND", BATCH_SPEC_DECODE, 16,  8,  2, 64,  F16,  F16,  HND, DEC, 0, 0, 1, 0, 0, 0, 94, 100, 200},
      {"out_f32: bf16 decode kernel",    BATCH_DECODE,      128, 32, 8, 128, BF16, BF16, NHD, DEC, 0, 0, 0, 0, 0, 0, 95},
      {"out_f32: f16 decode kernel",     BATCH_DECODE,      16,  8,  2, 64,  F16,  F16,  NHD, DEC, 0, 0, 0, 0, 0, 0, 96},
      {"out_f32: bf16 TILED decode kernel", BATCH_DECODE,   128, 32, 8, 128, BF16, BF16, TILED, DEC, 0, 0, 0, 0, 0, 0, 98},
      {"out_f32: f16 TILED mixed",       BATCH_MIXED,       16,  8,  2, 64,  F16,  F16,  TILED, DEC, 0, 0, 0, 1, 0, 5, 99},
      {"out_f32: bf16 TILED split-K",    BATCH_DECODE,      16,  8,  2, 64,  BF16, BF16, TILED, DEC, 0, 0, 1, 0, 0, 0, 100, 64, 48},
  };
  /* clang-format on */
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const attention_case *c = &cases[i];
    attention_run run;
    attention_run_build(&run, c);
    const size_t n = (size_t)run.info.num_tokens * c->num_q_heads * c->head_dim;
    uattn_tensors narrow = attention_run_forward(&run, NULL), wide = attention_tensors(&run);
    attention_tensors_out_f32(&run, &wide);
    cr_assert_eq(uattn_forward(run.plan, &run.layer, &wide, NULL), UATTN_OK, "%s: %s", c->name, uattn_last_error());
    uattn_kernel_report r;
    cr_assert_eq(uattn_last_forward_report(&r), UATTN_OK, "%s", uattn_last_error());
    int64_t decode_calls = 0;
    for (int p = 0; p < UATTN_NUM_PARTS; p++) decode_calls += r.decode_calls[p];
    if (strstr(c->name, "decode kernel") && r.decode_kernel[0])
      cr_assert_gt(decode_calls, 0, "%s: the decode kernel (%s) served no call", c->name, r.decode_kernel);
    const size_t not_dtype = attention_check_out_f32(&run, &narrow, &wide);
    cr_assert_gt(not_dtype, 0, "%s: every fp32 output is a %s value: rounded already", c->name,
                 c->dtype == BF16 ? "bf16" : "f16");
    fprintf(stderr, "%-32s %zu of %zu fp32 outputs are not %s values; decode kernel calls %lld (%s)\n", c->name,
            not_dtype, n, c->dtype == BF16 ? "bf16" : "f16", (long long)decode_calls,
            r.decode_kernel[0] ? r.decode_kernel : "none");
    attention_tensors_free(&narrow);
    attention_tensors_free(&wide);
    attention_run_free(&run);
  }
}

/* ---- the TILED layout ------------------------------------------------------------------------------------ */

/* uattn's own layout (uattn.h: key tiles of 16 keys in dim pairs, values in key pairs), through every part:
 * the cache write, prompts (causal), prefixes (shared, whole and chunked), decodes (unique, the decode
 * kernels, split-K), cross attention, over block sizes of one tile to sixteen, head dims that are and are not
 * multiples of 32 (and 34: one dim pair past 32), GQA 1-8 and MQA, three dtypes, fp8 caches of both formats.
 * attention_run_check compares both caches byte for byte with the oracle's write (which addresses TILED
 * element by element, support/dense_oracle.c) and the output and lse with the oracle's. */
/* clang-format off */
static const attention_case tiled_kinds[] = {
    {"TILED decode",                BATCH_DECODE,         16, 8, 2, 64, BF16, BF16, TILED, DEC, 0, 0, 0, 0, 0, 0, 201},
    {"TILED prefill",               BATCH_PREFILL,        16, 8, 2, 64, F32,  F32,  TILED, DEC, 0, 0, 0, 0, 0, 0, 202},
    {"TILED prefix prefill",        BATCH_PREFIX_PREFILL, 32, 8, 2, 64, F16,  F16,  TILED, DEC, 0, 0, 0, 0, 0, 0, 203},
    {"TILED chunked, long context", BATCH_CHUNKED_LONG,   16, 8, 2, 64, BF16, BF16, TILED, DEC, 0, 0, 0, 0, 0, 0, 204},
    {"TILED mixed batch",           BATCH_MIXED,          16, 8, 2, 64, F32,  F32,  TILED, DEC, 0, 0, 0, 0, 0, 0, 205},
    {"TILED spec decode",           BATCH_SPEC_DECODE,    16, 8, 2, 64, BF16, BF16, TILED, DEC, 0, 0, 0, 0, 0, 0, 206},
    {"TILED shared prefix",         BATCH_SHARED_PREFIX,  16, 8, 2, 64, F32,  F32,  TILED, DEC, 0, 0, 0, 0, 0, 0, 207},
    {"TILED empty batch",           BATCH_EMPTY,          16, 8, 2, 64, F32,  F32,  TILED, DEC, 0, 0, 0, 0, 0, 0, 208},
    {"TILED mixed, causal slices",  BATCH_MIXED,          16, 4, 4, 64, F32,  F32,  TILED, DEC, 0, 0, 0, 0, 0, 7, 209},
};

static const attention_case tiled_shapes[] = {
    {"TILED block 32, D 80, GQA 1",          BATCH_MIXED,         32,  8,  8, 80,  F32,  F32,  TILED, DEC, 0, 0, 0, 0, 0, 0, 211},
    {"TILED block 64, D 96, MQA",            BATCH_MIXED,         64,  8,  1, 96,  BF16, BF16, TILED, DEC, 0, 0, 0, 0, 0, 0, 212},
    {"TILED block 128, D 128, GQA 4",        BATCH_SHARED_PREFIX, 128, 8,  2, 128, F32,  F32,  TILED, DEC, 0, 0, 0, 0, 0, 0, 213},
    {"TILED block 256, D 192, GQA 8",        BATCH_SPEC_DECODE,   256, 8,  1, 192, BF16, BF16, TILED, DEC, 0, 0, 0, 0, 0, 0, 214},
    {"TILED block 16, D 256, GQA 2",         BATCH_CHUNKED_LONG,  16,  4,  2, 256, F16,  F16,  TILED, DEC, 0, 0, 0, 0, 0, 0, 215},
    {"TILED block 128, D 128, decodes",      BATCH_DECODE,        128, 32, 8, 128, BF16, BF16, TILED, DEC, 0, 0, 0, 0, 0, 0, 216},
    {"TILED block 16, D 128, decodes",       BATCH_DECODE,        16,  8,  2, 128, BF16, BF16, TILED, DEC, 0, 0, 0, 0, 0, 0, 217},
    {"TILED block 32, D 192, decodes, MQA",  BATCH_DECODE,        32,  8,  1, 192, F32,  F32,  TILED, DEC, 0, 0, 0, 0, 0, 0, 218},
    {"TILED block 48, D 34, GQA 2",          BATCH_MIXED,         48,  4,  2, 34,  F32,  F32,  TILED, DEC, 0, 0, 0, 0, 0, 0, 219},
    {"TILED block 64, D 256, spec decode",   BATCH_SPEC_DECODE,   64,  8,  2, 256, BF16, BF16, TILED, DEC, 0, 0, 0, 0, 0, 0, 220},
    {"TILED block 16, D 80, shared, GQA 4",  BATCH_SHARED_PREFIX, 16,  16, 4, 80,  F16,  F16,  TILED, DEC, 0, 0, 0, 0, 0, 0, 221},
    {"TILED block 256, D 64, prefix prefill", BATCH_PREFIX_PREFILL, 256, 8, 8, 64, F32, F32,  TILED, DEC, 0, 0, 0, 0, 0, 0, 222},
};

static const attention_case tiled_dtypes[] = {
    {"TILED bf16 mixed",             BATCH_MIXED,         16, 8, 2, 64,  BF16, BF16, TILED, DEC, 0, 0, 0, 0, 0, 0, 231},
    {"TILED f16 mixed",              BATCH_MIXED,         16, 8, 2, 64,  F16,  F16,  TILED, DEC, 0, 0, 0, 0, 0, 0, 232},
    {"TILED f32 in, bf16 cache",     BATCH_SPEC_DECODE,   16, 8, 2, 64,  F32,  BF16, TILED, DEC, 0, 0, 0, 0, 0, 0, 233},
    {"TILED bf16 in, f32 cache",     BATCH_SHARED_PREFIX, 16, 8, 2, 64,  BF16, F32,  TILED, DEC, 0, 0, 0, 0, 0, 0, 234},
    {"TILED f16 in, bf16 cache",     BATCH_MIXED,         32, 8, 4, 128, F16,  BF16, TILED, DEC, 0, 0, 0, 0, 0, 0, 235},
    {"TILED bf16 in, f16 cache",     BATCH_DECODE,        16, 8, 2, 64,  BF16, F16,  TILED, DEC, 0, 0, 0, 0, 0, 0, 236},
};

static const attention_case tiled_features[] = {
    {"TILED soft cap",               BATCH_MIXED,          16, 8, 2, 64, F32,  F32,  TILED, DEC,      5.0f,  0,   0, 0, 0, 0, 241},
    {"TILED sliding window",         BATCH_MIXED,          16, 8, 2, 64, BF16, BF16, TILED, DEC,      0,     37,  0, 0, 0, 0, 242},
    {"TILED window, long context",   BATCH_CHUNKED_LONG,   16, 8, 2, 64, F32,  F32,  TILED, DEC,      0,     100, 0, 0, 0, 0, 243},
    {"TILED window, decodes",        BATCH_DECODE,         32, 8, 2, 64, BF16, BF16, TILED, DEC,      0,     20,  0, 0, 0, 0, 244},
    {"TILED sinks",                  BATCH_SPEC_DECODE,    16, 8, 2, 64, F32,  F32,  TILED, DEC,      0,     0,   1, 0, 0, 0, 245},
    {"TILED sinks, decodes",         BATCH_DECODE,         16, 8, 2, 64, BF16, BF16, TILED, DEC,      0,     0,   1, 0, 0, 0, 246},
    {"TILED alibi",                  BATCH_MIXED,          16, 8, 2, 64, F32,  F32,  TILED, DEC,      0,     0,   0, 1, 0, 0, 247},
    {"TILED alibi, shared",          BATCH_SHARED_PREFIX,  16, 8, 2, 64, F16,  F16,  TILED, DEC,      0,     0,   0, 1, 0, 0, 248},
    {"TILED everything, bf16",       BATCH_SHARED_PREFIX,  32, 8, 2, 64, BF16, BF16, TILED, DEC,      30.0f, 50,  1, 1, 2, 0, 249},
    {"TILED everything, decodes",    BATCH_DECODE,         16, 8, 2, 64, BF16, BF16, TILED, DEC,      20.0f, 60,  1, 1, 0, 0, 250},
    {"TILED encoder only",           BATCH_PREFIX_PREFILL, 16, 8, 2, 64, F32,  F32,  TILED, UATTN_ATTENTION_ENCODER_ONLY, 0, 0, 0, 0, 0, 0, 251},
    {"TILED encoder, mixed chunks",  BATCH_MIXED,          16, 8, 2, 64, F32,  F32,  TILED, UATTN_ATTENTION_ENCODER, 0, 0, 1, 1, 0, 0, 252},
    {"TILED cross, a row with no key", BATCH_MIXED,        16, 8, 2, 64, F32,  F32,  TILED, UATTN_ATTENTION_ENCODER_DECODER, 0, 0, 0, 0, 0, 0, 253},
    {"TILED cross, sinks",           BATCH_DECODE,         32, 8, 2, 64, F16,  F16,  TILED, UATTN_ATTENTION_ENCODER_DECODER, 0, 0, 1, 0, 0, 0, 254},
    {"TILED cross, bf16 decodes",    BATCH_DECODE,         16, 8, 2, 128, BF16, BF16, TILED, UATTN_ATTENTION_ENCODER_DECODER, 0, 0, 0, 0, 0, 0, 255},
};

/* fp8 as the fp8_cases above: k_scale and v_scale apart from 1 and each other, both orders. */
static const attention_case tiled_fp8[] = {
    {"TILED fp8 e4m3 mixed",          BATCH_MIXED,         16,  8,  2, 64,  F32,  E4M3, TILED, DEC,   0, 0, 0, 0, 0, 0, 261, 0, 0, 0.5f, 3.0f},
    {"TILED fp8 e5m2 mixed, bf16",    BATCH_MIXED,         16,  8,  2, 64,  BF16, E5M2, TILED, DEC,   0, 0, 0, 0, 0, 0, 262, 0, 0, 3.0f, 0.5f},
    {"TILED fp8 e4m3 prefill, bf16",  BATCH_PREFILL,       16,  8,  2, 64,  BF16, E4M3, TILED, DEC,   0, 0, 0, 0, 0, 0, 263, 0, 0, 0.5f, 3.0f},
    {"TILED fp8 e4m3 decode",         BATCH_DECODE,        16,  8,  2, 64,  BF16, E4M3, TILED, DEC,   0, 0, 0, 0, 0, 0, 264, 0, 0, 0.5f, 3.0f},
    {"TILED fp8 e5m2 decode, f32",    BATCH_DECODE,        16,  8,  2, 64,  F32,  E5M2, TILED, DEC,   0, 0, 0, 0, 0, 0, 265, 0, 0, 3.0f, 0.5f},
    {"TILED fp8 e4m3 decode, block 128, D 128",
                                      BATCH_DECODE,        128, 8,  2, 128, BF16, E4M3, TILED, DEC,   0, 0, 0, 0, 0, 0, 266, 0, 0, 3.0f, 0.5f},
    {"TILED fp8 e5m2 shared, chunked", BATCH_SHARED_PREFIX, 32, 8,  1, 128, BF16, E5M2, TILED, DEC,   0, 0, 0, 0, 3, 0, 267, 0, 0, 0.5f, 3.0f},
    {"TILED fp8 e4m3 split-K decodes", BATCH_DECODE,       16,  8,  2, 64,  F32,  E4M3, TILED, DEC,   0, 0, 0, 0, 0, 0, 268, 64, 48, 0.5f, 3.0f},
    {"TILED fp8 e5m2 split-K spec, bf16", BATCH_SPEC_DECODE, 16, 8, 2, 64,  BF16, E5M2, TILED, DEC,   0, 0, 1, 0, 0, 0, 269, 100, 200, 3.0f, 0.5f},
    {"TILED fp8 e4m3 chunked, long",  BATCH_CHUNKED_LONG,  16,  8,  2, 64,  F32,  E4M3, TILED, DEC,   0, 0, 0, 0, 0, 0, 270, 0, 0, 0.5f, 3.0f},
    {"TILED fp8 e5m2 cross",          BATCH_MIXED,         16,  8,  2, 64,  F32,  E5M2, TILED, CROSS, 0, 0, 0, 0, 0, 0, 271, 0, 0, 0.5f, 3.0f},
    {"TILED fp8 e4m3 cross, bf16",    BATCH_DECODE,        32,  8,  2, 64,  BF16, E4M3, TILED, CROSS, 0, 0, 1, 0, 0, 0, 272, 0, 0, 3.0f, 0.5f},
    {"TILED fp8 e4m3 everything, bf16", BATCH_SHARED_PREFIX, 32, 8, 2, 64,  BF16, E4M3, TILED, DEC,   30.0f, 50, 1, 1, 2, 0, 273, 0, 0, 0.5f, 3.0f},
    {"TILED fp8 e5m2 D 80, window",   BATCH_MIXED,         64,  8,  4, 80,  F32,  E5M2, TILED, DEC,   0, 40, 0, 0, 0, 0, 274, 0, 0, 3.0f, 0.5f},
};
/* clang-format on */

Test(attention, tiled_every_kind_of_batch, .timeout = 300) {
  for (size_t i = 0; i < sizeof tiled_kinds / sizeof *tiled_kinds; i++) run_case(&tiled_kinds[i]);
}

Test(attention, tiled_block_sizes_head_dims_and_gqa, .timeout = 300) {
  for (size_t i = 0; i < sizeof tiled_shapes / sizeof *tiled_shapes; i++) run_case(&tiled_shapes[i]);
}

Test(attention, tiled_dtypes, .timeout = 300) {
  for (size_t i = 0; i < sizeof tiled_dtypes / sizeof *tiled_dtypes; i++) run_case(&tiled_dtypes[i]);
}

Test(attention, tiled_features, .timeout = 300) {
  for (size_t i = 0; i < sizeof tiled_features / sizeof *tiled_features; i++) run_case(&tiled_features[i]);
}

Test(attention, tiled_fp8_caches, .timeout = 300) {
  for (size_t i = 0; i < sizeof tiled_fp8 / sizeof *tiled_fp8; i++) run_case(&tiled_fp8[i]);
}

/* The same step on NHD and on TILED: the caches hold the same values (each layout's write of the same k/v
 * over caches whose history was laid out from the same NHD arrays), so the answers agree to the tolerance;
 * and TILED's caches read back through the oracle's index are NHD's, value for value. A layout read as
 * another would fail here even where random histories hide it from the oracle comparison's tolerance. */
Test(attention, tiled_holds_what_nhd_holds, .timeout = 300) {
  /* clang-format off */
  static const attention_case cases[] = {
      {"NHD vs TILED mixed, bf16",   BATCH_MIXED,  16,  8,  2, 64,  BF16, BF16, NHD, DEC, 0, 0, 1, 0, 0, 0, 281},
      {"NHD vs TILED decodes, fp8",  BATCH_DECODE, 16,  8,  2, 64,  BF16, E4M3, NHD, DEC, 0, 0, 0, 0, 0, 0, 282, 0, 0, 0.5f, 3.0f},
      {"NHD vs TILED spec, f32",     BATCH_SPEC_DECODE, 32, 8, 1, 80, F32, F32,  NHD, DEC, 0, 0, 0, 1, 0, 0, 283},
  };
  /* clang-format on */
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const attention_case *c = &cases[i];
    attention_run nhd, tiled;
    attention_case tc = *c;
    tc.layout = TILED;
    attention_run_build(&nhd, c);
    attention_run_build(&tiled, &tc); /* the same seed: the same batch and inputs */
    /* lay the NHD history out as TILED, element by element through the oracle's index */
    const size_t esz = oracle_dtype_size(c->cache_dtype);
    const int32_t bs = c->block_size, H = c->num_kv_heads, D = c->head_dim;
    for (int64_t slot = 0; slot < (int64_t)nhd.num_blocks * bs; slot++)
      for (int32_t h = 0; h < H; h++)
        for (int32_t d = 0; d < D; d++) {
          const size_t from = oracle_cache_index(&nhd.layer, bs, slot, h, d, false) * esz;
          memcpy((char *)tiled.key_cache0 + oracle_cache_index(&tiled.layer, bs, slot, h, d, false) * esz,
                 (const char *)nhd.key_cache0 + from, esz);
          memcpy((char *)tiled.value_cache0 + oracle_cache_index(&tiled.layer, bs, slot, h, d, true) * esz,
                 (const char *)nhd.value_cache0 + from, esz);
        }
    uattn_tensors a = attention_run_forward(&nhd, NULL), b = attention_run_forward(&tiled, NULL);
    for (int64_t slot = 0; slot < (int64_t)nhd.num_blocks * bs; slot++)
      for (int32_t h = 0; h < H; h++)
        for (int32_t d = 0; d < D; d++) {
          const size_t at = oracle_cache_index(&nhd.layer, bs, slot, h, d, false) * esz;
          cr_assert(memcmp((const char *)b.key_cache + oracle_cache_index(&tiled.layer, bs, slot, h, d, false) * esz,
                           (const char *)a.key_cache + at, esz) == 0,
                    "%s: slot %lld head %d dim %d: the TILED key differs from NHD's", c->name, (long long)slot, h, d);
          cr_assert(memcmp((const char *)b.value_cache + oracle_cache_index(&tiled.layer, bs, slot, h, d, true) * esz,
                           (const char *)a.value_cache + at, esz) == 0,
                    "%s: slot %lld head %d dim %d: the TILED value differs from NHD's", c->name, (long long)slot, h, d);
        }
    const size_t n = (size_t)nhd.info.num_tokens * c->num_q_heads * D;
    double scale = 0, err = 0;
    for (size_t x = 0; x < n; x++) scale = fmax(scale, fabs(oracle_load(a.out, c->dtype, x)));
    for (size_t x = 0; x < n; x++)
      err = fmax(err, fabs(oracle_load(a.out, c->dtype, x) - oracle_load(b.out, c->dtype, x)));
    const double tol = 2 * attention_tolerance(c->dtype, c->cache_dtype);
    cr_assert(err <= tol * fmax(scale, 1e-30), "%s: NHD and TILED outputs %.3g apart (max |out| %.3g)", c->name, err,
              scale);
    attention_tensors_free(&a);
    attention_tensors_free(&b);
    attention_run_free(&nhd);
    attention_run_free(&tiled);
  }
}

/* ---- what no query sees never matters ------------------------------------------------------------------- */

/* Every table above, with every cache entry no query of the step can see set to NaN keys and NaN / -inf
 * values (attention_run_poison_unseen: the tails of requests' last blocks, keys before a sliding window,
 * blocks nobody holds), on every level of the ladder (UATTN_ISA; a level this CPU lacks through its twin), each
 * layer on the level at or below the named one that keeps its precision, within that level's contract. An engine's cache
 * holds whatever its earlier steps or allocator left there; a kernel that scores such a key, or multiplies
 * such a value by its zero weight, returns NaN here. The tolerance is the oracle comparison's, as above. */
static void run_poisoned(const attention_case *cases, size_t n) {
  for (size_t i = 0; i < n; i++) {
    attention_run run;
    attention_run_build(&run, &cases[i]);
    attention_run_poison_unseen(&run);
    attention_run_check(&run);
    attention_run_free(&run);
  }
}

/* Each level its own test, so each has the whole timeout: one level's pass takes minutes under ASan on a slow
 * machine, and its twin's more. The parameter is the level's index: Criterion copies parameters into the
 * test's process, where a pointer into this one need not hold. */
static const char *const ladder[] = {"portable", "avx2", "avx512", "avx512bf16", "avx512bf16fma"};

ParameterizedTestParameters(attention, unseen_cache_entries_never_matter) {
  static size_t levels[sizeof ladder / sizeof *ladder];
  for (size_t k = 0; k < sizeof ladder / sizeof *ladder; k++) levels[k] = k;
  return cr_make_param_array(size_t, levels, sizeof ladder / sizeof *ladder);
}

ParameterizedTest(size_t *level, attention, unseen_cache_entries_never_matter, .timeout = 600) {
  const char *forced = getenv("UATTN_ISA");
  if (attention_force_level(ladder[*level], "unseen entries poisoned")) {
#define POISONED(table) run_poisoned(table, sizeof table / sizeof *table)
    POISONED(kinds), POISONED(shapes), POISONED(dtypes), POISONED(features), POISONED(fp8_cases);
    POISONED(tiled_kinds), POISONED(tiled_shapes), POISONED(tiled_dtypes), POISONED(tiled_features);
    POISONED(tiled_fp8);
#undef POISONED
  }
  attention_restore_isa(forced);
}
