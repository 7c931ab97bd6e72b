/* Every part of every generated bucket in the registry against the portable set on jobs of its shape, each
 * bucket the dispatch's choice for its shape; then the ISA ladder (gen/manifest.json), the selection, and the
 * report of which ISA paths this run covered. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "avx2/avx2.h"
#include "avx2/xsmm.h"
#include "avx512/avx512.h"
#include "avx512bf16/avx512bf16.h"
#include "avx512bf16fma/avx512bf16fma.h"
#include "amx/amx.h"
#include "jobs.h"
#include "portable/portable.h"

/* ---- the generated buckets ----------------------------------------------------------------------------- */

/* One (bucket, part) of the registry a test. */
typedef struct bucket_param {
  int32_t index;
  uattn_part part;
} bucket_param;

enum { MAX_BUCKET_PARAMS = 3 * 1024 };
static bucket_param bucket_params[MAX_BUCKET_PARAMS];

ParameterizedTestParameters(buckets, match_portable_on_random_jobs) {
  size_t n = 0;
  for (size_t i = 0; i < uattn_bucket_registry_size && n + UATTN_NUM_PARTS <= MAX_BUCKET_PARAMS; i++)
    for (int p = 0; p < UATTN_NUM_PARTS; p++) bucket_params[n++] = (bucket_param){(int32_t)i, (uattn_part)p};
  return cr_make_param_array(bucket_param, bucket_params, n);
}

/* Every part of every generated bucket against the portable set, on random jobs of the bucket's head dim,
 * mostly whole blocks of its block size and dtype (the unique part: the decode kernel's jobs of a few rows),
 * NHD and HND sources; an fp8 bucket's blocks are raw codes of its format, as the cache holds them (the forward
 * applies the scales). */
ParameterizedTest(bucket_param *param, buckets, match_portable_on_random_jobs, .timeout = KERNEL_TEST_TIMEOUT) {
  const uattn_bucket_kernels *b = uattn_bucket_registry[param->index];
  if (!b->runs_here()) cr_skip_test("this CPU lacks %s", b->isa);
  const bool decode = param->part == UATTN_PART_UNIQUE;
  const case_limits lim = {.head_dim = b->head_dim,
                           .block_size = b->block_size,
                           .dtype = b->dtype,
                           .decode = decode,
                           .bf16 = b->set.caps.bf16_inputs,
                           .fp8 = uattn_dtype_is_fp8(b->dtype)};
  const int cases = (decode ? 6 : 1) * (60 / SPARSE + 4); /* the decode kernel's jobs are small and cheap */
  /* seeds from the bucket's shape, not its place in the registry: the same jobs for every ISA's bucket of a
   * shape, and for every build that lists it */
  const uint64_t shape =
      (((uint64_t)b->dtype * 4099u + (uint64_t)b->block_size) * 4099u + (uint64_t)b->head_dim) * 4099u +
      (uint64_t)b->chunk_size;
  check_set_on_random_jobs(&b->set, param->part, b->part_names[param->part], &lim, cases,
                           1000u + 7u * shape + (uint64_t)param->part);
  if (decode && b->set.decode)
    check_decode_heads(&b->set, b->part_names[param->part], &lim, 40 / SPARSE + 4, 5000u + shape);
}

static int32_t bucket_indices[MAX_BUCKET_PARAMS];

ParameterizedTestParameters(buckets, dispatch_to_themselves) {
  size_t n = 0;
  for (; n < uattn_bucket_registry_size && n < MAX_BUCKET_PARAMS; n++) bucket_indices[n] = (int32_t)n;
  return cr_make_param_array(int32_t, bucket_indices, n);
}

static bool same_shape(const uattn_bucket_kernels *a, const uattn_bucket_kernels *b) {
  return a->dtype == b->dtype && a->block_size == b->block_size && a->head_dim == b->head_dim &&
         a->chunk_size == b->chunk_size;
}

/* Every generated bucket is what the dispatch gives for its shape on a CPU that runs its ISA, for queries of
 * some dtype (the bf16 level takes bf16 queries only and leaves the others to the level below), unless a
 * better ISA's bucket of the same shape runs here too (the registry is best ISA first): then that one serves,
 * and the test says so. Queries of every dtype get a bucket of the shape this CPU runs, never a generic set. */
ParameterizedTest(int32_t *index, buckets, dispatch_to_themselves) {
  unsetenv("UATTN_ISA");
  const uattn_bucket_kernels *b = uattn_bucket_registry[*index];
  if (!b->runs_here()) cr_skip_test("this CPU lacks %s", b->isa);
  char label[96];
  snprintf(label, sizeof label, "%s b%d d%d c%d (%s)", uattn_dtype_name(b->dtype), b->block_size, b->head_dim,
           b->chunk_size, b->isa);
  const uattn_bucket_kernels *better = NULL; /* the best bucket of the shape this CPU runs, where not b */
  for (int32_t i = 0; i < *index && !better; i++)
    if (same_shape(uattn_bucket_registry[i], b) && uattn_bucket_registry[i]->runs_here())
      better = uattn_bucket_registry[i];
  bool itself = false;
  for (int q = UATTN_F32; q <= UATTN_F16; q++) {
    const uattn_bucket_kernels *got;
    char why[256];
    const uattn_kernels *set = uattn_kernels_dispatch(b->block_size, b->head_dim, b->dtype, (uattn_dtype)q,
                                                      b->chunk_size, &got, why, sizeof why);
    cr_assert(got, "%s, %s queries: %s", label, uattn_dtype_name((uattn_dtype)q), why);
    cr_assert_eq(set, &got->set, "%s: the set returned is not the bucket's", label);
    cr_assert(same_shape(got, b) && got->runs_here(), "%s: served by %s's bucket of another shape", label, got->isa);
    itself |= got == b;
  }
  cr_assert(itself || better, "%s: no query dtype dispatches to it", label);
  if (!itself) cr_log_info("%s: served by its %s bucket, a better ISA this CPU runs", label, better->isa);
}

/* ---- which ISA paths this run covered ------------------------------------------------------------------- */

/* After the run, on stderr and in $UATTN_ISA_REPORT (make test prints it): every ISA path of the kernels,
 * whether this CPU ran it and, where not, why and what stood in for it. Asked in the runner's process after
 * every test, so that no probe runs before a test's own first use of libxsmm. */
static void isa_report(FILE *f) {
  const bool avx2 = uattn_avx2_runs_here(), avx512 = uattn_avx512_runs_here();
  const bool xsmm = avx2 && uattn_xsmm_runs_here();
  fprintf(f, "test_kernels: ISA paths on this CPU\n");
  fprintf(f, "  %-34s ran: the reference every other set is held to\n", "portable");
  fprintf(f, "  %-34s %s\n", "avx2 (loads, fused attend, decode)",
          avx2 ? "ran" : "skipped: this CPU lacks AVX2, FMA or F16C");
  if (xsmm)
    fprintf(f, "  %-34s ran, libxsmm generating %s code\n", "libxsmm body", uattn_xsmm_target());
  else
    fprintf(f, "  %-34s skipped: %s\n", "libxsmm body",
            avx2 ? "libxsmm is not built in, or JITs nothing on this CPU" : "it runs on the avx2 set's panels");
  fprintf(f, "  %-34s %s\n", "avx512 attend, decode, ymm twin", avx2 ? "ran" : "skipped: the twin needs AVX2");
  fprintf(f, "  %-34s %s\n", "avx512 attend, decode, zmm",
          avx512 ? "ran, held to its twin bit for bit" : "skipped: this CPU lacks AVX-512F (its twin ran instead)");
  fprintf(f, "  %-34s %s\n", "avx512bf16, emulated twin", avx2 ? "ran" : "skipped: the twin needs AVX2");
  fprintf(f, "  %-34s %s\n", "avx512bf16, vdpbf16ps",
          uattn_avx512bf16_runs_here() ? "ran, held to its twin bit for bit"
                                       : "skipped: this CPU lacks AVX512-BF16 (its twin ran instead)");
  fprintf(f, "  the ladder's levels in the attention suites (UATTN_ISA, UATTN_TWINS):\n");
  for (size_t i = 0; i < uattn_isa_registry_size; i++) {
    const uattn_isa *isa = &uattn_isa_registry[i];
    fprintf(f, "    %-32s %s\n", isa->name,
            !isa->runs_here || isa->runs_here()  ? "native"
            : isa->twin && isa->twin_runs_here() ? "as its exact twin: this CPU lacks it"
                                                 : "skipped: this CPU lacks it and its twin's ISA");
  }
  int runs = 0, lacks = 0;
  for (size_t i = 0; i < uattn_bucket_registry_size; i++) uattn_bucket_registry[i]->runs_here() ? runs++ : lacks++;
  fprintf(f, "  %-34s %d ran", "generated buckets", runs);
  if (lacks) {
    fprintf(f, ", %d skipped: this CPU lacks", lacks);
    const char *named[16];
    int n = 0;
    for (size_t i = 0; i < uattn_bucket_registry_size; i++) {
      const uattn_bucket_kernels *b = uattn_bucket_registry[i];
      bool seen = b->runs_here();
      for (int k = 0; k < n && !seen; k++) seen = !strcmp(named[k], b->isa);
      if (!seen && n < 16) {
        fprintf(f, "%s %s", n ? "," : "", b->isa);
        named[n++] = b->isa;
      }
    }
  }
  fprintf(f, "\n");
}

ReportHook(POST_ALL)(struct criterion_global_stats *stats) {
  (void)stats;
  isa_report(stderr);
  const char *path = getenv("UATTN_ISA_REPORT");
  FILE *f = path && *path ? fopen(path, "w") : NULL;
  if (f) isa_report(f), fclose(f);
}

/* The ISA ladder the generator writes from gen/manifest.json: best first, each rung a generic set under its own
 * name with its probe, the portable set last and without one; the default is the first rung this CPU runs,
 * and UATTN_ISA names the highest rung to use: the first at or below it that runs, or with UATTN_TWINS the named
 * rung's twin where the CPU lacks the rung and runs the twin. Every bucket belongs to a rung and has its probe, and a rung
 * that shares another's bucket functions names another rung, which shares none. */
Test(kernels, the_isa_ladder_is_the_manifests) {
  cr_assert_geq(uattn_isa_registry_size, 1);
  const uattn_isa *last = &uattn_isa_registry[uattn_isa_registry_size - 1];
  cr_assert(last->set == &uattn_kernels_portable && !last->runs_here, "the portable set is the last rung");
  unsetenv("UATTN_ISA");
  unsetenv("UATTN_TWINS");
  const uattn_kernels *best = NULL;
  for (size_t i = 0; i < uattn_isa_registry_size; i++) {
    const uattn_isa *isa = &uattn_isa_registry[i];
    cr_assert_str_eq(isa->name, isa->set->name);
    cr_assert(isa->runs_here || isa == last, "%s has no probe", isa->name);
    for (size_t j = 0; j < i; j++) cr_assert_str_neq(isa->name, uattn_isa_registry[j].name);
    const bool runs = !isa->runs_here || isa->runs_here();
    if (!best && runs) best = isa->set;
    for (int k = 0; k < 2; k++) { /* the rungs whose bucket functions it shares: others, sharing none */
      const char *from = k ? isa->decodes : isa->shares;
      size_t other = 0;
      while (from && other < uattn_isa_registry_size && strcmp(uattn_isa_registry[other].name, from)) other++;
      cr_assert(!from || (other < uattn_isa_registry_size && other != i && !uattn_isa_registry[other].shares &&
                          !uattn_isa_registry[other].decodes),
                "%s shares %s's bucket functions, not another rung's own", isa->name, from);
    }
    cr_assert_eq(!isa->twin, !isa->twin_runs_here, "%s: a twin and its probe come together", isa->name);
    cr_assert(!isa->twin || (!strcmp(isa->twin->name, isa->name) && isa->twin != isa->set), "%s's twin", isa->name);
  }
  const char *why;
  cr_assert_eq(uattn_kernels_select(&why, NULL), best);
  for (size_t i = 0; i < uattn_isa_registry_size; i++) {
    const uattn_isa *isa = &uattn_isa_registry[i];
    setenv("UATTN_ISA", isa->name, 1);
    size_t below = i;
    while (uattn_isa_registry[below].runs_here && !uattn_isa_registry[below].runs_here()) below++;
    cr_assert_eq(uattn_kernels_select(&why, NULL), uattn_isa_registry[below].set, "UATTN_ISA=%s: %s", isa->name, why);
    setenv("UATTN_TWINS", "1", 1);
    const bool twin = below != i && isa->twin && isa->twin_runs_here();
    cr_assert_eq(uattn_kernels_select(&why, NULL), twin ? isa->twin : uattn_isa_registry[below].set,
                 "UATTN_ISA=%s, UATTN_TWINS=1: %s", isa->name, why);
    unsetenv("UATTN_TWINS");
  }
  unsetenv("UATTN_ISA");
  for (size_t b = 0; b < uattn_bucket_registry_size; b++) {
    const uattn_bucket_kernels *e = uattn_bucket_registry[b];
    size_t i = 0;
    while (i < uattn_isa_registry_size && strcmp(uattn_isa_registry[i].name, e->isa)) i++;
    cr_assert_lt(i, uattn_isa_registry_size, "a bucket of %s, which is not a rung", e->isa);
    cr_assert(e->runs_here == uattn_isa_registry[i].runs_here, "a %s bucket with another probe", e->isa);
    cr_assert_str_eq(e->set.name, e->isa);
  }
}

/* The best set the CPU runs is the default; UATTN_ISA picks another by name (each test is its own process). */
Test(kernels, selection) {
  const char *why;
  unsetenv("UATTN_ISA");
  unsetenv("UATTN_TWINS");
  const uattn_kernels *best = uattn_kernels_select(&why, NULL);
  cr_assert_str_eq(best->name, uattn_amx_runs_here()             ? "amx"
                               : uattn_avx512bf16fma_runs_here() ? "avx512bf16fma"
                               : uattn_avx512bf16_runs_here()    ? "avx512bf16"
                               : uattn_avx512_runs_here()        ? "avx512"
                               : uattn_avx2_runs_here()          ? "avx2"
                                                                 : "portable");
  setenv("UATTN_ISA", "portable", 1);
  cr_assert_str_eq(uattn_kernels_select(&why, NULL)->name, "portable");
  cr_assert_str_eq(why, "forced by UATTN_ISA");
  setenv("UATTN_ISA", "avx2", 1);
  cr_assert_str_eq(uattn_kernels_select(&why, NULL)->name, uattn_avx2_runs_here() ? "avx2" : best->name);
  setenv("UATTN_ISA", "avx512", 1); /* where the CPU lacks it: the best set below it, and why says so */
  cr_assert_str_eq(uattn_kernels_select(&why, NULL)->name, uattn_avx512_runs_here() ? "avx512" : best->name);
  if (!uattn_avx512_runs_here()) cr_assert_str_eq(why, "UATTN_ISA names a level this CPU lacks: the best set below it");
  setenv("UATTN_TWINS", "1", 1); /* the tests' twin where the CPU lacks it and runs the twin */
  const uattn_kernels *k = uattn_kernels_select(&why, NULL);
  if (!uattn_avx512_runs_here() && uattn_avx2_runs_here())
    cr_assert(k == &uattn_kernels_avx512_twin && strstr(why, "exact twin"), "%s", why);
  unsetenv("UATTN_TWINS");
  setenv("UATTN_ISA", "avx512bf16", 1);
  cr_assert_str_eq(uattn_kernels_select(&why, NULL)->name, uattn_avx512bf16_runs_here() ? "avx512bf16" : best->name);
  setenv("UATTN_ISA", "no-such-set", 1);
  cr_assert_eq(uattn_kernels_select(&why, NULL), best);
}
