/* uattn-kernel-bench: the kernel sets' load and attend on one thread, portable against avx2 (or, with
 * --bucket, a generated bucket against the generic set of its ISA), on one bucket's shape (head dim, block
 * size, cache dtype; by default bf16, block size 128, head dim 128) and the shapes the forward hands the
 * kernels there: a decode (1 row x 4 heads of a KV head against a cache block; also MHA and GQA 8),
 * spec-decode verification (4 rows), a prefill tile (128 rows x 4 heads against a block, all visible or
 * causal) and the forward's causal slice (512 x 4 against 512 keys). Attend is reported in GFLOP/s (4 x
 * head_dim flops per visible query-key pair and head) and against this core's fp32 FMA peak, measured in the
 * same run; load in GB/s of cache bytes read (one head of a block, keys and values), hot (the same block
 * again) and cold (a different block of two 256 MiB NHD or HND caches each call). Medians of RUNS runs of at
 * least 20 ms each, the two sets' runs interleaved; the speedup is the median of the runs' ratios (each pair of
 * runs saw the same machine), with their quartiles.
 *
 * --bucket [DTYPE:BLOCK_SIZE:HEAD_DIM:CHUNK_SIZE[:ISA]]: the bucket to time, from the build's registry (gen/:
 * the best ISA this CPU runs unless one is named; default bf16:128:128:0, the shape kernel_variant.c builds);
 * one that was not generated is refused with the list of those that were. Alone, the bucket against its ISA's
 * generic set; with --decode or --variant, the bucket they time.
 *
 * --xsmm: the avx2 set's fused register-tile attend against the libxsmm GEMM body (kernels/avx2/xsmm.c) on the
 * large jobs it is for (prefill tiles, causal slices, shared blocks of grouped decodes: query vectors x keys),
 * in GFLOP/s and % of the FMA peak: what UATTN_XSMM_MIN_VECTORS / _KEYS (kernels/avx2/xsmm.h) are chosen from;
 * then the body's two products alone on one full block, operands hot: the ceiling of its attend.
 *
 * --decode: the decode kernel the forward runs on the bucket's shape (the bucket's; without --bucket, where
 * the default bucket was not generated, the generic avx2 set's: a few rows straight from the cache, every KV
 * head of a call's blocks in one call on NHD, as the forward's all-heads unit, and a call a head on HND;
 * a call takes a list of 256 keys' blocks where the block size allows, as the forward's) on 1, 2 and 4 rows
 * of GQA 4, in ns per key and KV head: hot (the same blocks again and again), cold (a walk over a 256 MiB
 * cache, its blocks scattered) and a plain read of the same walk, interleaved, and cold at one block a call
 * where calls take lists. Hot against the FMA peak says how fast its compute is; the read against cold, what
 * share of the bandwidth it reaches; cold against hot + read, how much of the memory time it hides.
 *
 * --decode-layouts: that decode kernel's cold walk over the same blocks in three layouts (NHD in one call a
 * block, HND and a head-major layout with each head's keys then its values, one call a head), against a
 * plain read and the kernel hot, 1 and 2 rows of GQA 4: what a layout of uattn's own would buy the memory
 * side before anyone builds one (DESIGN: allowed beside NHD and HND where it pays); where the set has a
 * decode_tiled, it hot and cold on the blocks as a TILED cache (and with --variant, the variant's beside it).
 *
 * --variant: the bucket (A) against the same bucket compiled from the kernel code of the build option
 * UATTN_KERNEL_VARIANT (B, perf/kernel_bench/kernel_variant*.c: the bf16 b128 d128 bucket of avx2 and of
 * avx512bf16, the one of A's ISA; by default kernels/ itself, which shows the noise floor):
 * attend and load as --bucket does, or with --decode the two decode kernels, hot and cold, with B's speedup. On
 * a shared host whose speed drifts by tens of % within minutes, this is how a change of a few % is seen at all:
 * one process, pinned (taskset -c 1), 31 runs or more.
 *
 * --cpu-time: time with the thread's CPU clock instead of the wall clock (a loaded shared host).
 *
 *   uattn-kernel-bench [RUNS] [--bucket [SPEC]] [--decode] [--variant] [--cpu-time]
 *   uattn-kernel-bench [RUNS] [--bucket [SPEC]] --decode-layouts [--variant] [--cpu-time]
 *   uattn-kernel-bench [RUNS] --xsmm [--cpu-time]          (RUNS: timed runs per figure, 7 by default) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "avx2/avx2.h"
#include "convert.h"
#include "kernels.h"
#include "portable/portable.h"
#include "common/random.h"
#include "common/timing.h"
#include "avx2/xsmm.h"
#include "avx512bf16/avx512bf16.h"
#include "common/args.h"
#include "common/probe.h"
#include "kernel_bench/kernel_bench.h"

enum { MAX_KEYS = 512, MAX_RUNS = 64 };

/* The bucket's shape (kernel_bench.h); main sets it. */
int32_t head_dim, block_keys;
uattn_dtype cache_dtype;
long cold_blocks;

/* The buckets --variant builds from UATTN_KERNEL_VARIANT's sources (perf/kernel_bench/kernel_variant*.c): the
 * bf16 b128 d128 bucket of avx2 (the shape timed by default) and of avx512bf16. */
extern const uattn_bucket_kernels uattn_variant_bucket, uattn_variant_bucket_avx512bf16;
static const uattn_bucket_kernels *const variant_buckets[] = {&uattn_variant_bucket, &uattn_variant_bucket_avx512bf16};

static int runs = 7;
static int cpu_time; /* --cpu-time: the thread's CPU time, not the wall clock */

static uint64_t rng = 42;
float random_unit(void) { return (float)(perf_random_next(&rng) >> 40) * 0x1.0p-24f * 2.0f - 1.0f; }

/* perf_time_interleaved on this tool's runs and clock (--cpu-time: the thread's CPU time, which on a shared
 * host leaves out the time it waits for a core). */
void time_interleaved(void (*fn)(void *, long), int n, void *const arg[], double seconds[],
                      double (*raw)[PERF_MAX_RUNS]) {
  perf_time_interleaved(fn, n, arg, runs, cpu_time ? perf_thread_cpu_seconds : perf_seconds, seconds, raw);
}

/* The quartiles of a's time over b's (b's speedup), run by run: interleaved runs saw the same machine, so
 * their ratios spread far less than either time does. */
void speedup_quartiles(const double *a, const double *b, double q[3]) {
  double r[PERF_MAX_RUNS];
  for (int i = 0; i < runs; i++) r[i] = a[i] / b[i];
  perf_quartiles(r, runs, q);
}

/* time_interleaved for two cases, and the quartiles of the second's speedup over the first (the first's time
 * over the second's, run by run), or NULL. */
static void time_both(void (*fn)(void *, long), void *const arg[2], double seconds[2], double speedup[3]) {
  double raw[2][PERF_MAX_RUNS];
  time_interleaved(fn, 2, arg, seconds, raw);
  if (speedup) speedup_quartiles(raw[0], raw[1], speedup);
}

/* ---- the machine: fp32 FMA peak of one core ------------------------------------------------------------ */

enum { FMA_ITERS = 100000 };

/* uattn-bench's probe (common/probe.h) on ymm, a call at a time for time_both. */
static void fma_loop(void *arg, long call) {
  (void)call;
  ((double *)arg)[0] += bench_probe_fma(FMA_ITERS, 8);
}

/* ---- attend ----------------------------------------------------------------------------------------------- */

typedef struct attend_case {
  const uattn_kernels *set;
  uattn_panel_job job;
  float *keys, *values;
} attend_case;

static void run_attend(void *arg, long call) {
  (void)call;
  const attend_case *c = arg;
  c->set->attend[c->job.rows == 1 ? UATTN_PART_UNIQUE : UATTN_PART_SHARED](&c->job, c->job.num_keys);
}

/* A cache of n random elements of the bucket's dtype, made 1024 at a time, on the memory an engine should give
 * its caches (uattn_cache_alloc: 2 MiB pages, as uattn-bench's; on 4 KiB pages a cold walk's page walks were
 * part of what it timed). Free with free_cache(c, n). */
void *random_cache(size_t n) {
  const size_t esz = uattn_dtype_size(cache_dtype);
  void *mem = NULL;
  if (uattn_cache_alloc(n * esz, &mem) != UATTN_OK) {
    fprintf(stderr, "uattn-kernel-bench: %s\n", uattn_last_error());
    exit(1);
  }
  char *c = mem;
  float f[1024];
  for (size_t i = 0; i < n; i += 1024) {
    const size_t m = n - i < 1024 ? n - i : 1024;
    for (size_t j = 0; j < m; j++) f[j] = random_unit();
    uattn_narrow(cache_dtype, f, c + i * esz, m);
  }
  return c;
}

void free_cache(void *c, size_t n) { uattn_cache_free(c, n * uattn_dtype_size(cache_dtype)); }

/* GFLOP/s of each set's attend on rows x group query vectors against a panel of `keys` loaded from the cache;
 * causal: row r sees r + 1 keys (else all). */
static void bench_attend(const uattn_kernels *const set[2], int32_t rows, int32_t group, int32_t keys, int causal,
                         double gflops[2], double speedup[3]) {
  const size_t n = (size_t)keys * head_dim, nx = (size_t)rows * group;
  void *k = random_cache(n), *v = random_cache(n);
  float *q = malloc(sizeof(float) * nx * head_dim), *scores = malloc(sizeof(float) * keys);
  int32_t *pos = malloc(sizeof(int32_t) * rows), *vis = malloc(sizeof(int32_t) * rows);
  for (size_t i = 0; i < nx * head_dim; i++) q[i] = random_unit() / sqrtf((float)head_dim);
  double pairs = 0;
  for (int32_t r = 0; r < rows; r++) {
    vis[r] = causal ? (r + 1 < keys ? r + 1 : keys) : keys;
    pos[r] = causal ? r : keys;
    pairs += vis[r];
  }
  attend_case c[2];
  for (int s = 0; s < 2; s++) {
    const size_t floats = set[s]->panel_floats(keys, head_dim);
    c[s] = (attend_case){set[s], {0}, malloc(sizeof(float) * floats), malloc(sizeof(float) * floats)};
    set[s]->load(cache_dtype, k, v, head_dim, keys, head_dim, keys, c[s].keys, c[s].values);
    float *m = malloc(sizeof(float) * nx), *l = malloc(sizeof(float) * nx), *o = calloc(nx * head_dim, sizeof(float));
    for (size_t x = 0; x < nx; x++) m[x] = -INFINITY, l[x] = 0.0f;
    c[s].job = (uattn_panel_job){.rows = rows,
                                 .group = group,
                                 .head_dim = head_dim,
                                 .q = q,
                                 .query_pos = pos,
                                 .visible = vis,
                                 .num_keys = keys,
                                 .key_pos0 = 0,
                                 .scale = 1.0f, /* q holds the scale: for the sets that apply it to scores */
                                 .keys = c[s].keys,
                                 .values = c[s].values,
                                 .m = m,
                                 .l = l,
                                 .o = o,
                                 .scores = scores};
  }
  double seconds[2];
  time_both(run_attend, (void *const[2]){&c[0], &c[1]}, seconds, speedup);
  for (int s = 0; s < 2; s++) {
    gflops[s] = pairs * group * 4.0 * head_dim / seconds[s] * 1e-9;
    free(c[s].keys), free(c[s].values), free(c[s].job.m), free(c[s].job.l), free(c[s].job.o);
  }
  free_cache(k, n), free_cache(v, n), free(q), free(scores), free(pos), free(vis);
}

/* ---- load ---------------------------------------------------------------------------------------------------- */

typedef struct load_case {
  const uattn_kernels *set;
  const char *k, *v; /* NHD cache: [blocks][block_keys][KV_HEADS][head_dim] */
  long blocks;       /* 1: the same block each call (hot) */
  int hnd;           /* [blocks][KV_HEADS][block_keys][head_dim] instead */
  float *keys, *values;
} load_case;

/* Where call `call` finds its block of block_keys x KV_HEADS x head_dim elements, in bytes: a pseudo-random walk
 * over the blocks, so the prefetchers cannot run ahead. */
size_t walk_offset(long blocks, long call) {
  return (size_t)((call * 7919) % blocks) * block_keys * KV_HEADS * head_dim * uattn_dtype_size(cache_dtype);
}

static void run_load(void *arg, long call) {
  const load_case *c = arg;
  const size_t off = walk_offset(c->blocks, call);
  c->set->load(cache_dtype, c->k + off, c->v + off, c->hnd ? (size_t)head_dim : (size_t)KV_HEADS * head_dim, block_keys,
               head_dim, block_keys, c->keys, c->values);
}

/* GB/s of cache read by each set's load of one head of a block. */
static void bench_load(const uattn_kernels *const set[2], const char *k, const char *v, long blocks, int hnd,
                       double gbs[2], double speedup[3]) {
  load_case c[2];
  for (int s = 0; s < 2; s++) {
    const size_t floats = set[s]->panel_floats(block_keys, head_dim);
    c[s] = (load_case){set[s], k, v, blocks, hnd, malloc(sizeof(float) * floats), malloc(sizeof(float) * floats)};
  }
  double seconds[2];
  time_both(run_load, (void *const[2]){&c[0], &c[1]}, seconds, speedup);
  for (int s = 0; s < 2; s++) {
    gbs[s] = 2.0 * block_keys * head_dim * (double)uattn_dtype_size(cache_dtype) / seconds[s] * 1e-9;
    free(c[s].keys), free(c[s].values);
  }
}

/* A figure of both sets and the second's speedup: the median of the runs' and their quartiles. */
static void row(const char *name, const char *unit_name, const double x[2], const double speedup[3]) {
  printf("  %-44s %9.2f %9.2f %s %6.2fx [%4.2f %4.2f]\n", name, x[0], x[1], unit_name, speedup[1], speedup[0],
         speedup[2]);
}

/* ---- --xsmm: the fused attend against the libxsmm body ----------------------------------------------------- */

typedef struct product_case {
  uattn_xsmm_product which;
  float *scratch;
} product_case;

static void run_product(void *arg, long call) {
  (void)call;
  const product_case *c = arg;
  uattn_xsmm_products(c->which, head_dim, c->scratch);
}

/* The libxsmm body's two products alone on one full block, operands hot: the ceiling of the attend rows
 * above, which add the softmax and stream the panels. */
static void bench_xsmm_products(double peak) {
  const size_t floats = uattn_xsmm_products_floats(head_dim);
  product_case c[2] = {{UATTN_XSMM_SCORES, malloc(sizeof(float) * floats)},
                       {UATTN_XSMM_VALUES, malloc(sizeof(float) * floats)}};
  for (int s = 0; s < 2; s++)
    for (size_t i = 0; i < floats; i++) c[s].scratch[i] = random_unit();
  double seconds[2];
  time_interleaved(run_product, 2, (void *const[2]){&c[0], &c[1]}, seconds, NULL);
  static const char *const what[2] = {"S = Q K^T (its 32-dim pieces summed)", "O += P V"};
  printf("\n  the libxsmm body's products alone, one full block, operands in cache:\n");
  for (int s = 0; s < 2; s++) {
    const double gflops = uattn_xsmm_products(c[s].which, head_dim, c[s].scratch) / seconds[s] * 1e-9;
    printf("  %-40s %7.1f (%3.0f%%)\n", what[s], gflops, 100 * gflops / peak);
    free(c[s].scratch);
  }
}

/* --xsmm: fused against libxsmm on large jobs (group 4; all keys visible, or causal: row r sees r + 1), and
 * which of the two the avx2 set picks for the job (uattn_xsmm_wins). */
static int bench_xsmm(double peak) {
  if (!uattn_xsmm_runs_here()) {
    fprintf(stderr, "uattn-kernel-bench: libxsmm is not built in, or JITs nothing here\n");
    return 1;
  }
  const uattn_kernels *const sets[2] = {&uattn_kernels_avx2_fused, &uattn_kernels_xsmm};
  printf("  %-40s %15s %15s %20s %6s\n", "query vectors x keys (group 4)", "fused", "libxsmm", "speedup [quartiles]",
         "picks");
  const struct {
    const char *what;
    int32_t rows, keys;
    int causal;
  } cases[] = {{"prefill tile", 128, 128, 0}, {"prefill tile", 128, 128, 1}, {"causal slice", 512, 512, 1},
               {"causal slice", 128, 512, 1}, {"shared block", 1, 128, 0},   {"shared block", 2, 128, 0},
               {"shared block", 4, 128, 0},   {"shared block", 16, 128, 0},  {"shared block", 64, 128, 0},
               {"shared block", 2, 32, 0},    {"shared block", 16, 32, 0},   {"shared block", 16, 16, 0},
               {"shared block", 64, 16, 0},   {"shared blocks", 16, 512, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const int32_t rows = cases[i].rows, keys = cases[i].keys;
    double x[2], speedup[3];
    bench_attend(sets, rows, GROUP, keys, cases[i].causal, x, speedup);
    int32_t *vis = malloc(sizeof(int32_t) * rows);
    for (int32_t r = 0; r < rows; r++) vis[r] = cases[i].causal && r + 1 < keys ? r + 1 : keys;
    const uattn_panel_job job = {
        .rows = rows, .group = GROUP, .head_dim = head_dim, .visible = vis, .num_keys = keys, .scale = 1.0f};
    const int picks = uattn_xsmm_wins(&job);
    free(vis);
    char name[64];
    snprintf(name, sizeof name, "%-13s %4d x %4d%s", cases[i].what, rows * GROUP, keys,
             cases[i].causal ? " causal" : "");
    printf("  %-40s %7.1f (%3.0f%%) %7.1f (%3.0f%%) %6.2fx [%4.2f %4.2f] %6s\n", name, x[0], 100 * x[0] / peak, x[1],
           100 * x[1] / peak, speedup[1], speedup[0], speedup[2], picks ? "xsmm" : "fused");
  }
  printf("\n  GFLOP/s (%% of the FMA peak); the avx2 set takes libxsmm from %d vectors and %d keys, head dim <= %d\n",
         UATTN_XSMM_MIN_VECTORS, UATTN_XSMM_MIN_KEYS, UATTN_XSMM_MAX_HEAD_DIM);
  bench_xsmm_products(peak);
  return 0;
}

/* A bucket's spec as --bucket takes it, DTYPE:BLOCK_SIZE:HEAD_DIM:CHUNK_SIZE, and ":ISA" when isa is set. */
static void bucket_spec(const uattn_bucket_kernels *e, bool isa, char *out, size_t size) {
  snprintf(out, size, "%s:%d:%d:%d%s%s", uattn_dtype_name(e->dtype), e->block_size, e->head_dim, e->chunk_size,
           isa ? ":" : "", isa ? e->isa : "");
}

/* The variant bucket of e's shape and ISA (its spec with the ISA), or NULL. */
static const uattn_bucket_kernels *variant_of(const uattn_bucket_kernels *e) {
  char want[64], spec[64];
  bucket_spec(e, true, want, sizeof want);
  for (size_t i = 0; i < sizeof variant_buckets / sizeof *variant_buckets; i++) {
    bucket_spec(variant_buckets[i], true, spec, sizeof spec);
    if (!strcmp(spec, want)) return variant_buckets[i];
  }
  return NULL;
}

/* The registry's bucket of spec DTYPE:BLOCK_SIZE:HEAD_DIM:CHUNK_SIZE[:ISA] that this CPU runs, of the best ISA
 * unless one is named (as the dispatch picks it for bf16 queries); NULL for a malformed spec, a bucket that was
 * not generated or one generated only for ISAs this CPU lacks, after saying so on stderr (the first two)
 * unless quiet, with the list of the buckets that were generated. */
static const uattn_bucket_kernels *find_bucket(const char *spec, bool quiet) {
  char dtype[16], isa[32] = ""; /* the longest dtype name: "fp8_e4m3" */
  int32_t block, dim, chunk;
  int used = 0;
  const int n = sscanf(spec, "%15[^:]:%d:%d:%d%n:%31[^:]%n", dtype, &block, &dim, &chunk, &used, isa, &used);
  if (n < 4 || spec[used]) {
    fprintf(stderr, "uattn-kernel-bench: --bucket %s: want DTYPE:BLOCK_SIZE:HEAD_DIM:CHUNK_SIZE[:ISA]\n", spec);
    return NULL;
  }
  bool generated = false;
  for (size_t i = 0; i < uattn_bucket_registry_size; i++) {
    const uattn_bucket_kernels *e = uattn_bucket_registry[i];
    if (strcmp(uattn_dtype_name(e->dtype), dtype) || e->block_size != block || e->head_dim != dim ||
        e->chunk_size != chunk || (*isa && strcmp(e->isa, isa)))
      continue;
    if (e->runs_here()) return e;
    generated = true;
  }
  if (quiet) return NULL;
  if (generated) {
    fprintf(stderr, "uattn-kernel-bench: the bucket %s was generated only for ISAs this CPU lacks\n", spec);
    return NULL;
  }
  fprintf(stderr,
          "uattn-kernel-bench: no bucket %s was generated; the build's (UATTN_KERNEL_BUCKETS), with "
          "their ISAs:\n",
          spec);
  for (size_t i = 0; i < uattn_bucket_registry_size; i++) {
    const uattn_bucket_kernels *e = uattn_bucket_registry[i];
    char shape[64], other[64];
    bucket_spec(e, false, shape, sizeof shape);
    bool first = true;
    for (size_t j = 0; j < i && first; j++)
      bucket_spec(uattn_bucket_registry[j], false, other, sizeof other), first = strcmp(shape, other) != 0;
    if (!first) continue;
    fprintf(stderr, "  %-24s", shape);
    for (size_t j = i; j < uattn_bucket_registry_size; j++) {
      bucket_spec(uattn_bucket_registry[j], false, other, sizeof other);
      if (!strcmp(shape, other)) fprintf(stderr, " %s", uattn_bucket_registry[j]->isa);
    }
    fprintf(stderr, "\n");
  }
  if (!uattn_bucket_registry_size) fprintf(stderr, "  (none: the generic kernels only)\n");
  return NULL;
}

/* The generic set of an ISA of the ladder (gen/manifest.json): what a bucket of that ISA specializes. */
static const uattn_kernels *generic_set(const char *isa) {
  for (size_t i = 0; i < uattn_isa_registry_size; i++)
    if (!strcmp(uattn_isa_registry[i].name, isa)) return uattn_isa_registry[i].set;
  return &uattn_kernels_avx2;
}

int main(int argc, char **argv) {
  int bucket = 0, xsmm = 0, decode = 0, variant = 0, layouts = 0;
  const char *spec = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--bucket")) {
      bucket = 1;
      if (i + 1 < argc && strchr(argv[i + 1], ':')) spec = argv[++i];
    } else if (!strcmp(argv[i], "--xsmm"))
      xsmm = 1;
    else if (!strcmp(argv[i], "--decode"))
      decode = 1;
    else if (!strcmp(argv[i], "--decode-layouts"))
      decode = layouts = 1;
    else if (!strcmp(argv[i], "--variant"))
      variant = 1;
    else if (!strcmp(argv[i], "--cpu-time"))
      cpu_time = 1;
    else if (perf_parse_int(argv[i], 1, MAX_RUNS, &runs))
      runs = 0; /* refused below, with the usage */
  }
  if (runs < 1 || runs > MAX_RUNS || (xsmm && (bucket || decode || variant))) {
    fprintf(stderr,
            "usage: uattn-kernel-bench [RUNS (1-%d)] [--bucket [DTYPE:BLOCK_SIZE:HEAD_DIM:CHUNK_SIZE[:ISA]]] "
            "[--decode] [--variant] [--cpu-time]\n       uattn-kernel-bench [RUNS] [--bucket [SPEC]] --decode-layouts "
            "[--variant] [--cpu-time]\n       uattn-kernel-bench [RUNS] --xsmm [--cpu-time]\n",
            MAX_RUNS);
    return 2;
  }
  if (!uattn_avx2_runs_here()) {
    fprintf(stderr, "uattn-kernel-bench: this CPU lacks AVX2, FMA or F16C; nothing to compare\n");
    return 1;
  }
  /* the shape: the bucket asked for, else the one kernel_variant.c builds (bf16 b128 d128) */
  char variant_spec[64], which[96];
  bucket_spec(&uattn_variant_bucket, false, variant_spec, sizeof variant_spec);
  const uattn_bucket_kernels *e = NULL;
  const bool fallback = decode && !bucket && !variant; /* --decode alone: else the generic avx2 set's kernel */
  /* --variant without a spec: the best ISA of the buckets the variant builds (a better level, amx, has none) */
  for (size_t i = sizeof variant_buckets / sizeof *variant_buckets; variant && !spec && !e && i-- > 0;) {
    char own[64];
    bucket_spec(variant_buckets[i], true, own, sizeof own);
    e = find_bucket(own, true);
  }
  if ((bucket || variant || decode) && !e) {
    e = find_bucket(spec ? spec : variant_spec, fallback);
    if (!e && !fallback) return 1;
  }
  const uattn_bucket_kernels *shape = e ? e : &uattn_variant_bucket;
  head_dim = shape->head_dim, block_keys = shape->block_size, cache_dtype = shape->dtype;
  cold_blocks = (256l << 20) / ((long)block_keys * KV_HEADS * head_dim * (long)uattn_dtype_size(cache_dtype));
  if (cold_blocks < 1) cold_blocks = 1;
  const uattn_bucket_kernels *b = variant ? variant_of(e) : NULL;
  if (variant && !b) {
    fprintf(stderr,
            "uattn-kernel-bench: --variant: kernel_variant*.c build the buckets %s:avx2 and %s:avx512bf16 only\n",
            variant_spec, variant_spec);
    return 1;
  }
  if (e) bucket_spec(e, true, which, sizeof which), strcat(which, " bucket's");
  const uattn_kernels *sets[2] = {&uattn_kernels_portable, &uattn_kernels_avx2};
  if (variant) /* the bucket against the variant */
    sets[0] = &e->set, sets[1] = &b->set;
  else if (bucket) /* the generic set of the bucket's ISA against the bucket */
    sets[0] = generic_set(e->isa), sets[1] = &e->set;
  double sink[1] = {0};
  for (const double t0 = perf_seconds(); perf_seconds() - t0 < 0.3;) fma_loop(sink, 0); /* wake the core up to speed */
  void *const sinks[2] = {sink, sink};
  double fma_seconds[2];
  time_both(fma_loop, sinks, fma_seconds, NULL);
  const double peak = FMA_ITERS * BENCH_PROBE_FMA_FLOPS(8) / fmin(fma_seconds[0], fma_seconds[1]) * 1e-9;
  printf("uattn-kernel-bench: one thread, head dim %d, %d heads a KV head, %d-key %s panels; medians of %d runs%s\n",
         head_dim, GROUP, block_keys, uattn_dtype_name(cache_dtype), runs, cpu_time ? " (thread CPU time)" : "");
  /* ymm: the width of the avx2 bodies and of libxsmm pinned to AVX2; a core with two zmm FMA pipes (Zen 5,
   * Intel servers) peaks at twice this, which uattn-bench's machine line reports */
  printf("  this core's fp32 FMA peak on ymm: %.1f GFLOP/s\n\n", peak);
  if (xsmm) return bench_xsmm(peak);
  if (layouts && variant) return bench_decode_layouts(sets[0], sets[1], which);
  if (decode && variant) return bench_decode(sets[0], sets[1], which, peak);
  if (decode) { /* the kernel the forward runs on this shape: the bucket's, else the generic set's */
    const bool own = e && e->set.decode;
    const uattn_kernels *set = own ? &e->set : &uattn_kernels_avx2;
    if (layouts) return bench_decode_layouts(set, NULL, own ? which : "generic avx2 set's");
    return bench_decode(set, NULL, own ? which : "generic avx2 set's", peak);
  }
  const char *const name[2] = {variant ? "bucket" : sets[0]->name, variant ? "variant" : bucket ? "bucket" : "avx2"};
  printf("  %-44s %9s %9s %s %20s\n", "", name[0], name[1], "       ", "speedup [quartiles]");

  struct {
    const char *name;
    int32_t rows, group, keys;
    int causal;
  } att[] = {{"attend decode (1 row x 4 heads, a block)", 1, GROUP, block_keys, 0},
             {"attend decode, MHA (1 row x 1 head)", 1, 1, block_keys, 0},
             {"attend decode, GQA 8 (1 row x 8 heads)", 1, 8, block_keys, 0},
             {"attend 4 rows (spec-decode verification)", 4, GROUP, block_keys, 0},
             {"attend prefill tile (128 x 4, all visible)", 128, GROUP, block_keys, 0},
             {"attend prefill tile (128 x 4, causal)", 128, GROUP, block_keys, 1},
             {"attend causal slice (512 x 4, 512 keys)", 512, GROUP, MAX_KEYS, 1}};
  double best = 0, x[2], speedup[3];
  for (size_t i = 0; i < sizeof att / sizeof *att; i++) {
    bench_attend(sets, att[i].rows, att[i].group, att[i].keys, att[i].causal, x, speedup);
    row(att[i].name, "GFLOP/s", x, speedup);
    if (x[1] > best) best = x[1];
  }
  const size_t block = (size_t)block_keys * KV_HEADS * head_dim;
  char *k = random_cache(block * cold_blocks), *v = random_cache(block * cold_blocks);
  char what[64];
  snprintf(what, sizeof what, "load %s block, hot", uattn_dtype_name(cache_dtype));
  bench_load(sets, k, v, 1, 0, x, speedup);
  row(what, "GB/s   ", x, speedup);
  snprintf(what, sizeof what, "load %s block, cold NHD (256 MiB cache)", uattn_dtype_name(cache_dtype));
  bench_load(sets, k, v, cold_blocks, 0, x, speedup);
  row(what, "GB/s   ", x, speedup);
  snprintf(what, sizeof what, "load %s block, cold HND (256 MiB cache)", uattn_dtype_name(cache_dtype));
  bench_load(sets, k, v, cold_blocks, 1, x, speedup);
  row(what, "GB/s   ", x, speedup);
  free_cache(k, block * cold_blocks), free_cache(v, block * cold_blocks);
  printf("\n  best %s attend: %.0f%% of the FMA peak\n", name[1], 100.0 * best / peak);
  return 0;
}
