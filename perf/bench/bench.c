/* uattn-bench: uattn's attention on the scenarios of a serving engine — decode-heavy, prefill, chunked
 * prefill over a long context, a mixed continuous-batching step, a shared prefix, spec-decode verification,
 * long-context decodes — for model presets, each as a fraction of this machine's own limit measured in the
 * same run: read bandwidth for a memory-bound case, fp32 FMA peak for a compute-bound one, with one thread
 * and with all. A compute-bound bf16 case on a CPU with AVX512-BF16 is also given as a fraction of the bf16
 * dot-product peak, the physical limit of bf16 work there. Medians of several runs, each on cold caches.
 *
 *   uattn-bench [--preset NAME[,NAME..]|all] [--scenario NAME-PART] [--runs N] [--threads N]
 *               [--block-size N] [--dtype bf16|f16|f32] [--cache-dtype f32|bf16|f16|fp8_e4m3|fp8_e5m2]
 *               [--layout nhd|hnd|tiled] [--probs-fp32] [--scatter] [--json] [--plot FILE.png] [--list] [--count] */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/limits.h"
#include "bench/plot.h"
#include "bench/scenarios.h"
#include "common/args.h"
#include "common/random.h"
#include "common/tensors.h"
#include "common/timing.h"
#include "convert.h"
#include "uattn.h"

enum { MAX_RUNS = 101, MAX_BLOCK_SIZE = 4096 };

typedef struct options {
  int runs, threads, block_size, json;
  bool count;                     /* --count: each case's work, without running it */
  uattn_dtype dtype, cache_dtype; /* q/k/v/out; the caches (--cache-dtype, default --dtype's) */
  bool cache_dtype_set;
  uattn_kv_layout layout;
  bool probs_fp32;      /* uattn_layer.probs_fp32: P kept in fp32 for P V (the bf16 level rounds it to bf16) */
  bool scatter;         /* the fixed batches' blocks numbered in a shuffled order (bench_step_build) */
  const char *scenario; /* a part of the case names to run; NULL: all */
  const char *plot;
  bool preset[16];
  bool preset_named[16]; /* named in --preset rather than by all */
} options;

/* One thread count's timed runs of a case: each run's seconds, and the read bandwidth the machine had at
 * that moment (GB/s, time_forward). */
typedef struct run_times {
  int n;
  double s[MAX_RUNS], read_gbs[MAX_RUNS];
} run_times;

typedef struct case_result {
  const bench_preset *preset;
  const bench_case *c;
  char what[200];
  bench_work work;
  double ms_1, ms_all; /* medians */
  run_times one, all;
  uattn_kernel_report kernels; /* what served the last all-thread run: a generated bucket or a generic set */
} case_result;

static const char *const layout_names[] = {"NHD", "HND", "TILED"}; /* by uattn_kv_layout */

static int bad_usage(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "uattn-bench: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  return 2;
}

static int parse_presets(const char *s, options *o) {
  if (!strcmp(s, "all")) {
    for (int p = 0; p < bench_num_presets; p++) o->preset[p] = true;
    return 0;
  }
  while (*s) {
    const size_t len = strcspn(s, ",");
    int p = 0;
    while (p < bench_num_presets && (strlen(bench_presets[p].name) != len || strncmp(bench_presets[p].name, s, len)))
      p++;
    if (p == bench_num_presets) return bad_usage("unknown preset '%.*s' (--list shows them)", (int)len, s);
    o->preset[p] = o->preset_named[p] = true;
    s += len + (s[len] == ',');
  }
  return 0;
}

static void print_list(void) {
  printf("scenarios (--scenario matches a part of a case's name):\n");
  for (int i = 0; i < bench_num_cases; i++)
    printf("  %-16s %-24s %s\n",
           i && !strcmp(bench_cases[i].scenario, bench_cases[i - 1].scenario) ? "" : bench_cases[i].scenario,
           bench_cases[i].name, bench_cases[i].what);
  printf("presets (--preset NAME[,NAME..] or all; default %s), each running every case unless it says:\n",
         bench_presets[0].name);
  for (int p = 0; p < bench_num_presets; p++) {
    const bench_preset *b = &bench_presets[p];
    printf("  %-20s %s\n", b->name, b->what);
    if (b->cases == BENCH_CASES_DECODE)
      printf("  %-20s runs the cases without prompt rows (decodes, verifications, the shared prefix)\n", "");
    else if (b->cases == BENCH_CASES_PROMPT)
      printf("  %-20s runs the cases of prompt chunks alone (prefill, chunked prefill, decode-heavy's chunk)\n", "");
  }
}

/* Whether case c's name holds --scenario's text (any case without one). */
static bool scenario_matches(const options *o, int c) {
  return !o->scenario || strstr(bench_cases[c].name, o->scenario);
}

/* Whether case c of preset p is one the options ask for. */
static bool case_chosen(const options *o, int p, int c) {
  return o->preset[p] && bench_preset_runs(&bench_presets[p], &bench_cases[c]) && scenario_matches(o, c);
}

/* Returns -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, options *o) {
  *o = (options){.runs = 5, .block_size = 128, .dtype = UATTN_BF16};
  const char *presets = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    static const char *const with_value[] = {"--runs",   "--threads",  "--block-size", "--dtype", "--cache-dtype",
                                             "--preset", "--scenario", "--case",       "--plot",  "--layout"};
    int takes_value = 0;
    for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++) takes_value |= !strcmp(a, with_value[k]);
    if (takes_value && !v) return bad_usage("%s needs a value", a);
    if (!strcmp(a, "--json"))
      o->json = 1;
    else if (!strcmp(a, "--probs-fp32"))
      o->probs_fp32 = true;
    else if (!strcmp(a, "--scatter"))
      o->scatter = true;
    else if (!strcmp(a, "--list"))
      return print_list(), 0;
    else if (!strcmp(a, "--count"))
      o->count = true;
    else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      printf(
          "usage: uattn-bench [--preset NAME[,NAME..]|all] [--scenario NAME-PART] [--runs N] [--threads N]\n"
          "                   [--block-size N] [--dtype bf16|f16|f32] [--cache-dtype f32|bf16|f16|fp8_e4m3|fp8_e5m2]\n"
          "                   [--layout nhd|hnd|tiled] [--probs-fp32] [--scatter] [--json] [--plot FILE.png] [--list]\n"
          "                   [--count]\n"
          "--dtype: q, k, v and out (default bf16); --cache-dtype: the KV caches (default: --dtype's), whose\n"
          "element size the read bytes count; --probs-fp32: the layers keep P in fp32 for P V (uattn_layer's\n"
          "probs_fp32; the bf16 kernels round it to bf16 by default); --scatter: the fixed batches' blocks in a\n"
          "shuffled order, as an engine's cache holds them after a while (default: numbered as handed out; the\n"
          "serving-trace step's always are shuffled); --count: each case's rows, bytes and flops (what its fractions\n"
          "rest on), planned but not run\n");
      return 0;
    } else if (!strcmp(a, "--runs")) {
      if (perf_parse_int(v, 1, MAX_RUNS, &o->runs)) return bad_usage("--runs wants 1 to %d, not '%s'", MAX_RUNS, v);
    } else if (!strcmp(a, "--threads")) {
      if (perf_parse_int(v, 1, BENCH_LIMITS_MAX_THREADS, &o->threads))
        return bad_usage("--threads wants 1 to %d, not '%s'", BENCH_LIMITS_MAX_THREADS, v);
    } else if (!strcmp(a, "--block-size")) {
      if (perf_parse_int(v, 1, MAX_BLOCK_SIZE, &o->block_size))
        return bad_usage("--block-size wants 1 to %d, not '%s'", MAX_BLOCK_SIZE, v);
    } else if (!strcmp(a, "--dtype")) {
      if (!uattn_dtype_parse(v, false, &o->dtype) || o->dtype > UATTN_F16)
        return bad_usage("--dtype wants bf16, f16 or f32, not '%s'", v);
    } else if (!strcmp(a, "--cache-dtype")) {
      if (!uattn_dtype_parse(v, false, &o->cache_dtype))
        return bad_usage("--cache-dtype wants f32, bf16, f16, fp8_e4m3 or fp8_e5m2, not '%s'", v);
      o->cache_dtype_set = true;
    } else if (!strcmp(a, "--layout")) {
      static const char *const names[] = {"nhd", "hnd", "tiled"}; /* layout_names, as typed */
      int l = 0;
      while (l < 3 && strcmp(v, names[l])) l++;
      if (l == 3) return bad_usage("--layout wants nhd, hnd or tiled, not '%s'", v);
      o->layout = (uattn_kv_layout)l;
    } else if (!strcmp(a, "--preset"))
      presets = v;
    else if (!strcmp(a, "--scenario") || !strcmp(a, "--case"))
      o->scenario = v;
    else if (!strcmp(a, "--plot")) {
      if (!*v || strpbrk(v, "'\"\n\\")) return bad_usage("--plot wants a file name without quotes, not '%s'", v);
      o->plot = v;
    } else
      return bad_usage("unknown option '%s' (--help lists them)", a);
    i += takes_value;
  }
  if (presets) {
    const int rc = parse_presets(presets, o);
    if (rc) return rc;
  } else
    o->preset[0] = true;
  /* a latent has no value rows to tile: a preset named so is refused, and `all` goes on without it */
  for (int p = 0; p < bench_num_presets && o->layout == UATTN_LAYOUT_TILED; p++)
    if (o->preset[p] && bench_presets[p].kv_latent) {
      if (o->preset_named[p])
        return bad_usage("--layout tiled does not go with %s, whose latent cache has no value rows to tile",
                         bench_presets[p].name);
      o->preset[p] = false;
      fprintf(stderr, "uattn-bench: %s left out: --layout tiled has no latent cache\n", bench_presets[p].name);
    }
  if (!o->cache_dtype_set) o->cache_dtype = o->dtype;
  /* the library would refuse every case's forward; say why once, before the machine's limits are measured */
  if (o->layout == UATTN_LAYOUT_TILED && o->block_size % 16)
    return bad_usage("--layout tiled wants a --block-size that is a multiple of 16, not %d", o->block_size);
  int matched = 0, runs = 0;
  for (int i = 0; i < bench_num_cases; i++) {
    matched += scenario_matches(o, i);
    for (int p = 0; p < bench_num_presets; p++) runs += case_chosen(o, p, i);
  }
  if (!matched) return bad_usage("no case's name contains '%s' (--list shows them)", o->scenario);
  if (!runs)
    return bad_usage("the presets chosen run no case whose name contains '%s' (--list says which they run)",
                     o->scenario ? o->scenario : "");
  if (o->plot && !bench_plot_available()) {
    fprintf(stderr,
            "uattn-bench: --plot needs gnuplot, which is not on PATH "
            "(Debian: apt-get install gnuplot-nox, or make deps)\n");
    return 1;
  }
  return -1;
}

/* Random elements of the dtype, magnitudes in [1/16, 1), either sign, drawn as bit patterns (fp8: the
 * exponent field is the bias minus 1..4, the mantissa's bits random; never a NaN). */
static void fill_random(void *x, size_t n, uattn_dtype dt, uint64_t *rng) {
  for (size_t i = 0; i < n; i++) {
    const uint64_t z = perf_random_next(rng);
    const uint32_t sign = (uint32_t)(z >> 63), exponent = (uint32_t)((z >> 60) & 3) + 1; /* 2^-4 .. 2^-1 */
    const uint32_t f32 = sign << 31 | (127 - exponent) << 23 | (uint32_t)(z & 0x7fffff);
    if (dt == UATTN_F32)
      ((uint32_t *)x)[i] = f32;
    else if (dt == UATTN_FP8_E4M3)
      ((uint8_t *)x)[i] = (uint8_t)(sign << 7 | (7 - exponent) << 3 | (uint32_t)(z & 7));
    else if (dt == UATTN_FP8_E5M2)
      ((uint8_t *)x)[i] = (uint8_t)(sign << 7 | (15 - exponent) << 2 | (uint32_t)(z & 3));
    else if (dt == UATTN_BF16)
      ((uint16_t *)x)[i] = (uint16_t)(f32 >> 16);
    else
      ((uint16_t *)x)[i] = (uint16_t)(sign << 15 | (15 - exponent) << 10 | (uint32_t)(z & 0x3ff));
  }
}

static int progress_on;

static void progress(const char *fmt, ...) {
  if (!progress_on) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "\r\033[K");
  vfprintf(stderr, fmt, ap);
  va_end(ap);
}

/* `runs` forwards on rt after one warm-up (page faults, scratch), each on cold caches. Before each run, and
 * after the last, the reader streams its buffer on rt's number of threads: that both evicts the caches and
 * measures the read bandwidth of that moment, and a run's is the faster of the reads just before and just
 * after it. On this project's shared VMs the bandwidth the host leaves moves by 30% or more within a
 * minute, so a memory-bound case is judged against what the machine had while it ran, not only against the
 * best of the run's start. Returns 0, -1 on error. */
static int time_forward(const uattn_plan *plan, const uattn_layer *L, const uattn_tensors *t, uattn_runtime *rt,
                        int threads, int runs, bench_reader *reader, run_times *out) {
  if (uattn_forward(plan, L, t, rt)) return -1;
  double before = bench_read_gbs(reader, threads);
  for (int r = 0; r < runs; r++) {
    const double t0 = perf_seconds();
    if (uattn_forward(plan, L, t, rt)) return -1;
    out->s[r] = perf_seconds() - t0;
    const double after = bench_read_gbs(reader, threads);
    out->read_gbs[r] = before > after ? before : after;
    before = after;
  }
  out->n = runs;
  return 0;
}

typedef struct bench_env {
  const options *o;
  uattn_runtime *one, *all;
  int threads; /* all's */
  bench_reader reader;
} bench_env;

/* A case's step, planned: what a run and a count both start from. On an error, says so and frees what it made. */
static int plan_case(const options *o, const bench_preset *p, const bench_case *c, bench_step *s, uattn_plan **plan) {
  char err[160];
  if (bench_step_build(c, o->block_size, o->scatter, s, err, sizeof err)) {
    fprintf(stderr, "uattn-bench: %s: %s\n", c->name, err);
    return -1;
  }
  const uattn_plan_config pc =
      uattn_plan_config_default(o->block_size, s->num_blocks, s->step.num_reqs, s->max_tokens, s->max_model_len);
  *plan = NULL;
  if (uattn_plan_create(&pc, plan) || uattn_plan_step(*plan, &s->step)) {
    fprintf(stderr, "uattn-bench: %s, %s: %s\n", p->name, c->name, uattn_last_error());
    uattn_plan_destroy(*plan);
    bench_step_free(s);
    return -1;
  }
  return 0;
}

static int run_case(bench_env *env, const bench_preset *p, const bench_case *c, case_result *res) {
  const options *o = env->o;
  char err[160] = "out of memory";
  bench_step s;
  uattn_plan *plan;
  if (plan_case(o, p, c, &s, &plan)) return -1;
  const size_t elem = uattn_dtype_size(o->dtype), bs = (size_t)o->block_size, D = (size_t)p->head_dim;
  const size_t Dv = (size_t)bench_head_dim_v(p), celem = uattn_dtype_size(o->cache_dtype);
  /* a latent layer has neither v nor a value cache: its latents are the key cache's rows */
  const size_t kc_elems = (size_t)s.num_blocks * bs * (size_t)p->hkv * D, T = (size_t)s.max_tokens;
  const size_t vc_elems = p->kv_latent ? 0 : (size_t)s.num_blocks * bs * (size_t)p->hkv * Dv;
  const size_t v_elems = p->kv_latent ? 0 : T * (size_t)p->hkv * Dv;
  void *q = malloc(T * (size_t)p->hq * D * elem), *out = malloc(T * (size_t)p->hq * Dv * elem);
  void *k = malloc(T * (size_t)p->hkv * D * elem), *v = v_elems ? malloc(v_elems * elem) : NULL;
  void *kc = NULL, *vc = NULL; /* on 2 MiB pages, as an engine should give them (the read limit is measured so) */
  int rc = -1;
  if (uattn_cache_alloc(kc_elems * celem, &kc) || (vc_elems && uattn_cache_alloc(vc_elems * celem, &vc))) goto done;
  if (!q || !out || !k || (v_elems && !v)) goto done;
  uint64_t rng = 1;
  fill_random(kc, kc_elems, o->cache_dtype, &rng);
  if (vc) fill_random(vc, vc_elems, o->cache_dtype, &rng);
  fill_random(q, T * (size_t)p->hq * D, o->dtype, &rng);
  fill_random(k, T * (size_t)p->hkv * D, o->dtype, &rng);
  if (v) fill_random(v, v_elems, o->dtype, &rng);
  uattn_layer L = uattn_layer_default(p->hq, p->hkv, p->head_dim, o->dtype);
  L.soft_cap = p->soft_cap;
  L.head_dim_v = p->head_dim_v;
  L.kv_latent = p->kv_latent;
  if (p->scale > 0) L.scale = p->scale;
  L.kv_layout = o->layout;
  L.probs_fp32 = o->probs_fp32;
  L.cache_dtype = o->cache_dtype; /* fp8: k_scale = v_scale = 1 (the default); the values are in range */
  const uattn_tensors t = perf_tensors(q, k, v, kc, vc, s.num_blocks, o->block_size, out);
  if (time_forward(plan, &L, &t, env->one, 1, o->runs, &env->reader, &res->one) ||
      time_forward(plan, &L, &t, env->all, env->threads, o->runs, &env->reader, &res->all) ||
      uattn_last_forward_report(&res->kernels))
    snprintf(err, sizeof err, "%s", uattn_last_error());
  else if (bench_count_work(plan, &s.step, s.num_blocks, p, (int32_t)elem, (int32_t)celem, &res->work) == 0) {
    rc = 0;
    res->ms_1 = perf_median_of(res->one.s, res->one.n) * 1e3;
    res->ms_all = perf_median_of(res->all.s, res->all.n) * 1e3;
  }
  res->preset = p;
  res->c = c;
  snprintf(res->what, sizeof res->what, "%s", s.what);
done:
  if (rc) fprintf(stderr, "uattn-bench: %s, %s: %s\n", p->name, c->name, err);
  uattn_plan_destroy(plan);
  uattn_cache_free(kc, kc_elems * celem), uattn_cache_free(vc, vc_elems * celem);
  free(q), free(out), free(k), free(v);
  bench_step_free(&s);
  return rc;
}

/* --count: each chosen case planned and its work counted (bench_count_work), nothing run or measured. */
static int count_cases(const options *o) {
  const size_t elem = uattn_dtype_size(o->dtype), celem = uattn_dtype_size(o->cache_dtype);
  if (o->json)
    printf("{\"cases\": [");
  else
    printf("%-20s %-24s %6s %12s %12s %12s\n", "preset", "case", "rows", "cache MB", "io MB", "GFLOP");
  int n = 0;
  for (int p = 0; p < bench_num_presets; p++)
    for (int c = 0; c < bench_num_cases; c++) {
      if (!case_chosen(o, p, c)) continue;
      const bench_preset *b = &bench_presets[p];
      bench_step s;
      uattn_plan *plan;
      if (plan_case(o, b, &bench_cases[c], &s, &plan)) return 1;
      bench_work w;
      const int rc = bench_count_work(plan, &s.step, s.num_blocks, b, (int32_t)elem, (int32_t)celem, &w);
      uattn_plan_destroy(plan);
      bench_step_free(&s);
      if (rc) return fprintf(stderr, "uattn-bench: out of memory\n"), 1;
      if (o->json)
        printf(
            "%s\n  {\"preset\": \"%s\", \"scenario\": \"%s\", \"name\": \"%s\", \"tokens\": %d, "
            "\"cache_bytes\": %.0f, \"io_bytes\": %.0f, \"flops\": %.0f}",
            n ? "," : "", b->name, bench_cases[c].scenario, bench_cases[c].name, w.tokens, w.cache_bytes, w.io_bytes,
            w.flops);
      else
        printf("%-20s %-24s %6d %12.2f %12.2f %12.2f\n", b->name, bench_cases[c].name, w.tokens, w.cache_bytes / 1e6,
               w.io_bytes / 1e6, w.flops / 1e9);
      n++;
    }
  if (o->json) printf("]}\n");
  return 0;
}

/* What a result achieved against the limits: a case is memory-bound when moving its bytes at the read
 * bandwidth takes longer than its flops at the FMA peak (all threads, the run's start), and its fraction is
 * of that limit: for a memory-bound case the median over its runs of each run's GB/s over the read
 * bandwidth paired with it (time_forward), for a compute-bound one its median time against the FMA peak.
 * The read fraction is kept for every case (frac_read_*): a decode's target is in bytes whatever its bound
 * (fp8 decodes are compute-bound by this rule), and a run that finds the host's vCPUs on one core's two
 * SMT siblings measures two threads' FMA peak at one core's, which makes that run's decodes compute-bound.
 * A compute-bound bf16 case where the CPU has bf16 dot products is also measured against their peak
 * (bf16_1, bf16_all; -1 elsewhere): the FMA fraction says how it compares with today's fp32 arithmetic,
 * this one how much of the machine it uses. */
typedef struct rates {
  bool memory;
  double gbs_1, gbs_all, gflops_1, gflops_all, frac_1, frac_all, bf16_1, bf16_all;
  double read_1, read_all;           /* the medians of the read bandwidth paired with the runs */
  double frac_read_1, frac_read_all; /* the memory-bound fraction whatever the bound: fp8 decodes are judged so */
} rates;

/* The median over a case's runs of its GB/s over the read bandwidth paired with the run. */
static double paired_fraction(const run_times *t, double bytes) {
  double f[MAX_RUNS];
  for (int r = 0; r < t->n; r++) f[r] = bytes / t->s[r] * 1e-9 / t->read_gbs[r];
  return perf_median(f, t->n);
}

/* Whether the table, the JSON and the plot carry the bf16 dot-peak fractions. */
static bool shows_bf16_dot(const options *o, const bench_limits *lim) {
  return o->dtype == UATTN_BF16 && lim->bf16_dot;
}

static rates rates_of(const options *o, const case_result *r, const bench_limits *lim) {
  const double bytes = r->work.cache_bytes + r->work.io_bytes;
  rates x = {.memory = bytes / lim->read_gbs_all >= r->work.flops / lim->fma_gflops_all,
             .gbs_1 = bytes / r->ms_1 * 1e-6,
             .gbs_all = bytes / r->ms_all * 1e-6,
             .gflops_1 = r->work.flops / r->ms_1 * 1e-6,
             .gflops_all = r->work.flops / r->ms_all * 1e-6,
             .read_1 = perf_median_of(r->one.read_gbs, r->one.n),
             .read_all = perf_median_of(r->all.read_gbs, r->all.n)};
  x.frac_read_1 = paired_fraction(&r->one, bytes), x.frac_read_all = paired_fraction(&r->all, bytes);
  x.frac_1 = x.memory ? x.frac_read_1 : x.gflops_1 / lim->fma_gflops_1;
  x.frac_all = x.memory ? x.frac_read_all : x.gflops_all / lim->fma_gflops_all;
  const bool bf16 = shows_bf16_dot(o, lim) && !x.memory;
  x.bf16_1 = bf16 ? x.gflops_1 / lim->bf16_gflops_1 : -1;
  x.bf16_all = bf16 ? x.gflops_all / lim->bf16_gflops_all : -1;
  return x;
}

static void load_average(char *buf, size_t size) {
  FILE *f = fopen("/proc/loadavg", "r");
  double a = 0, b = 0, c = 0;
  if (f && fscanf(f, "%lf %lf %lf", &a, &b, &c) == 3)
    snprintf(buf, size, "%.2f %.2f %.2f", a, b, c);
  else
    snprintf(buf, size, "unknown");
  if (f) fclose(f);
}

static void print_table(const options *o, const bench_limits *lim, const uattn_topology *topo, const case_result *res,
                        int n, const char *load0, const char *load1) {
  printf(
      "uattn %s, %s kernels, %d threads on %d cores; %s q/k/v, %s caches, block %d%s, %s%s; medians of %d "
      "cold-cache runs\n",
      uattn_version(), uattn_kernel_set(NULL), lim->threads, topo->usable.cores, uattn_dtype_name(o->dtype),
      uattn_dtype_name(o->cache_dtype), o->block_size, o->scatter ? " (scattered)" : "", layout_names[o->layout],
      o->probs_fp32 ? ", fp32 P" : "", o->runs);
  printf(
      "machine (best of %d): read %.1f GB/s on 1 thread, %.1f on %d; fp32 FMA (%d lanes) %.1f GFLOP/s on 1, %.1f "
      "on %d\n",
      o->runs, lim->read_gbs_1, lim->read_gbs_all, lim->threads, lim->fma_lanes, lim->fma_gflops_1, lim->fma_gflops_all,
      lim->threads);
  if (lim->bf16_dot)
    printf("bf16 dot peak (vdpbf16ps, best of %d): %.1f GFLOP/s on 1 thread, %.1f on %d (%.2fx the fp32 FMA peak)\n",
           o->runs, lim->bf16_gflops_1, lim->bf16_gflops_all, lim->threads, lim->bf16_gflops_all / lim->fma_gflops_all);
  else
    printf("bf16 dot peak: n/a (no AVX512-BF16)\n");
  if (lim->amx) /* a line only where the CPU has AMX and the OS grants the tiles: a plain absence elsewhere */
    printf("AMX bf16 peak (tdpbf16ps, best of %d): %.1f GFLOP/s on 1 thread, %.1f on %d (%.2fx the fp32 FMA peak)\n",
           o->runs, lim->amx_gflops_1, lim->amx_gflops_all, lim->threads, lim->amx_gflops_all / lim->fma_gflops_all);
  printf("load average: %s at the start, %s at the end\n", load0, load1);
  const bool dot = shows_bf16_dot(o, lim);
  const bench_preset *last = NULL;
  for (int i = 0; i < n; i++) {
    const case_result *r = &res[i];
    if (r->preset != last) {
      printf("\n%s\n  %-24s %6s %7s %9s %9s %7s %8s %9s %7s %7s", r->preset->what, "case", "tokens", "bound",
             "1 thr ms", "all ms", "GB/s", "GFLOP/s", "read", "of lim1", "of lim");
      if (dot) printf(" %7s %7s", "of dot1", "of dot");
      printf(" %7s %8s\n", "speedup", "kernels");
      last = r->preset;
    }
    const rates x = rates_of(o, r, lim);
    char read[32];
    snprintf(read, sizeof read, "%.1f/%.1f", x.read_1, x.read_all);
    printf("  %-24s %6d %7s %9.2f %9.2f %7.1f %8.1f %9s %6.0f%% %6.0f%%", r->c->name, r->work.tokens,
           x.memory ? "memory" : "compute", r->ms_1, r->ms_all, x.gbs_all, x.gflops_all, read, 100 * x.frac_1,
           100 * x.frac_all);
    if (dot && x.bf16_1 >= 0)
      printf(" %6.0f%% %6.0f%%", 100 * x.bf16_1, 100 * x.bf16_all);
    else if (dot)
      printf(" %7s %7s", "-", "-");
    printf(" %6.2fx %8s\n", r->ms_1 / r->ms_all, r->kernels.bucket_hit ? "bucket" : "generic");
  }
  printf(
      "\nbytes: each distinct cache block a step reads, once per KV head (the keys it uses), plus q, k, v, out\n"
      "and the new keys and values written; flops: 4 x head_dim per visible query-key pair and query head.\n"
      "GB/s and GFLOP/s with all threads; 'of lim1' and 'of lim': of the bound's limit on 1 thread and on all.\n"
      "'read': the read bandwidth (GB/s, 1 thread / all) measured next to each timed run, the faster of the\n"
      "reads just before and after it (medians); a memory-bound case's fraction is the median of its runs'\n"
      "fractions of their own (the machine line's best of the start decides only which bound a case has).\n");
  if (dot)
    printf(
        "'of dot1' and 'of dot': a compute-bound case's GFLOP/s against the bf16 dot peak on 1 thread and on all\n"
        "(its limit for bf16 work; 'of lim' is against the fp32 FMA peak).\n");
  bool mla = false; /* values of another width, or a latent cache: their counts differ from the lines above */
  for (int i = 0; i < n; i++) mla |= res[i].preset->head_dim_v > 0 || res[i].preset->kv_latent;
  if (mla)
    printf(
        "MLA presets: flops 2 x (head_dim + head_dim_v) per pair and query head; a latent cache's bytes one row of\n"
        "head_dim per key and KV head (its first head_dim_v dims are the value), with no v and no value cache.\n");
  for (int i = 0; i < n; i++) /* a layer's kernels depend on its preset only: once per preset */
    if (!res[i].kernels.bucket_hit && (i == 0 || res[i - 1].preset != res[i].preset))
      printf("%s, generic kernels: %s\n", res[i].preset->name, res[i].kernels.reason);
  for (int i = 0; i < n; i++) /* the trace's step depends on the block size only: once is enough */
    if (res[i].c->from_trace) {
      printf("%s: %s\n", res[i].c->name, res[i].what);
      break;
    }
}

/* v in JSON: the number (fmt) when it is known, else null. */
static const char *json_number(char *buf, size_t size, const char *fmt, double v, bool known) {
  if (known)
    snprintf(buf, size, fmt, v);
  else
    snprintf(buf, size, "null");
  return buf;
}

static void print_json(const options *o, const bench_limits *lim, const case_result *res, int n, const char *load0,
                       const char *load1) {
  char b1[32], b2[32], a1[32], a2[32];
  printf(
      "{\"uattn\": \"%s\", \"kernel_set\": \"%s\", \"threads\": %d, \"runs\": %d, \"dtype\": \"%s\", "
      "\"cache_dtype\": \"%s\", \"block_size\": %d, \"scatter\": %s, \"layout\": \"%s\", \"probs_fp32\": %s, "
      "\"load_average\": [\"%s\", \"%s\"],\n "
      "\"limits\": {\"read_gbs_1\": "
      "%.2f, "
      "\"read_gbs_all\": %.2f, \"fma_lanes\": %d, \"fma_gflops_1\": %.2f, \"fma_gflops_all\": %.2f, \"bf16_dot\": %s, "
      "\"bf16_dot_gflops_1\": %s, "
      "\"bf16_dot_gflops_all\": %s, \"amx\": %s, \"amx_gflops_1\": %s, \"amx_gflops_all\": %s},\n \"cases\": [",
      uattn_version(), uattn_kernel_set(NULL), lim->threads, o->runs, uattn_dtype_name(o->dtype),
      uattn_dtype_name(o->cache_dtype), o->block_size, o->scatter ? "true" : "false", layout_names[o->layout],
      o->probs_fp32 ? "true" : "false", load0, load1, lim->read_gbs_1, lim->read_gbs_all, lim->fma_lanes,
      lim->fma_gflops_1, lim->fma_gflops_all, lim->bf16_dot ? "true" : "false",
      json_number(b1, sizeof b1, "%.2f", lim->bf16_gflops_1, lim->bf16_dot),
      json_number(b2, sizeof b2, "%.2f", lim->bf16_gflops_all, lim->bf16_dot), lim->amx ? "true" : "false",
      json_number(a1, sizeof a1, "%.2f", lim->amx_gflops_1, lim->amx),
      json_number(a2, sizeof a2, "%.2f", lim->amx_gflops_all, lim->amx));
  for (int i = 0; i < n; i++) {
    const case_result *r = &res[i];
    const rates x = rates_of(o, r, lim);
    printf(
        "%s\n  {\"preset\": \"%s\", \"scenario\": \"%s\", \"name\": \"%s\", \"what\": \"%s\", \"tokens\": %d, "
        "\"cache_bytes\": %.0f, \"io_bytes\": %.0f, \"flops\": %.0f, \"bound\": \"%s\", \"ms_1\": %.4f, "
        "\"ms_all\": %.4f, \"gbs_1\": %.2f, \"gbs_all\": %.2f, \"gflops_1\": %.2f, \"gflops_all\": %.2f, "
        "\"read_gbs_paired_1\": %.2f, \"read_gbs_paired_all\": %.2f, \"fraction_read_1\": %.4f, "
        "\"fraction_read_all\": %.4f, "
        "\"fraction_1\": %.4f, \"fraction_all\": %.4f, \"fraction_bf16_dot_1\": %s, "
        "\"fraction_bf16_dot_all\": %s, \"speedup\": %.3f, \"bucket_hit\": %s, "
        "\"kernels\": [\"%s\", \"%s\", \"%s\"], \"kernel_reason\": \"%s\"}",
        i ? "," : "", r->preset->name, r->c->scenario, r->c->name, r->what, r->work.tokens, r->work.cache_bytes,
        r->work.io_bytes, r->work.flops, x.memory ? "memory" : "compute", r->ms_1, r->ms_all, x.gbs_1, x.gbs_all,
        x.gflops_1, x.gflops_all, x.read_1, x.read_all, x.frac_read_1, x.frac_read_all, x.frac_1, x.frac_all,
        json_number(b1, sizeof b1, "%.4f", x.bf16_1, x.bf16_1 >= 0),
        json_number(b2, sizeof b2, "%.4f", x.bf16_all, x.bf16_all >= 0), r->ms_1 / r->ms_all,
        r->kernels.bucket_hit ? "true" : "false", r->kernels.part_kernel[0], r->kernels.part_kernel[1],
        r->kernels.part_kernel[2], r->kernels.reason);
  }
  printf("]}\n");
}

static int plot(const options *o, const bench_limits *lim, const case_result *res, int n) {
  bench_bar *bars = calloc((size_t)n, sizeof *bars);
  char(*labels)[96] = calloc((size_t)n, sizeof *labels);
  int rc = -1;
  if (bars && labels) {
    for (int i = 0; i < n; i++) {
      const rates x = rates_of(o, &res[i], lim);
      const bool one_preset = res[0].preset == res[n - 1].preset; /* then the title names it */
      snprintf(labels[i], sizeof labels[i], "%s%s%s (%s)", one_preset ? "" : res[i].preset->name, one_preset ? "" : " ",
               res[i].c->name, x.memory ? "mem" : "fma");
      bars[i] = (bench_bar){labels[i], x.frac_1, x.frac_all, x.bf16_1, x.bf16_all};
    }
    char title[384];
    snprintf(title, sizeof title,
             "uattn %s%s%s: fraction of read bandwidth (mem) or fp32 FMA peak (fma); 1 thread and %d, %s, block %d%s",
             uattn_version(), res[0].preset == res[n - 1].preset ? ", " : "",
             res[0].preset == res[n - 1].preset ? res[0].preset->name : "", lim->threads, uattn_dtype_name(o->dtype),
             o->block_size,
             shows_bf16_dot(o, lim)   ? "\\nlight bars: the compute-bound cases against the bf16 dot peak"
             : o->dtype == UATTN_BF16 ? "\\nbf16 dot peak: n/a (no AVX512-BF16)"
                                      : "");
    rc = bench_plot(o->plot, title, bars, n);
  } else
    fprintf(stderr, "uattn-bench: out of memory\n");
  free(bars), free(labels);
  return rc;
}

int main(int argc, char **argv) {
  options o;
  const int parsed = parse_args(argc, argv, &o);
  if (parsed >= 0) return parsed;
  progress_on = isatty(STDERR_FILENO);
  if (o.count) return count_cases(&o);

  bench_env env = {.o = &o};
  uattn_runtime_config one_cfg = uattn_runtime_config_default(), all_cfg = uattn_runtime_config_default();
  one_cfg.num_threads = 1;
  all_cfg.num_threads = o.threads; /* 0: $UATTN_NUM_THREADS, else one per core */
  uattn_topology topo;
  if (uattn_runtime_create(&one_cfg, &env.one) || uattn_runtime_create(&all_cfg, &env.all) ||
      uattn_runtime_get_topology(env.all, &topo)) {
    fprintf(stderr, "uattn-bench: %s\n", uattn_last_error());
    return 1;
  }
  const size_t l3 = topo.l3_bytes ? topo.l3_bytes : (size_t)32 << 20;
  case_result *res = calloc((size_t)bench_num_presets * bench_num_cases, sizeof *res);
  bench_limits lim;
  char load0[64], load1[64];
  load_average(load0, sizeof load0);
  progress("uattn-bench: measuring the machine's limits");
  const int threads = topo.num_workers < BENCH_LIMITS_MAX_THREADS ? topo.num_workers : BENCH_LIMITS_MAX_THREADS;
  env.threads = threads;
  if (!res || bench_reader_init(&env.reader, 4 * l3 > ((size_t)256 << 20) ? 4 * l3 : (size_t)256 << 20) ||
      bench_measure_limits(&env.reader, threads, o.runs, &lim)) {
    fprintf(stderr, "uattn-bench: out of memory\n");
    return 1;
  }

  int todo = 0, n = 0;
  for (int p = 0; p < bench_num_presets; p++)
    for (int c = 0; c < bench_num_cases; c++) todo += case_chosen(&o, p, c);
  for (int p = 0; p < bench_num_presets; p++)
    for (int c = 0; c < bench_num_cases; c++) {
      if (!case_chosen(&o, p, c)) continue;
      progress("uattn-bench: %d/%d %s %s", n + 1, todo, bench_presets[p].name, bench_cases[c].name);
      if (run_case(&env, &bench_presets[p], &bench_cases[c], &res[n])) return 1;
      n++;
    }
  progress("");
  load_average(load1, sizeof load1);

  if (o.json)
    print_json(&o, &lim, res, n, load0, load1);
  else
    print_table(&o, &lim, &topo, res, n, load0, load1);
  const int rc = o.plot && plot(&o, &lim, res, n) ? 1 : 0;
  bench_reader_free(&env.reader);
  free(res);
  uattn_runtime_destroy(env.one);
  uattn_runtime_destroy(env.all);
  return rc;
}
