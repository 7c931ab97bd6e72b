/* uattn_forward against the dense double-precision oracle: every kind of batch, block sizes 16-256, head
 * dims 64-256, GQA 1-8 and MQA, three dtypes, both layouts, soft cap, sliding window, sinks, ALiBi,
 * encoder and cross attention, the empty batch and a row with no key. Tolerances: attention_case.c. */
#include <criterion/criterion.h>
#include <string.h>

#include "attention_case.h"

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
    {"encoder (bidirectional)", BATCH_PREFIX_PREFILL, 16, 8, 2, 64, F32, F32, NHD, UATTN_ATTENTION_ENCODER_ONLY, 0, 0, 0, 0, 0, 0, 37},
    {"encoder, mixed chunks", BATCH_MIXED, 16, 8, 2, 64, F32, F32, HND, UATTN_ATTENTION_ENCODER, 0, 0, 1, 1, 0, 0, 38},
    {"cross attention, a row with no key", BATCH_MIXED, 16, 8, 2, 64, F32, F32, NHD, UATTN_ATTENTION_ENCODER_DECODER, 0, 0, 0, 0, 0, 0, 39},
    {"cross attention, sinks", BATCH_DECODE, 32, 8, 2, 64, F16, F16, HND, UATTN_ATTENTION_ENCODER_DECODER, 0, 0, 1, 0, 0, 0, 40},
};

Test(attention, features, .timeout = 300) {
  for (size_t i = 0; i < sizeof features / sizeof *features; i++) run_case(&features[i]);
}

/* PR 784: the shared part chunk_size blocks at a time with an online merge equals the whole shared part. */
Test(attention, chunked_and_whole_shared_agree, .timeout = 300) {
  const int32_t chunks[] = {1, 2, 3, 7, 64};
  for (size_t i = 0; i < sizeof chunks / sizeof *chunks; i++) {
    attention_case c = {"chunked shared", BATCH_SHARED_PREFIX, 16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, chunks[i], 0, 50};
    run_case(&c);
  }
}

/* The work is split into units that each write their own rows, so the answer must not depend on how many
 * threads run them: bitwise, outputs, lse and caches. */
Test(attention, bitwise_identical_for_any_thread_count, .timeout = 300) {
  const attention_case cases[] = {
      {"threads: mixed bf16", BATCH_MIXED, 16, 8, 2, 64, BF16, BF16, HND, DEC, 0, 0, 1, 0, 3, 0, 61},
      {"threads: shared prefix", BATCH_SHARED_PREFIX, 32, 8, 1, 128, F32, F32, NHD, DEC, 0, 0, 0, 1, 0, 0, 62},
      {"threads: long chunk", BATCH_CHUNKED_LONG, 16, 4, 4, 64, F16, F16, NHD, DEC, 0, 0, 0, 0, 0, 32, 63},
  };
  const int32_t threads[] = {1, 2, 3, 4};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    attention_run run;
    attention_run_build(&run, &cases[i]);
    uattn_tensors ref = attention_run_forward(&run, NULL);
    for (size_t k = 0; k < sizeof threads / sizeof *threads; k++) {
      uattn_runtime_config cfg = uattn_runtime_config_default();
      cfg.num_threads = threads[k];
      uattn_runtime *rt;
      cr_assert_eq(uattn_runtime_create(&cfg, &rt), UATTN_OK, "%s", uattn_last_error());
      uattn_tensors t = attention_run_forward(&run, rt);
      cr_assert_eq(memcmp(t.out, ref.out, run.out_bytes), 0, "%s: %d threads change the output", cases[i].name,
                   threads[k]);
      cr_assert_eq(memcmp(t.lse, ref.lse, sizeof(float) * (size_t)run.info.num_tokens * cases[i].num_q_heads), 0,
                   "%s: %d threads change the lse", cases[i].name, threads[k]);
      cr_assert_eq(memcmp(t.key_cache, ref.key_cache, run.cache_bytes), 0);
      cr_assert_eq(memcmp(t.value_cache, ref.value_cache, run.cache_bytes), 0);
      attention_tensors_free(&t);
      uattn_runtime_destroy(rt);
    }
    attention_tensors_free(&ref);
    attention_run_free(&run);
  }
}

/* Split-K: long decodes computed as key ranges and merged in split order. Small thresholds here so that
 * the test batches split often, including ranges that hold no block and verification rows. */
Test(attention, split_k_decodes, .timeout = 300) {
  const attention_case cases[] = {
      {"split-K decodes", BATCH_DECODE, 16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 71, 64, 48},
      {"split-K spec decode, bf16", BATCH_SPEC_DECODE, 16, 8, 2, 64, BF16, BF16, HND, DEC, 0, 0, 1, 0, 0, 0, 72, 100, 200},
      {"split-K shared prefix, chunked", BATCH_SHARED_PREFIX, 32, 8, 1, 128, F32, F32, NHD, DEC, 0, 40, 0, 1, 2, 0, 73, 128, 96},
      {"split-K mixed, window", BATCH_MIXED, 16, 4, 4, 64, F16, F16, NHD, DEC, 3.0f, 90, 0, 0, 0, 5, 74, 32, 32},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    attention_run run;
    attention_run_build(&run, &cases[i]);
    attention_run_check(&run);
    /* and the split answer is the same on any number of threads */
    uattn_tensors ref = attention_run_forward(&run, NULL);
    for (int32_t threads = 2; threads <= 3; threads++) {
      uattn_runtime_config cfg = uattn_runtime_config_default();
      cfg.num_threads = threads;
      uattn_runtime *rt;
      cr_assert_eq(uattn_runtime_create(&cfg, &rt), UATTN_OK, "%s", uattn_last_error());
      uattn_tensors t = attention_run_forward(&run, rt);
      cr_assert_eq(memcmp(t.out, ref.out, run.out_bytes), 0, "%s: %d threads change the output", cases[i].name,
                   threads);
      attention_tensors_free(&t);
      uattn_runtime_destroy(rt);
    }
    attention_tensors_free(&ref);
    attention_run_free(&run);
  }
}
