/* Dispatch from a layer's kernel bucket to its kernels, through the public API: generated buckets are found and
 * serve every part (each bucket of the registry: test_kernels.c's buckets suite), shapes outside the generated
 * list fall back to the generic kernels and say why, UATTN_ISA forces a generic set, uattn_last_forward_report
 * says what served a call, and a step served by a bucket matches the dense oracle and the generic kernels'
 * result, whatever the thread count. Tolerances: attention_case.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/attention_case.h"
#include "kernels.h"

/* The first generated bucket this CPU runs (of chunk size 0 unless chunked), or skips the test. */
static uattn_kernel_bucket runnable_bucket(bool chunked) {
  uattn_kernel_bucket all[4096];
  const int32_t n = uattn_kernel_buckets(all, 4096);
  for (int32_t i = 0; i < n && i < 4096; i++)
    if (all[i].runs_here && (all[i].chunk_size > 0) == chunked) return all[i];
  cr_skip_test("no generated %sbucket runs on this CPU", chunked ? "chunked " : "");
  return all[0];
}

static uattn_layer bucket_layer(const uattn_kernel_bucket *b) {
  uattn_layer L = uattn_layer_default(8, 2, b->head_dim, b->dtype);
  L.chunk_size = b->chunk_size;
  return L;
}

static const char *dtype_tag(uattn_dtype t) { return t == UATTN_F32 ? "f32" : t == UATTN_BF16 ? "bf16" : "f16"; }

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

Test(dispatch, a_generated_bucket_serves_every_part) {
  unsetenv("UATTN_ISA");
  const uattn_kernel_bucket b = runnable_bucket(false);
  const uattn_layer L = bucket_layer(&b);
  uattn_kernel_report r;
  cr_assert_eq(uattn_describe_kernels(&L, b.block_size, &r), UATTN_OK, "%s", uattn_last_error());
  cr_assert(r.bucket_hit, "%s", r.reason);
  cr_assert_str_eq(r.kernel_set, b.isa);
  /* the unique part's decode rows go straight from the cache (the decode kernel) where the bucket allows */
  const bool decode = b.head_dim % 8 == 0 && b.block_size <= 256;
  const char *const parts[] = {"causal", "shared", decode ? "decode" : "unique"};
  /* a bucket of an ISA that shares another's (gen/manifest.json: avx512 shares avx2's) has its own decode kernel
   * and the other ISA's attend for the rest */
  const char *shares = NULL;
  for (size_t i = 0; i < uattn_isa_registry_size; i++)
    if (!strcmp(uattn_isa_registry[i].name, b.isa)) shares = uattn_isa_registry[i].shares;
  for (int p = 0; p < UATTN_NUM_PARTS; p++) {
    const bool own = !shares || (p == UATTN_PART_UNIQUE && decode);
    char want[64];
    snprintf(want, sizeof want, "uattn_%s_%s_b%d_d%d_c%d__%s", dtype_tag(b.dtype), parts[p], b.block_size, b.head_dim,
             b.chunk_size, own ? b.isa : shares);
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

/* Where the CPU has AVX512-BF16, the avx512bf16 level serves bf16 models (bf16 queries on a bf16 cache,
 * from its generated bucket where there is one, or on an fp8 cache, exact in bf16, from its generic set); an
 * f16 or f32 cache, or f32 queries on a bf16 or fp8 cache, go to the avx512 level (the bf16 rounding of
 * their inputs would add error); UATTN_ISA=avx512bf16 forces it on any layer. */
Test(dispatch, the_bf16_level_serves_bf16_models) {
  unsetenv("UATTN_ISA");
  if (strcmp(uattn_kernel_set(NULL), "avx512bf16")) cr_skip_test("this CPU lacks AVX512-BF16");
  uattn_layer L = uattn_layer_default(32, 8, 128, UATTN_BF16);
  L.cache_dtype = UATTN_BF16;
  uattn_kernel_report r;
  cr_assert_eq(uattn_describe_kernels(&L, 128, &r), UATTN_OK, "%s", uattn_last_error());
  cr_assert_str_eq(r.kernel_set, "avx512bf16", "%s", r.reason);
  if (r.bucket_hit) {
    cr_assert_str_eq(r.part_kernel[UATTN_PART_CAUSAL], "uattn_bf16_causal_b128_d128_c0__avx512bf16");
    cr_assert_str_eq(r.decode_kernel, "uattn_bf16_decode_b128_d128_c0__avx512bf16");
  }
  for (uattn_dtype t = UATTN_FP8_E4M3; t <= UATTN_FP8_E5M2; t++) {
    L.cache_dtype = t;
    cr_assert_eq(uattn_describe_kernels(&L, 128, &r), UATTN_OK, "%s", uattn_last_error());
    cr_assert_str_eq(r.kernel_set, "avx512bf16", "cache dtype %d: %s", (int)t, r.reason);
    cr_assert_str_eq(r.decode_kernel, "avx512bf16", "cache dtype %d: %s", (int)t, r.reason);
  }
  const uattn_dtype others[][2] = {{UATTN_BF16, UATTN_F16},
                                   {UATTN_F32, UATTN_F32},
                                   {UATTN_F32, UATTN_BF16},
                                   {UATTN_F32, UATTN_FP8_E4M3},
                                   {UATTN_F32, UATTN_FP8_E5M2}};
  for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
    L.dtype = others[i][0], L.cache_dtype = others[i][1];
    cr_assert_eq(uattn_describe_kernels(&L, 128, &r), UATTN_OK, "%s", uattn_last_error());
    cr_assert_str_eq(r.kernel_set, "avx512", "%s in, %s cache: %s", dtype_tag(L.dtype), dtype_tag(L.cache_dtype),
                     r.reason);
    if (!r.bucket_hit)
      cr_assert(strstr(r.reason, "avx512bf16 takes bf16 queries on bf16 or fp8 caches only"), "%s", r.reason);
  }
  setenv("UATTN_ISA", "avx512bf16", 1);
  cr_assert_eq(uattn_describe_kernels(&L, 128, &r), UATTN_OK, "%s", uattn_last_error());
  cr_assert_str_eq(r.kernel_set, "avx512bf16", "%s", r.reason);
  cr_assert(strstr(r.reason, "UATTN_ISA"), "%s", r.reason);
  unsetenv("UATTN_ISA");
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

/* A mixed step on a bucket's shape: the oracle's answer, the generic kernels' answer within the same
 * tolerance, the same bits on 1 and 2 threads, and a report naming the bucket's kernels with the calls
 * each part got. The report is per thread: a thread that ran nothing has none. */
static void check_step_on_bucket(const uattn_kernel_bucket *b, batch_kind kind, uint64_t seed) {
  unsetenv("UATTN_ISA");
  const attention_case c = {"bucket step",
                            kind,
                            b->block_size,
                            8,
                            2,
                            b->head_dim,
                            b->dtype,
                            b->dtype,
                            UATTN_LAYOUT_NHD,
                            UATTN_ATTENTION_DECODER,
                            0,
                            0,
                            0,
                            0,
                            b->chunk_size,
                            0,
                            seed};
  attention_run run;
  attention_run_build(&run, &c);
  attention_run_check(&run); /* against the oracle, on the bucket */
  uattn_kernel_report r;
  cr_assert_eq(uattn_last_forward_report(&r), UATTN_OK, "%s", uattn_last_error());
  cr_assert(r.bucket_hit, "%s", r.reason);
  cr_assert_gt(r.part_calls[UATTN_PART_CAUSAL] + r.part_calls[UATTN_PART_SHARED] + r.part_calls[UATTN_PART_UNIQUE], 0);
  if (kind == BATCH_MIXED) cr_assert_gt(r.part_calls[UATTN_PART_CAUSAL], 0, "a mixed step has prompt rows");
  cr_assert_gt(r.workspace_bytes, 0);
  /* the decode kernel: the bucket's unique-part function; it serves some of each part's calls (never the
   * causal part's), and on this NHD cache (chunk size 0) every block of a mixed step's decodes */
  cr_assert_str_eq(r.decode_kernel, r.part_kernel[UATTN_PART_UNIQUE]);
  int64_t decode_calls = 0;
  for (int p = 0; p < UATTN_NUM_PARTS; p++) {
    cr_assert_leq(r.decode_calls[p], r.part_calls[p], "part %d", p);
    decode_calls += r.decode_calls[p];
  }
  cr_assert_eq(r.decode_calls[UATTN_PART_CAUSAL], 0, "prompt rows never go through the decode kernel");
  if (b->chunk_size == 0 && kind == BATCH_MIXED) cr_assert_gt(decode_calls, 0);

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
  /* both within the oracle's tolerance, so within twice of each other; in practice far closer */
  const size_t n = (size_t)run.info.num_tokens * c.num_q_heads * c.head_dim;
  double scale = 0, diff = 0;
  for (size_t i = 0; i < n; i++) {
    const double a = oracle_load(on_bucket.out, c.dtype, i), g = oracle_load(generic.out, c.dtype, i);
    scale = fmax(scale, fabs(g));
    diff = fmax(diff, fabs(a - g));
  }
  cr_assert_leq(diff, 2 * attention_tolerance(c.dtype, c.cache_dtype) * fmax(scale, 1e-30), "bucket vs portable: %g",
                diff);
  attention_tensors_free(&on_bucket), attention_tensors_free(&two), attention_tensors_free(&generic);
  attention_run_free(&run);

  pthread_t th;
  uattn_status other = UATTN_OK;
  pthread_create(&th, NULL, report_on_fresh_thread, &other);
  pthread_join(th, NULL);
  cr_assert_eq(other, UATTN_ERR_INVALID_ARGUMENT, "a thread that ran no forward has no report");
}

Test(dispatch, a_step_served_by_a_bucket, .timeout = 300) {
  const uattn_kernel_bucket b = runnable_bucket(false);
  check_step_on_bucket(&b, BATCH_MIXED, 71);
  check_step_on_bucket(&b, BATCH_SHARED_PREFIX, 72);
  check_step_on_bucket(&b, BATCH_SPEC_DECODE, 73);
}

Test(dispatch, a_step_served_by_a_chunked_bucket, .timeout = 300) {
  const uattn_kernel_bucket b = runnable_bucket(true);
  check_step_on_bucket(&b, BATCH_SHARED_PREFIX, 74);
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
