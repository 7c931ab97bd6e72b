/* Dispatch from a layer's kernel bucket to its kernels, through the public API: generated buckets are found and
 * serve every part (each bucket of the registry: test_kernels/buckets.c's buckets suite), shapes outside the generated
 * list fall back to the generic kernels and say why, UATTN_ISA forces a generic set, uattn_last_forward_report
 * says what served a call, and a step served by a bucket matches the dense oracle and the generic kernels'
 * result, whatever the thread count, on each of the three cache layouts; fp8 caches get their buckets, and steps
 * on them (every part, every layout, both formats) do the same. Tolerances: attention_case.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/attention_case.h"
#include "avx2/avx2.h"
#include "avx512/avx512.h"
#include "avx512bf16/avx512bf16.h"
#include "avx512bf16fma/avx512bf16fma.h"
#include "kernels.h"
#include "uattn_tuning.h"

/* The first generated bucket this CPU runs (of chunk size 0 unless chunked), or skips the test. */
static uattn_kernel_bucket runnable_bucket(bool chunked) {
  uattn_kernel_bucket all[4096];
  const int32_t n = uattn_kernel_buckets(all, 4096);
  for (int32_t i = 0; i < n && i < 4096; i++)
    if (all[i].runs_here && (all[i].chunk_size > 0) == chunked) return all[i];
  cr_skip_test("no generated %sbucket runs on this CPU", chunked ? "chunked " : "");
  return all[0];
}

/* A layer of the bucket's shape; on an fp8 cache (q, k, v and out are never fp8) a bf16 model's, which every
 * level takes. */
static uattn_layer bucket_layer(const uattn_kernel_bucket *b) {
  uattn_layer L = uattn_layer_default(8, 2, b->head_dim, uattn_dtype_is_fp8(b->dtype) ? UATTN_BF16 : b->dtype);
  L.cache_dtype = b->dtype;
  L.chunk_size = b->chunk_size;
  return L;
}

/* Whether the build generated a bucket of this shape for isa (the registry, not the dispatch, says). */
static bool generated(uattn_dtype dtype, int32_t block_size, int32_t head_dim, int32_t chunk_size, const char *isa) {
  uattn_kernel_bucket all[4096];
  const int32_t n = uattn_kernel_buckets(all, 4096);
  for (int32_t i = 0; i < n && i < 4096; i++)
    if (all[i].dtype == dtype && all[i].block_size == block_size && all[i].head_dim == head_dim &&
        all[i].chunk_size == chunk_size && !strcmp(all[i].isa, isa))
      return true;
  return false;
}

Test(dispatch, buckets_are_listed) {
  const int32_t n = uattn_kernel_buckets(NULL, 0);
  cr_assert_geq(n, 0);
  uattn_kernel_bucket *all = malloc(sizeof *all * (size_t)(n + 1));
  cr_assert_eq(uattn_kernel_buckets(all, n), n);
  for (int32_t i = 0; i < n; i++) {
    cr_assert(all[i].block_size > 0 && all[i].head_dim > 0 && all[i].chunk_size >= 0 && all[i].isa);
    for (int32_t j = 0; j < i; j++) /* no bucket twice for one ISA */
      cr_assert(all[i].block_size != all[j].block_size || all[i].head_dim != all[j].head_dim ||
                all[i].dtype != all[j].dtype || all[i].chunk_size != all[j].chunk_size ||
                strcmp(all[i].isa, all[j].isa));
  }
  free(all);
}

/* Whether a bucket of this ISA and shape has a decode kernel, as the ISA's capability record says
 * (kernels.h: uattn_decode_fits; the generated entries decide it apart, in the preprocessor). */
static bool record_allows_decode(const char *isa, int32_t block_size, int32_t head_dim) {
  for (size_t i = 0; i < uattn_isa_registry_size; i++)
    if (!strcmp(uattn_isa_registry[i].name, isa)) {
      const uattn_kernel_caps *caps = &uattn_isa_registry[i].set->caps;
      return head_dim % caps->decode_dim_multiple == 0 && block_size <= caps->decode_max_keys;
    }
  cr_assert_fail("no ISA %s in the registry", isa);
  return false;
}

/* The ISA whose bucket functions of a part a level's buckets name (gen/manifest.json: shares, decodes), for the
 * decode kernels (decode) or the others. */
static const char *functions_of(const char *set, bool decode) {
  for (size_t i = 0; i < uattn_isa_registry_size; i++)
    if (!strcmp(uattn_isa_registry[i].name, set)) {
      const char *from = decode ? uattn_isa_registry[i].decodes : uattn_isa_registry[i].shares;
      return from ? from : set;
    }
  return set;
}

Test(dispatch, a_generated_bucket_serves_every_part) {
  unsetenv("UATTN_ISA");
  const uattn_kernel_bucket b = runnable_bucket(false);
  const uattn_layer L = bucket_layer(&b);
  uattn_kernel_report r;
  cr_assert_eq(uattn_describe_kernels(&L, b.block_size, &r), UATTN_OK, "%s", uattn_last_error());
  cr_assert(r.bucket_hit, "%s", r.reason);
  cr_assert_str_eq(r.kernel_set, b.isa);
  /* the unique part's decode rows go straight from the cache (the decode kernel) where the bucket allows */
  const bool decode = record_allows_decode(b.isa, b.block_size, b.head_dim);
  const char *const parts[] = {"causal", "shared", decode ? "decode" : "unique"};
  /* a bucket of an ISA that shares another's functions (gen/manifest.json's shares, decodes) names that ISA's */
  for (int p = 0; p < UATTN_NUM_PARTS; p++) {
    char want[64];
    snprintf(want, sizeof want, "uattn_%s_%s_b%d_d%d_c%d__%s", uattn_dtype_name(b.dtype), parts[p], b.block_size,
             b.head_dim, b.chunk_size, functions_of(b.isa, p == UATTN_PART_UNIQUE && decode));
    cr_assert_str_eq(r.part_kernel[p], want);
  }
  cr_assert(strstr(r.reason, "generated bucket"), "%s", r.reason);
}

Test(dispatch, shapes_outside_the_list_fall_back_and_say_why) {
  unsetenv("UATTN_ISA");
  const uattn_kernel_bucket b = runnable_bucket(false);
  uattn_layer L = bucket_layer(&b);
  uattn_kernel_report r;
  L.head_dim = 4000; /* no model has it */
  cr_assert_eq(uattn_describe_kernels(&L, b.block_size, &r), UATTN_OK);
  cr_assert(!r.bucket_hit);
  cr_assert(strstr(r.reason, "head dim 4000 is not generated"), "%s", r.reason);
  cr_assert(strstr(r.reason, "fallback"), "%s", r.reason);
  cr_assert_str_eq(r.part_kernel[UATTN_PART_UNIQUE], r.kernel_set);
  L = bucket_layer(&b);
  cr_assert_eq(uattn_describe_kernels(&L, 3 * b.block_size + 1, &r), UATTN_OK);
  cr_assert(!r.bucket_hit && strstr(r.reason, "block size"), "%s", r.reason);
  L.chunk_size = 12345;
  cr_assert_eq(uattn_describe_kernels(&L, b.block_size, &r), UATTN_OK);
  cr_assert(!r.bucket_hit && strstr(r.reason, "chunk size 12345"), "%s", r.reason);
}

Test(dispatch, uattn_isa_forces_a_generic_set) {
  const uattn_kernel_bucket b = runnable_bucket(false);
  const uattn_layer L = bucket_layer(&b);
  setenv("UATTN_ISA", "portable", 1);
  uattn_kernel_report r;
  cr_assert_eq(uattn_describe_kernels(&L, b.block_size, &r), UATTN_OK);
  cr_assert(!r.bucket_hit);
  cr_assert_str_eq(r.kernel_set, "portable");
  cr_assert(strstr(r.reason, "UATTN_ISA"), "%s", r.reason);
}

/* What a level reads of a TILED cache as it lies, the contract its record states (kernels.h's caps): the levels
 * that round to bf16 (the record's bf16_inputs: avx512bf16, and amx and avx512bf16fma, whose decode kernels are
 * its) decode bf16 and fp8 tiles with P in bf16 and load their panels; the avx2 and avx512 levels decode bf16 and
 * fp8 tiles (the same kernel), P in fp32 either way, and load their panels (the same load); every other case
 * gathers both. */
static bool bf16_level(const char *set) {
  for (size_t i = 0; i < uattn_isa_registry_size; i++)
    if (!strcmp(uattn_isa_registry[i].name, set)) return uattn_isa_registry[i].set->caps.bf16_inputs;
  return false;
}

static bool decodes_tiles(const char *set, uattn_dtype t, bool probs_fp32) {
  if (bf16_level(set)) return !probs_fp32 && (t == UATTN_BF16 || uattn_dtype_is_fp8(t));
  return (!strcmp(set, "avx2") || !strcmp(set, "avx512")) && (t == UATTN_BF16 || uattn_dtype_is_fp8(t));
}

static bool loads_tiles(const char *set, uattn_dtype t) {
  const bool level = bf16_level(set) || !strcmp(set, "avx2") || !strcmp(set, "avx512");
  return level && (t == UATTN_BF16 || uattn_dtype_is_fp8(t));
}

/* The report of a Llama-3-8B layer on a TILED cache of dtype t against that contract, for the set it names:
 * its decode_tiled (its bucket's, where generated and no UATTN_ISA forces the generic set), else its decode
 * kernel "... (gathered)". */
static void check_tiled_report(uattn_layer L, uattn_dtype t, bool probs_fp32, bool forced) {
  uattn_kernel_report r;
  L.cache_dtype = t, L.probs_fp32 = probs_fp32;
  if (t == UATTN_F16) L.dtype = UATTN_F16;
  cr_assert_eq(uattn_describe_kernels(&L, 128, &r), UATTN_OK, "%s", uattn_last_error());
  const char *set = bf16_level(r.kernel_set) ? "avx512bf16" : r.kernel_set; /* whose decode kernels run */
  const char *what = uattn_dtype_name(t);
  if (decodes_tiles(r.kernel_set, t, probs_fp32)) {
    char want[64];
    snprintf(want, sizeof want, "%s", r.kernel_set);
    if (!forced && generated(t, 128, 128, 0, r.kernel_set))
      snprintf(want, sizeof want, "uattn_%s_decode_tiled_b128_d128_c0__%s", what, functions_of(r.kernel_set, true));
    cr_assert_str_eq(r.decode_kernel, want, "%s cache on %s, P in fp%d: %s", what, set, probs_fp32 ? 32 : 16, r.reason);
  } else if (r.decode_kernel[0]) {
    cr_assert(strstr(r.decode_kernel, " (gathered)"), "%s cache on %s, P in fp%d: %s", what, set, probs_fp32 ? 32 : 16,
              r.decode_kernel);
  }
  cr_assert_eq(r.panels_gathered, !loads_tiles(r.kernel_set, t), "%s cache on %s: panels gathered %d", what,
               r.kernel_set, r.panels_gathered);
}

/* On a TILED cache the report says what reads the blocks as they lie (above), on this CPU's best level and on
 * the avx2 level; NHD and HND never gather. */
Test(dispatch, tiled_caches_say_what_reads_them) {
  uattn_layer L = uattn_layer_default(32, 8, 128, UATTN_BF16);
  L.kv_layout = UATTN_LAYOUT_TILED;
  for (int level = 0; level < 2; level++) { /* the best level; then avx2, where the CPU runs it */
    if (level)
      setenv("UATTN_ISA", "avx2", 1);
    else
      unsetenv("UATTN_ISA");
    for (uattn_dtype t = UATTN_BF16; t <= UATTN_FP8_E5M2; t++)
      for (int fp32 = 0; fp32 < 2; fp32++) check_tiled_report(L, t, fp32, level);
  }
  unsetenv("UATTN_ISA");
  uattn_kernel_report r;
  for (uattn_kv_layout layout = UATTN_LAYOUT_NHD; layout <= UATTN_LAYOUT_HND; layout++) {
    L.kv_layout = layout;
    cr_assert_eq(uattn_describe_kernels(&L, 128, &r), UATTN_OK, "%s", uattn_last_error());
    cr_assert(!r.panels_gathered && !strstr(r.decode_kernel, "gathered"), "layout %d: %s", layout, r.decode_kernel);
  }
}

/* Where the CPU's best level is a bf16 one without AMX (avx512bf16; avx512bf16fma on Intel's cores), it serves
 * bf16 models (bf16 queries on a bf16 cache, from its generated bucket where there is one, or on an fp8 cache,
 * exact in bf16, from its generic set); an f16 or f32 cache, or f32 queries on a bf16 or fp8 cache, go to the
 * avx512 level (the bf16 rounding of their inputs would add error), also where UATTN_ISA names the level (the
 * next test). */
Test(dispatch, the_bf16_level_serves_bf16_models) {
  unsetenv("UATTN_ISA");
  const char *level = uattn_kernel_set(NULL);
  if (strcmp(level, "avx512bf16") && strcmp(level, "avx512bf16fma"))
    cr_skip_test("this CPU's best level is %s, not avx512bf16 or avx512bf16fma", level);
  uattn_layer L = uattn_layer_default(32, 8, 128, UATTN_BF16);
  L.cache_dtype = UATTN_BF16;
  uattn_kernel_report r;
  cr_assert_eq(uattn_describe_kernels(&L, 128, &r), UATTN_OK, "%s", uattn_last_error());
  cr_assert_str_eq(r.kernel_set, level, "%s", r.reason);
  char want[64];
  if (r.bucket_hit) {
    snprintf(want, sizeof want, "uattn_bf16_causal_b128_d128_c0__%s", functions_of(level, false));
    cr_assert_str_eq(r.part_kernel[UATTN_PART_CAUSAL], want);
    snprintf(want, sizeof want, "uattn_bf16_decode_b128_d128_c0__%s", functions_of(level, true));
    cr_assert_str_eq(r.decode_kernel, want);
  }
  /* fp8 caches: the level's bucket where the build generated one of the shape (the default list does, for both
   * formats), else its generic set */
  for (uattn_dtype t = UATTN_FP8_E4M3; t <= UATTN_FP8_E5M2; t++) {
    L.cache_dtype = t;
    cr_assert_eq(uattn_describe_kernels(&L, 128, &r), UATTN_OK, "%s", uattn_last_error());
    cr_assert_str_eq(r.kernel_set, level, "%s cache: %s", uattn_dtype_name(t), r.reason);
    const bool bucket = generated(t, 128, 128, 0, level);
    cr_assert_eq(r.bucket_hit, bucket, "%s cache: %s", uattn_dtype_name(t), r.reason);
    snprintf(want, sizeof want, "%s", level);
    if (bucket)
      snprintf(want, sizeof want, "uattn_%s_decode_b128_d128_c0__%s", uattn_dtype_name(t), functions_of(level, true));
    cr_assert_str_eq(r.decode_kernel, want, "%s cache: %s", uattn_dtype_name(t), r.reason);
  }
  const uattn_dtype others[][2] = {{UATTN_BF16, UATTN_F16},
                                   {UATTN_F32, UATTN_F32},
                                   {UATTN_F32, UATTN_BF16},
                                   {UATTN_F32, UATTN_FP8_E4M3},
                                   {UATTN_F32, UATTN_FP8_E5M2}};
  for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
    L.dtype = others[i][0], L.cache_dtype = others[i][1];
    cr_assert_eq(uattn_describe_kernels(&L, 128, &r), UATTN_OK, "%s", uattn_last_error());
    cr_assert_str_eq(r.kernel_set, "avx512", "%s in, %s cache: %s", uattn_dtype_name(L.dtype),
                     uattn_dtype_name(L.cache_dtype), r.reason);
    snprintf(want, sizeof want, "%s takes bf16 queries on bf16 or fp8 caches only", level);
    if (!r.bucket_hit) cr_assert(strstr(r.reason, want), "%s", r.reason);
  }
}

/* UATTN_ISA names the highest level to use, not one to force on every layer: each layer takes the best level at
 * or below it that keeps the layer's precision, a generic set (no bucket), and the reason says so. With
 * UATTN_TWINS a level the CPU lacks runs as its exact twin, so this holds on every CPU. */
static void check_highest_level(const char *level, int (*level_runs_here)(void)) {
  setenv("UATTN_TWINS", "1", 1);
  setenv("UATTN_ISA", level, 1);
  uattn_layer L = uattn_layer_default(32, 8, 128, UATTN_BF16);
  uattn_kernel_report r;
  char forced[64], only[96];
  snprintf(forced, sizeof forced, "UATTN_ISA=%s", level);
  snprintf(only, sizeof only, "%s takes bf16 queries on bf16 or fp8 caches only", level);
  const uattn_dtype keep[][2] = {{UATTN_BF16, UATTN_BF16}, {UATTN_BF16, UATTN_FP8_E4M3}, {UATTN_BF16, UATTN_FP8_E5M2}};
  const uattn_dtype lower[][2] = {{UATTN_F32, UATTN_F32},  {UATTN_F16, UATTN_F16},      {UATTN_F32, UATTN_BF16},
                                  {UATTN_BF16, UATTN_F16}, {UATTN_F32, UATTN_FP8_E4M3}, {UATTN_F16, UATTN_BF16}};
  for (size_t i = 0; i < sizeof keep / sizeof *keep + sizeof lower / sizeof *lower; i++) {
    const bool kept = i < sizeof keep / sizeof *keep;
    const uattn_dtype *t = kept ? keep[i] : lower[i - sizeof keep / sizeof *keep];
    L.dtype = t[0], L.cache_dtype = t[1];
    cr_assert_eq(uattn_describe_kernels(&L, 128, &r), UATTN_OK, "%s", uattn_last_error());
    cr_assert_str_eq(r.kernel_set, kept ? level : "avx512", "%s in, %s cache: %s", uattn_dtype_name(t[0]),
                     uattn_dtype_name(t[1]), r.reason);
    cr_assert(!r.bucket_hit && strstr(r.reason, forced), "%s", r.reason);
    cr_assert_eq(strstr(r.reason, only) != NULL, !kept, "%s", r.reason);
    cr_assert_eq(strstr(r.reason, "exact twin") != NULL, !(kept ? level_runs_here() : uattn_avx512_runs_here()), "%s",
                 r.reason);
  }
  /* without twins, a level the CPU lacks (or passes over: avx512bf16fma off Intel) gives the best set below it */
  unsetenv("UATTN_TWINS");
  L.dtype = L.cache_dtype = UATTN_BF16;
  cr_assert_eq(uattn_describe_kernels(&L, 128, &r), UATTN_OK, "%s", uattn_last_error());
  const char *want = level_runs_here()              ? level
                     : uattn_avx512bf16_runs_here() ? "avx512bf16"
                     : uattn_avx512_runs_here()     ? "avx512"
                                                    : "avx2";
  if (uattn_avx2_runs_here() || uattn_avx512bf16_runs_here()) cr_assert_str_eq(r.kernel_set, want, "%s", r.reason);
  unsetenv("UATTN_ISA");
}

Test(dispatch, uattn_isa_names_the_highest_level) {
  check_highest_level("avx512bf16fma", uattn_avx512bf16fma_runs_here);
  check_highest_level("avx512bf16", uattn_avx512bf16_runs_here);
}

/* fp8 caches have buckets of their own (gen/manifest.json's default list: both formats at block sizes 16 and
 * 128 with head dim 128, E4M3 also at block size 16 with head dim 64): a layer of a generated fp8 shape gets
 * one, for queries of every dtype, with every part under the bucket's names and its decode kernel; bf16
 * queries get the bucket of the CPU's best level where that is a bf16 one and one was generated, other queries
 * never.
 * A format the build generated no bucket for falls back and says so. */
Test(dispatch, fp8_caches_get_their_buckets) {
  unsetenv("UATTN_ISA");
  uattn_kernel_bucket all[4096];
  const int32_t n = uattn_kernel_buckets(all, 4096);
  for (uattn_dtype t = UATTN_FP8_E4M3; t <= UATTN_FP8_E5M2; t++) {
    const char *name = uattn_dtype_name(t);
    int32_t listed = 0;
    for (int32_t i = 0; i < n && i < 4096; i++) {
      const uattn_kernel_bucket *b = &all[i];
      if (b->dtype != t) continue;
      listed++;
      if (!b->runs_here) continue;
      for (uattn_dtype q = UATTN_F32; q <= UATTN_F16; q++) {
        uattn_layer L = uattn_layer_default(8, 2, b->head_dim, q);
        L.cache_dtype = t;
        L.chunk_size = b->chunk_size;
        uattn_kernel_report r;
        cr_assert_eq(uattn_describe_kernels(&L, b->block_size, &r), UATTN_OK, "%s", uattn_last_error());
        cr_assert(r.bucket_hit, "%s b%d d%d c%d, %s queries: %s", name, b->block_size, b->head_dim, b->chunk_size,
                  uattn_dtype_name(q), r.reason);
        cr_assert(generated(t, b->block_size, b->head_dim, b->chunk_size, r.kernel_set), "%s", r.reason);
        char prefix[128];
        snprintf(prefix, sizeof prefix, "generated bucket (%s cache, block size %d, head dim %d, chunk size %d)", name,
                 b->block_size, b->head_dim, b->chunk_size);
        cr_assert(strstr(r.reason, prefix), "%s", r.reason);
        const char *best = uattn_kernel_set(NULL);
        const bool bf16_served =
            q == UATTN_BF16 && bf16_level(best) && generated(t, b->block_size, b->head_dim, b->chunk_size, best);
        cr_assert_eq(bf16_level(r.kernel_set), bf16_served, "%s queries on %s: %s", uattn_dtype_name(q), name,
                     r.reason);
        /* every part's function is the bucket's (the causal part's too: it reads this step's keys, as the
         * cache holds them, through the bucket's load); the unique part is its decode kernel */
        const bool decode = record_allows_decode(b->isa, b->block_size, b->head_dim);
        for (int p = 0; p < UATTN_NUM_PARTS; p++) {
          char want[96];
          snprintf(want, sizeof want, "uattn_%s_%s_b%d_d%d_c%d__", name,
                   p == UATTN_PART_CAUSAL   ? "causal"
                   : p == UATTN_PART_SHARED ? "shared"
                   : decode                 ? "decode"
                                            : "unique",
                   b->block_size, b->head_dim, b->chunk_size);
          cr_assert(!strncmp(r.part_kernel[p], want, strlen(want)), "part %d: %s, want %s...", p, r.part_kernel[p],
                    want);
        }
        if (decode) cr_assert_str_eq(r.decode_kernel, r.part_kernel[UATTN_PART_UNIQUE]);
      }
    }
    if (listed) continue;
    /* no bucket of this format in the build: the generic kernels, and why */
    uattn_layer L = uattn_layer_default(8, 2, 128, UATTN_BF16);
    L.cache_dtype = t;
    uattn_kernel_report r;
    cr_assert_eq(uattn_describe_kernels(&L, 16, &r), UATTN_OK, "%s", uattn_last_error());
    cr_assert(!r.bucket_hit, "%s", r.reason);
    char want[64];
    snprintf(want, sizeof want, "fallback: no bucket was generated for a %s cache", name);
    cr_assert(strstr(r.reason, want), "%s", r.reason);
  }
}

Test(dispatch, bad_input_is_refused) {
  uattn_layer L = uattn_layer_default(8, 2, 128, UATTN_BF16);
  uattn_kernel_report r;
  cr_assert_eq(uattn_describe_kernels(NULL, 128, &r), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_describe_kernels(&L, 128, NULL), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_describe_kernels(&L, 0, &r), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(uattn_last_error(), "block_size"), "%s", uattn_last_error());
  L.num_kv_heads = 3;
  cr_assert_eq(uattn_describe_kernels(&L, 128, &r), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_last_forward_report(NULL), UATTN_ERR_INVALID_ARGUMENT);
}

static void *report_on_fresh_thread(void *arg) {
  uattn_kernel_report r;
  *(uattn_status *)arg = uattn_last_forward_report(&r);
  return NULL;
}

/* A step of case c, a bucket's shape: the oracle's answer, the generic kernels' answer within the same
 * tolerance, the same bits on 1 and 2 threads, and a report naming the bucket of the case's cache dtype with
 * the calls each part got. The report is per thread: a thread that ran nothing has none. The outputs are held to
 * the set's precision contract (attention_case.c: attention_contract), then to attention_run_check's (caches,
 * outputs, lse) with P in fp32. */
static void check_step_case(const attention_case *cp) {
  unsetenv("UATTN_ISA");
  const attention_case c = *cp;
  attention_run run;
  attention_run_build(&run, &c);
  double oracle_scale;
  const double err = attention_run_error(&run, &oracle_scale); /* on the bucket */
  uattn_kernel_report r;
  cr_assert_eq(uattn_last_forward_report(&r), UATTN_OK, "%s", uattn_last_error());
  cr_assert(r.bucket_hit, "%s: %s", c.name, r.reason);
  const double bound = attention_run_bound(&run, oracle_scale);
  cr_assert(err <= bound, "%s (%s): max error %.3g exceeds %.3g (max |out| %.3g)", c.name, r.part_kernel[0], err, bound,
            oracle_scale);
  run.layer.probs_fp32 = true; /* the other sets ignore it */
  attention_run_check(&run);
  run.layer.probs_fp32 = false;
  char own[32];
  snprintf(own, sizeof own, "uattn_%s_", uattn_dtype_name(c.cache_dtype));
  for (int p = 0; p < UATTN_NUM_PARTS; p++)
    cr_assert(!strncmp(r.part_kernel[p], own, strlen(own)), "%s: part %d ran %s", c.name, p, r.part_kernel[p]);
  cr_assert_gt(r.part_calls[UATTN_PART_CAUSAL] + r.part_calls[UATTN_PART_SHARED] + r.part_calls[UATTN_PART_UNIQUE], 0);
  if (c.kind == BATCH_MIXED && c.attn_type == UATTN_ATTENTION_DECODER)
    cr_assert_gt(r.part_calls[UATTN_PART_CAUSAL], 0, "a mixed step has prompt rows");
  cr_assert_gt(r.workspace_bytes, 0);
  /* the decode kernel: the bucket's unique-part function; it serves some of each part's calls (never the
   * causal part's), and (chunk size 0) every block of a mixed step's decodes (cross attention's encoder keys
   * are a shared part of their own, cross_part) */
  cr_assert_str_eq(r.decode_kernel, r.part_kernel[UATTN_PART_UNIQUE]);
  int64_t decode_calls = 0;
  for (int p = 0; p < UATTN_NUM_PARTS; p++) {
    cr_assert_leq(r.decode_calls[p], r.part_calls[p], "part %d", p);
    decode_calls += r.decode_calls[p];
  }
  cr_assert_eq(r.decode_calls[UATTN_PART_CAUSAL], 0, "prompt rows never go through the decode kernel");
  if (c.chunk_size == 0 && c.kind == BATCH_MIXED && c.attn_type == UATTN_ATTENTION_DECODER)
    cr_assert_gt(decode_calls, 0, "%s", c.name);

  uattn_tensors on_bucket = attention_run_forward(&run, NULL);
  uattn_runtime_config cfg = uattn_runtime_config_default();
  cfg.num_threads = 2;
  uattn_runtime *rt;
  cr_assert_eq(uattn_runtime_create(&cfg, &rt), UATTN_OK, "%s", uattn_last_error());
  uattn_tensors two = attention_run_forward(&run, rt);
  cr_assert_eq(memcmp(two.out, on_bucket.out, run.out_bytes), 0, "2 threads change a bucket's output");
  uattn_runtime_destroy(rt);

  setenv("UATTN_ISA", "portable", 1);
  uattn_tensors generic = attention_run_forward(&run, NULL);
  cr_assert_eq(uattn_last_forward_report(&r), UATTN_OK);
  cr_assert(!r.bucket_hit);
  unsetenv("UATTN_ISA");
  /* both within their contracts, so within the sum of the two bounds of each other; in practice far closer */
  const size_t n = (size_t)run.info.num_tokens * c.num_q_heads * c.head_dim;
  double scale = 0, diff = 0;
  for (size_t i = 0; i < n; i++) {
    const double a = oracle_load(on_bucket.out, c.dtype, i), g = oracle_load(generic.out, c.dtype, i);
    scale = fmax(scale, fabs(g));
    diff = fmax(diff, fabs(a - g));
  }
  cr_assert_leq(diff, 2 * bound, "bucket vs portable: %g", diff);
  attention_tensors_free(&on_bucket), attention_tensors_free(&two), attention_tensors_free(&generic);
  attention_run_free(&run);

  pthread_t th;
  uattn_status other = UATTN_OK;
  pthread_create(&th, NULL, report_on_fresh_thread, &other);
  pthread_join(th, NULL);
  cr_assert_eq(other, UATTN_ERR_INVALID_ARGUMENT, "a thread that ran no forward has no report");
}

/* A step of the given kind on a bucket's shape and layout, its cache dtype (a bf16 model's queries on an fp8 one). */
static void check_step_on_bucket(const uattn_kernel_bucket *b, batch_kind kind, uattn_kv_layout layout, uint64_t seed) {
  const attention_case c = {"bucket step",
                            kind,
                            b->block_size,
                            8,
                            2,
                            b->head_dim,
                            uattn_dtype_is_fp8(b->dtype) ? UATTN_BF16 : b->dtype,
                            b->dtype,
                            layout,
                            UATTN_ATTENTION_DECODER,
                            0,
                            0,
                            0,
                            0,
                            b->chunk_size,
                            0,
                            seed};
  check_step_case(&c);
}

Test(dispatch, a_step_served_by_a_bucket, .timeout = 300) {
  const uattn_kernel_bucket b = runnable_bucket(false);
  check_step_on_bucket(&b, BATCH_MIXED, UATTN_LAYOUT_NHD, 71);
  check_step_on_bucket(&b, BATCH_SHARED_PREFIX, UATTN_LAYOUT_NHD, 72);
  check_step_on_bucket(&b, BATCH_SPEC_DECODE, UATTN_LAYOUT_NHD, 73);
  /* the same bucket over TILED caches (every bucket's block size is a multiple of 16, its head dim even) */
  check_step_on_bucket(&b, BATCH_MIXED, UATTN_LAYOUT_TILED, 76);
  check_step_on_bucket(&b, BATCH_SHARED_PREFIX, UATTN_LAYOUT_TILED, 77);
  check_step_on_bucket(&b, BATCH_SPEC_DECODE, UATTN_LAYOUT_TILED, 78);
  check_step_on_bucket(&b, BATCH_DECODE, UATTN_LAYOUT_TILED, 79);
}

Test(dispatch, a_step_served_by_a_chunked_bucket, .timeout = 300) {
  const uattn_kernel_bucket b = runnable_bucket(true);
  check_step_on_bucket(&b, BATCH_SHARED_PREFIX, UATTN_LAYOUT_NHD, 74);
  check_step_on_bucket(&b, BATCH_SHARED_PREFIX, UATTN_LAYOUT_TILED, 70);
}

/* The first generated bucket of cache dtype t (of chunk size 0 unless chunked) this CPU runs, best ISA first. */
static bool runnable_bucket_of(uattn_dtype t, bool chunked, uattn_kernel_bucket *out) {
  uattn_kernel_bucket all[4096];
  const int32_t n = uattn_kernel_buckets(all, 4096);
  for (int32_t i = 0; i < n && i < 4096; i++)
    if (all[i].dtype == t && all[i].runs_here && (all[i].chunk_size > 0) == chunked) {
      *out = all[i];
      return true;
    }
  return false;
}

/* Steps on fp8 caches served by their buckets, against the oracle and the generic kernels (check_step_case):
 * both formats, NHD and HND, bf16 queries (the avx512bf16 level's bucket where the CPU has it) and f32 ones
 * (the level below's), every part: prompts (causal), shared prefixes (shared), decodes (unique: the decode
 * kernel), split-K decodes, cross attention, and chunked shared parts where the build generated a chunked
 * fp8 bucket (the default list has none); k_scale and v_scale apart from 1 and from each other, so that a
 * scale lost, doubled or swapped on a bucket's path shows. */
Test(dispatch, steps_on_fp8_caches_served_by_their_buckets, .timeout = 300) {
  const uattn_kv_layout NHD = UATTN_LAYOUT_NHD, HND = UATTN_LAYOUT_HND, TILED = UATTN_LAYOUT_TILED;
  const uattn_attention_type DEC = UATTN_ATTENTION_DECODER, CROSS = UATTN_ATTENTION_ENCODER_DECODER;
  const struct {
    const char *name;
    batch_kind kind;
    uattn_dtype dtype;
    uattn_kv_layout layout;
    uattn_attention_type type;
    int32_t split_min_keys, split_keys;
    float k_scale, v_scale;
  } steps[] = {
      {"fp8 bucket, mixed, bf16", BATCH_MIXED, UATTN_BF16, NHD, DEC, 0, 0, 0.5f, 3.0f},
      {"fp8 bucket, mixed, f32, HND", BATCH_MIXED, UATTN_F32, HND, DEC, 0, 0, 3.0f, 0.5f},
      {"fp8 bucket, shared prefix, bf16, HND", BATCH_SHARED_PREFIX, UATTN_BF16, HND, DEC, 0, 0, 0.5f, 3.0f},
      {"fp8 bucket, spec decode, f32", BATCH_SPEC_DECODE, UATTN_F32, NHD, DEC, 0, 0, 3.0f, 0.5f},
      {"fp8 bucket, split-K decodes, bf16, HND", BATCH_DECODE, UATTN_BF16, HND, DEC, 100, 200, 0.5f, 3.0f},
      {"fp8 bucket, split-K decodes, f32", BATCH_DECODE, UATTN_F32, NHD, DEC, 100, 200, 3.0f, 0.5f},
      {"fp8 bucket, cross attention, bf16", BATCH_MIXED, UATTN_BF16, NHD, CROSS, 0, 0, 0.5f, 3.0f},
      {"fp8 bucket, cross attention, f32, HND", BATCH_DECODE, UATTN_F32, HND, CROSS, 0, 0, 3.0f, 0.5f},
      {"fp8 bucket, mixed, bf16, TILED", BATCH_MIXED, UATTN_BF16, TILED, DEC, 0, 0, 0.5f, 3.0f},
      {"fp8 bucket, shared prefix, f32, TILED", BATCH_SHARED_PREFIX, UATTN_F32, TILED, DEC, 0, 0, 3.0f, 0.5f},
      {"fp8 bucket, spec decode, bf16, TILED", BATCH_SPEC_DECODE, UATTN_BF16, TILED, DEC, 0, 0, 0.5f, 3.0f},
      {"fp8 bucket, split-K decodes, bf16, TILED", BATCH_DECODE, UATTN_BF16, TILED, DEC, 100, 200, 3.0f, 0.5f},
      {"fp8 bucket, decodes, f32, TILED", BATCH_DECODE, UATTN_F32, TILED, DEC, 0, 0, 0.5f, 3.0f},
      {"fp8 bucket, cross attention, bf16, TILED", BATCH_DECODE, UATTN_BF16, TILED, CROSS, 0, 0, 0.5f, 3.0f},
  };
  int served = 0;
  for (uattn_dtype t = UATTN_FP8_E4M3; t <= UATTN_FP8_E5M2; t++)
    for (int chunked = 0; chunked < 2; chunked++) {
      uattn_kernel_bucket b;
      if (!runnable_bucket_of(t, chunked, &b)) continue;
      served++;
      for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
        if (chunked && steps[i].kind != BATCH_SHARED_PREFIX) continue; /* the chunked merge is the shared part's */
        const attention_case c = {steps[i].name,
                                  steps[i].kind,
                                  b.block_size,
                                  8,
                                  2,
                                  b.head_dim,
                                  steps[i].dtype,
                                  t,
                                  steps[i].layout,
                                  steps[i].type,
                                  0,
                                  0,
                                  0,
                                  0,
                                  b.chunk_size,
                                  0,
                                  80 + 10 * (uint64_t)t + i,
                                  steps[i].split_min_keys,
                                  steps[i].split_keys,
                                  steps[i].k_scale,
                                  steps[i].v_scale};
        check_step_case(&c);
      }
    }
  if (!served) cr_skip_test("no fp8 bucket runs on this CPU (none was generated, or this CPU lacks their ISAs)");
}

/* A tuning file's entry for the bucket fills what the layer leaves 0: the chunk size (so the chunked bucket
 * serves), and the workers a call runs on; the answer is still the oracle's. The layer's own values win. */
Test(dispatch, a_tuning_file_chooses_the_chunked_bucket, .timeout = 300) {
  unsetenv("UATTN_ISA");
  const uattn_kernel_bucket b = runnable_bucket(true);
  char path[] = "/tmp/uattn-test-tuning-XXXXXX";
  const int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  close(fd);
  const uattn_tuning_entry e = {.block_size = b.block_size,
                                .head_dim = b.head_dim,
                                .cache_dtype = b.dtype,
                                .chunk_size = b.chunk_size,
                                .num_threads = 1};
  cr_assert_eq(uattn_tuning_write(path, &e, 1, NULL, NULL), UATTN_OK, "%s", uattn_last_error());
  uattn_runtime_config cfg = uattn_runtime_config_default();
  cfg.num_threads = 2;
  uattn_runtime *rt;
  cr_assert_eq(uattn_runtime_create(&cfg, &rt), UATTN_OK, "%s", uattn_last_error());
  cr_assert_eq(uattn_runtime_load_tuning(rt, path), UATTN_OK, "%s", uattn_last_error());
  unlink(path);

  const attention_case c = {"tuned step",
                            BATCH_SHARED_PREFIX,
                            b.block_size,
                            8,
                            2,
                            b.head_dim,
                            b.dtype,
                            b.dtype,
                            UATTN_LAYOUT_NHD,
                            UATTN_ATTENTION_DECODER,
                            0,
                            0,
                            0,
                            0,
                            0 /* chunk: the file's */,
                            0,
                            75};
  attention_run run;
  attention_run_build(&run, &c);
  uattn_tensors tuned = attention_run_forward(&run, rt);
  uattn_kernel_report r;
  cr_assert_eq(uattn_last_forward_report(&r), UATTN_OK);
  cr_assert(r.bucket_hit, "%s", r.reason);
  cr_assert_eq(r.chunk_size, b.chunk_size, "the file's chunk size");
  cr_assert_eq(r.workers, 1, "the file's thread count");
  /* the same step with the chunk size given explicitly on one thread: the same bits */
  run.layer.chunk_size = b.chunk_size;
  uattn_tensors given = attention_run_forward(&run, NULL);
  cr_assert_eq(memcmp(tuned.out, given.out, run.out_bytes), 0);
  /* and a layer's own value wins over the file's */
  run.layer.chunk_size = b.chunk_size + 1;
  uattn_tensors own = attention_run_forward(&run, rt);
  cr_assert_eq(uattn_last_forward_report(&r), UATTN_OK);
  cr_assert_eq(r.chunk_size, b.chunk_size + 1);
  attention_tensors_free(&tuned), attention_tensors_free(&given), attention_tensors_free(&own);
  run.layer.chunk_size = 0;
  attention_run_check(&run); /* the untuned path still matches the oracle */
  attention_run_free(&run);
  uattn_runtime_destroy(rt);
}
