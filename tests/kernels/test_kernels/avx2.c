/* The avx2 set against the portable set on random jobs: its attend, its libxsmm body (also bit for bit the
 * fused kernel, pinned to AVX2 code, its JIT kernels in the perf map), and its decode kernel over one block, a
 * list of blocks, every fp8 code and its specials, and several heads; its TILED decode kernel. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "avx2/avx2.h"
#include "avx2/xsmm.h"
#include "jobs.h"
#include "portable/portable.h"

Test(kernels, avx2_attend_matches_portable_on_random_jobs, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  /* $UATTN_TEST_KERNEL_CASES: more (a soak) or fewer */
  const char *env = getenv("UATTN_TEST_KERNEL_CASES");
  const case_limits any = {0};
  check_set_on_random_jobs(&uattn_kernels_avx2, UATTN_PART_SHARED, "avx2", &any, env ? atoi(env) : 3000 / SPARSE,
                           20240611);
}

/* ---- the libxsmm body ----------------------------------------------------------------------------------- */

static void need_xsmm(void) {
  need_avx2();
  if (!uattn_xsmm_runs_here()) cr_skip_test("libxsmm is not built in, or JITs nothing on this CPU");
}

/* The libxsmm GEMM body on every job, whatever its size (the avx2 set and the buckets hand it only large
 * ones; the bucket tests above cover that choice): mostly large jobs, then any shape. */
Test(kernels, xsmm_attend_matches_portable_on_random_jobs, .timeout = KERNEL_TEST_TIMEOUT) {
  need_xsmm();
  const case_limits large = {.large = true}, any = {0};
  check_set_on_random_jobs(&uattn_kernels_xsmm, UATTN_PART_SHARED, "xsmm (large jobs)", &large, 800 / SPARSE, 20240612);
  check_set_on_random_jobs(&uattn_kernels_xsmm, UATTN_PART_SHARED, "xsmm (any job)", &any, 800 / SPARSE, 20240613);
}

/* Where every block of the fused kernel has 4 vectors or more (one FMA chain per accumulator), the libxsmm
 * body computes the same bits: its S is summed in the same DB-dim pieces, each one chain in dim order (as
 * libxsmm's NN kernels run k), and its P V is one chain over keys on top of alpha o. So handing a job to one
 * or the other (uattn_xsmm_wins) never changes a result. Jobs of 8 vectors or more (n = 7 splits 4 + 3). */
Test(kernels, xsmm_attend_is_bitwise_the_fused_kernel_on_large_jobs, .timeout = KERNEL_TEST_TIMEOUT) {
  need_xsmm();
  const case_limits large = {.large = true};
  check_sets_same_bits(&uattn_kernels_avx2_fused, &uattn_kernels_xsmm, UATTN_PART_SHARED, &large, 300 / SPARSE, 4242,
                       "the libxsmm body differs from the fused one");
}

/* The libxsmm body pins libxsmm to AVX2 code, whatever the CPU offers: on an AVX-512 CPU libxsmm would JIT
 * AVX-512 kernels by itself, and the test above would find other bits. LIBXSMM_TARGET asks for more; the pin
 * still wins (libxsmm reads the variable at its first use, in this process: each test is a fresh child). */
Test(kernels, xsmm_body_generates_avx2_code_on_every_cpu, .timeout = KERNEL_TEST_TIMEOUT) {
  setenv("LIBXSMM_TARGET", "cpx", 1);
  need_xsmm();
  cr_assert_str_eq(uattn_xsmm_target(), "hsw", "libxsmm generates %s code for the body, not AVX2 (hsw)",
                   uattn_xsmm_target());
}

/* UATTN_PERF_MAP=1: every JIT kernel the body dispatches is listed in /tmp/perf-<pid>.map as
 * "START SIZE libxsmm_smm_m<M>_n<N>_k<K>_beta<B>", START inside an executable mapping of the process. */
Test(kernels, xsmm_perf_map_lists_the_jit_kernels, .timeout = KERNEL_TEST_TIMEOUT) {
  char path[64];
  snprintf(path, sizeof path, "/tmp/perf-%ld.map", (long)getpid());
  remove(path);
  setenv("UATTN_PERF_MAP", "1", 1); /* read at the first dispatch: before need_xsmm's probe */
  need_xsmm();
  test_rng rng = {99};
  job_case c; /* head dim 77: a shape no test before it used in this process, so its kernels are new here */
  make_case(&c, &rng, &(case_limits){.head_dim = 77, .large = true});
  for (int32_t r = 0; r < c.rows; r++) c.visible[r] = c.count; /* every vector sees every key loaded */
  c.window = 0;
  job_result r = run_set(&uattn_kernels_xsmm, UATTN_PART_SHARED, &c);
  free_result(&r);
  free_case(&c);
  FILE *f = fopen(path, "r");
  cr_assert(f, "no %s", path);
  char line[256];
  int entries = 0, qk = 0, pv = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long start, size;
    int m, n, k, beta, used = 0;
    cr_assert(sscanf(line, "%lx %lx libxsmm_smm_m%d_n%d_k%d_beta%d%n", &start, &size, &m, &n, &k, &beta, &used) == 6 &&
                  line[used] == '\n',
              "a malformed line: %s", line);
    cr_assert(size > 0 && m > 0 && n > 0 && k > 0 && (beta == 0 || beta == 1), "%s", line);
    qk += beta == 0 && k == 77 % 32, pv += beta == 1 && m == 77; /* the last 13-dim piece of S; P V */
    /* the kernel lies in an executable mapping */
    FILE *maps = fopen("/proc/self/maps", "r");
    char ml[512];
    bool exec = false;
    while (maps && fgets(ml, sizeof ml, maps)) {
      unsigned long lo, hi;
      char perms[8];
      if (sscanf(ml, "%lx-%lx %7s", &lo, &hi, perms) == 3 && start >= lo && start + size <= hi && perms[2] == 'x')
        exec = true;
    }
    if (maps) fclose(maps);
    cr_assert(exec, "%s: not in an executable mapping", line);
    entries++;
  }
  fclose(f);
  remove(path);
  cr_assert(qk > 0 && pv > 0, "%d entries, %d for S, %d for P V", entries, qk, pv);
}

/* The decode kernel (a few rows straight from the cache) on jobs of every shape it takes: one row half the
 * time, else up to UATTN_DECODE_MAX_VECTORS vectors. */
Test(kernels, avx2_decode_matches_portable_on_random_jobs, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  const case_limits few_rows = {.decode = true};
  check_set_on_random_jobs(&uattn_kernels_avx2, UATTN_PART_UNIQUE, "avx2 decode", &few_rows, 1500 / SPARSE, 20261121);
}

/* The decode kernel over a list of blocks (uattn_decode_src: a request's blocks wherever the cache holds
 * them): against the portable set, and bit for bit what it computes on the same keys in one block (it walks
 * a list as one stretch of keys, its P V tiles never straddling two blocks). */
Test(kernels, avx2_decode_over_a_list_of_blocks_is_the_one_block_bit_for_bit, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  const case_limits lists = {.decode = true, .list = true};
  check_set_on_random_jobs(&uattn_kernels_avx2, UATTN_PART_UNIQUE, "avx2 decode, a list of blocks", &lists,
                           1000 / SPARSE, 20261201);
  check_list_is_one_block(&uattn_kernels_avx2, &lists, 1000 / SPARSE, 20261202, "avx2 decode");
}

/* The decode kernels on fp8 caches of every code, rows and TILED: the avx2 kernels widen 32 codes at a time
 * into quarters and fold the formats' rebias into the queries, P, the scores and the outputs
 * (common/decode8.h, avx2/decode_tiled.h), which is exact only while they stay in f32's normal range: queries
 * of 2^76 at a dim (too large to fold) take their unfolded paths. The bound and the fp64 oracle are
 * check_set_on_random_jobs'. */
Test(kernels, avx2_decode_reads_every_fp8_code, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  for (int tiled = 0; tiled < 2; tiled++) {
    const case_limits codes = {.decode = true, .every_code = true, .tiled = tiled};
    check_set_on_random_jobs(&uattn_kernels_avx2, UATTN_PART_UNIQUE,
                             tiled ? "avx2 tiled decode, every fp8 code" : "avx2 decode, every fp8 code", &codes,
                             (tiled ? 400 : 800) / SPARSE, 20261129 + (uint64_t)tiled * 100);
  }
}

/* Codes with every exponent bit set (E4M3's NaN; E5M2's infinities and NaN) among them: each output the
 * portable set makes NaN or infinite, the decode kernel makes the same (a NaN key makes its vectors' rows
 * NaN, a NaN value its dim; an infinite score or value infinite outputs, or NaN ones), the rest within 1e-5
 * of the format's largest value (a sum of values up to 57344 in another order); on rows (tiled false) and on
 * a TILED block. */
static void check_fp8_specials(bool tiled, uint64_t seed) {
  const case_limits specials = {.decode = true, .every_code = true, .specials = true, .tiled = tiled};
  test_rng rng = {seed};
  int nan_outputs = 0, inf_outputs = 0;
  for (int i = 0; i < 600; i++) { /* not thinned in sanitized builds: these 600 make the infinite outputs */
    job_case c;
    make_case(&c, &rng, &specials);
    job_result ref = run_set(&uattn_kernels_portable, UATTN_PART_UNIQUE, &c),
               got = run_set(&uattn_kernels_avx2, UATTN_PART_UNIQUE, &c);
    const size_t nx = (size_t)c.rows * c.group;
    for (size_t k = 0; k < nx * c.D; k++) {
      if (!kept_dim(&c, k)) continue; /* past the job's value_dim: no set need compute it */
      const float r = ref.o[k] / ref.l[k / c.D], g = got.o[k] / got.l[k / c.D];
      nan_outputs += isnan(r) != 0, inf_outputs += isinf(r) != 0; /* glibc's isinf is -1 at -inf */
      if (isnan(r) || isinf(r)) {
        cr_assert(isnan(r) ? isnan(g) : g == r, "case %d (%s, D %d), output %zu: %g where the portable set has %g", i,
                  uattn_dtype_name(c.dtype), c.D, k, (double)g, (double)r);
        continue;
      }
      const double largest = c.dtype == UATTN_FP8_E4M3 ? 448 : 57344; /* the values' largest finite code */
      cr_assert(fabs((double)g - r) <= 1e-5 * largest, "case %d (%s, D %d), output %zu: %.9g, portable %.9g", i,
                uattn_dtype_name(c.dtype), c.D, k, (double)g, (double)r);
    }
    free_result(&ref), free_result(&got);
    free_case(&c);
  }
  fprintf(stderr, "avx2 %sdecode on fp8 specials: %d NaN and %d infinite outputs, each as the portable set's\n",
          tiled ? "tiled " : "", nan_outputs, inf_outputs);
  cr_assert(nan_outputs > 0 && inf_outputs > 0, "the cases made %d NaN and %d infinite outputs", nan_outputs,
            inf_outputs);
}

Test(kernels, avx2_decode_keeps_fp8_specials, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  check_fp8_specials(false, 20261130);
  check_fp8_specials(true, 20261131);
}

Test(kernels, avx2_decode_over_several_heads_is_each_head_alone, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  const case_limits few_rows = {.decode = true};
  check_decode_heads(&uattn_kernels_avx2, "avx2 decode", &few_rows, 400 / SPARSE, 20261122);
}

/* Its decode kernel on a TILED cache (avx2/decode_tiled.h): against the portable set on bf16 and fp8 blocks
 * with NaN in the slots past the keys (tiled_copy), and over several heads. */
Test(kernels, avx2_tiled_decode_matches_portable_on_random_jobs, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  for (int fp8 = 0; fp8 < 2; fp8++) {
    const case_limits lim = {.decode = true, .bf16 = true, .fp8 = fp8, .tiled = true};
    check_set_on_random_jobs(&uattn_kernels_avx2, UATTN_PART_UNIQUE,
                             fp8 ? "avx2 tiled decode, fp8 cache" : "avx2 tiled decode", &lim, 1200 / SPARSE,
                             20261207 + (uint64_t)fp8);
  }
}

Test(kernels, avx2_tiled_decode_over_several_heads_is_each_head_alone, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  for (int fp8 = 0; fp8 < 2; fp8++) {
    const case_limits lim = {.decode = true, .bf16 = true, .fp8 = fp8, .tiled = true};
    check_decode_heads(&uattn_kernels_avx2, fp8 ? "avx2 tiled decode, fp8 cache" : "avx2 tiled decode", &lim,
                       400 / SPARSE, 20261209 + (uint64_t)fp8);
  }
}
