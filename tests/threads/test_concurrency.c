/* Forwards from several engine threads at once: on one shared runtime (several workers, or one), on a
 * runtime each, with split-K on and off, and while another thread reloads the runtime's tuning file. Each
 * engine has its own plan and batch; every call must give the bits of the same forward run alone on the
 * calling thread (results depend neither on the thread count nor on the tunables), and that one is held to
 * the dense fp64 oracle once. Engines differ in shape, so a forward that ran between another's passes
 * would find its scratch resized or overwritten: wrong outputs, or (under ASan) a use after free.
 *
 * Built twice: as a Criterion suite, and without Criterion (UATTN_TEST_STANDALONE, tests/common/standalone_test.h)
 * for the ThreadSanitizer build, under which Criterion cannot run; make test runs both. */
#define _GNU_SOURCE
#ifdef UATTN_TEST_STANDALONE
#include "common/standalone_test.h"
#else
#include <criterion/criterion.h>
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/attention_case.h"
#include "uattn_tuning.h"

TestSuite(concurrency);

/* Under ThreadSanitizer each call is ~10x slower: fewer calls still interleave every pass many times. */
#if defined(__SANITIZE_THREAD__)
enum { CALLS = 6 };
#else
enum { CALLS = 24 };
#endif
enum { ENGINES = 5 };

/* The engines' batches: decodes over long contexts (split-K's case), a mixed step, verifications, a shared
 * prefix and decodes over a TILED cache (the decode kernels' own layout), each with its own head count, head
 * dim, dtype or layout so that their workspaces differ in size. */
static const attention_case engine_cases[ENGINES] = {
    {"decodes", BATCH_DECODE, 16, 8, 2, 64, UATTN_BF16, UATTN_BF16, UATTN_LAYOUT_NHD, .seed = 11},
    {"mixed", BATCH_MIXED, 16, 4, 4, 128, UATTN_F32, UATTN_F32, UATTN_LAYOUT_NHD, .seed = 12},
    {"verify", BATCH_SPEC_DECODE, 32, 8, 1, 96, UATTN_F16, UATTN_F16, UATTN_LAYOUT_HND, .seed = 13},
    {"shared prefix", BATCH_SHARED_PREFIX, 16, 16, 4, 128, UATTN_BF16, UATTN_BF16, UATTN_LAYOUT_NHD, .seed = 14},
    {"tiled decodes", BATCH_DECODE, 128, 32, 8, 128, UATTN_BF16, UATTN_BF16, UATTN_LAYOUT_TILED, .seed = 15},
};

typedef struct engine {
  attention_run run;
  uattn_tensors want; /* the forward alone on the calling thread */
  uattn_runtime *rt;
  char error[256]; /* the first mismatch ("" none): engine threads record, the test thread asserts */
} engine;

static bool same_bytes(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

/* One forward on fresh tensors, compared with the engine's reference; false (and e->error) on a difference. */
static bool forward_matches(engine *e, int call) {
  const attention_run *r = &e->run;
  uattn_tensors t = attention_tensors(r);
  const uattn_status st = uattn_forward(r->plan, &r->layer, &t, e->rt);
  const char *what =
      st != UATTN_OK                                  ? uattn_last_error()
      : !same_bytes(t.out, e->want.out, r->out_bytes) ? "out differs"
      : !same_bytes(t.lse, e->want.lse, sizeof(float) * (size_t)r->info.num_tokens * (size_t)r->c.num_q_heads)
          ? "lse differs"
      : !same_bytes(t.key_cache, e->want.key_cache, r->cache_bytes)     ? "the key cache differs"
      : !same_bytes(t.value_cache, e->want.value_cache, r->cache_bytes) ? "the value cache differs"
                                                                        : NULL;
  if (what) snprintf(e->error, sizeof e->error, "%s, call %d: %s", r->c.name, call, what);
  attention_tensors_free(&t);
  return what == NULL;
}

static atomic_int engines_running;

static void *engine_main(void *p) {
  engine *e = p;
  for (int call = 0; call < CALLS && forward_matches(e, call); call++) {
  }
  atomic_fetch_sub(&engines_running, 1);
  return NULL;
}

/* A reference against the oracle. On a bf16 level (attention_contract) a bf16 or fp8 cache's kernels round P to bf16 (the
 * layer's default; TILED's decode kernel only runs so), which moves an output by up to 2^-8 max |v| beyond
 * attention_tolerance (tests/attention/test_attention.c, bf16_level_against_the_oracle; measured on the TILED
 * engine: 0.0041 of its largest output, against 0.004): there the output is held to that bound, as
 * tests/kernels/test_dispatch.c holds a bucket's, and attention_run_check's caches, outputs and lse to the
 * oracle's with P in fp32. */
static void check_reference(attention_run *run) {
  if (attention_run_contract(run).abs == 0) { /* not a bf16 level's P in bf16 */
    attention_run_check(run);
    return;
  }
  double scale;
  const double err = attention_run_error(run, &scale);
  const double bound = attention_tolerance(run->c.dtype, run->c.cache_dtype) * scale + 0x1p-8;
  cr_assert(err <= bound, "%s (P in bf16): max error %.3g exceeds %.3g (max |out| %.3g)", run->c.name, err, bound,
            scale);
  run->layer.probs_fp32 = true;
  attention_run_check(run);
  run->layer.probs_fp32 = false;
}

/* Builds the engines (split-K at split_min_keys / split_keys, 0 = the defaults: off for these contexts),
 * their references on the calling thread, and checks each reference against the oracle. */
static void engines_build(engine *engines, int32_t split_min_keys, int32_t split_keys) {
  for (int i = 0; i < ENGINES; i++) {
    engine *e = &engines[i];
    memset(e, 0, sizeof *e);
    attention_case c = engine_cases[i];
    c.split_min_keys = split_min_keys;
    c.split_keys = split_keys;
    attention_run_build(&e->run, &c);
    check_reference(&e->run);
    e->want = attention_run_forward(&e->run, NULL);
  }
}

static void engines_free(engine *engines) {
  for (int i = 0; i < ENGINES; i++) {
    attention_tensors_free(&engines[i].want);
    attention_run_free(&engines[i].run);
  }
}

/* Starts every engine, runs `meanwhile` (if any) on this thread while they run, and asserts that each got
 * its reference's bits on every call. */
static void run_engines(engine *engines, void (*meanwhile)(engine *)) {
  pthread_t th[ENGINES];
  atomic_store(&engines_running, ENGINES);
  for (int i = 0; i < ENGINES; i++) cr_assert_eq(pthread_create(&th[i], NULL, engine_main, &engines[i]), 0);
  if (meanwhile) meanwhile(engines);
  for (int i = 0; i < ENGINES; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < ENGINES; i++) cr_assert(!engines[i].error[0], "engine %d: %s", i, engines[i].error);
}

static uattn_runtime *runtime_of(int32_t threads) {
  uattn_runtime_config c = uattn_runtime_config_default();
  c.num_threads = threads;
  c.pin = false; /* several runtimes on 2 cores: pinning adds nothing to what is tested */
  uattn_runtime *rt = NULL;
  cr_assert_eq(uattn_runtime_create(&c, &rt), UATTN_OK, "%s", uattn_last_error());
  return rt;
}

/* All engines on one runtime of `threads` workers. */
static void one_runtime(int32_t threads, int32_t split_min_keys, int32_t split_keys) {
  static engine engines[ENGINES];
  engines_build(engines, split_min_keys, split_keys);
  uattn_runtime *rt = runtime_of(threads);
  for (int i = 0; i < ENGINES; i++) engines[i].rt = rt;
  run_engines(engines, NULL);
  uattn_runtime_destroy(rt);
  engines_free(engines);
}

/* The case: split-K's partial states live in worker 0's scratch between the attention pass and
 * the merge pass. */
Test(concurrency, engines_on_one_runtime_with_split_k) { one_runtime(3, 64, 32); }

Test(concurrency, engines_on_one_runtime_without_split_k) { one_runtime(3, 0, 0); }

/* One worker: the caller runs every pass itself, but the scratch is still the runtime's. */
Test(concurrency, engines_on_one_single_worker_runtime) { one_runtime(1, 64, 32); }

Test(concurrency, engines_on_a_runtime_each) {
  static engine engines[ENGINES];
  engines_build(engines, 64, 32);
  for (int i = 0; i < ENGINES; i++) engines[i].rt = runtime_of(2);
  run_engines(engines, NULL);
  for (int i = 0; i < ENGINES; i++) uattn_runtime_destroy(engines[i].rt);
  engines_free(engines);
}

/* Loads a tuning file for every engine's bucket, then drops it, again and again while the engines run: each
 * call sees one tuning or the other. The file sets the thread count, which never changes the bits (the
 * query tile and the chunk size regroup the fp32 sums: they change bits within the tolerances). */
static void reload_tuning(engine *engines) {
  char path[64];
  snprintf(path, sizeof path, "/tmp/uattn-concurrency-%ld.json", (long)getpid());
  uattn_tuning_entry entries[ENGINES];
  for (int i = 0; i < ENGINES; i++) {
    const attention_case *c = &engines[i].run.c;
    entries[i] = (uattn_tuning_entry){
        .block_size = c->block_size, .head_dim = c->head_dim, .cache_dtype = c->cache_dtype, .num_threads = 1};
  }
  cr_assert_eq(uattn_tuning_write(path, entries, ENGINES, NULL, NULL), UATTN_OK, "%s", uattn_last_error());
  uattn_runtime *rt = engines[0].rt;
  int loads = 0;
  for (; atomic_load(&engines_running) > 0; loads++) {
    cr_assert_eq(uattn_runtime_load_tuning(rt, loads % 2 ? NULL : path), UATTN_OK, "%s", uattn_last_error());
    usleep(200);
  }
  cr_assert(loads > 1, "the engines finished before the tuning was reloaded");
  remove(path);
}

Test(concurrency, engines_on_one_runtime_while_its_tuning_is_reloaded) {
  static engine engines[ENGINES];
  engines_build(engines, 64, 32);
  uattn_runtime *rt = runtime_of(3);
  for (int i = 0; i < ENGINES; i++) engines[i].rt = rt;
  run_engines(engines, reload_tuning);
  uattn_runtime_destroy(rt);
  engines_free(engines);
}
