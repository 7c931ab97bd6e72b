/* uattn-bench: the attention on named cases, as fractions of this machine's own limits measured in the same
 * run — read bandwidth (one thread and all) for memory-bound decodes, fp32 FMA peak for compute-bound
 * prefills — and the speedup of all threads over one. Medians of several runs. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "timing.h"
#include "uattn.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define UATTN_BENCH_X86 1
#endif

/* ---- the machine's limits ---------------------------------------------------------------------------- */

/* The limits run on plain threads, so they measure the machine rather than the library. */
typedef struct limit_job {
  const float *data;
  size_t n;
  int threads;
  double result[64];
} limit_job;

typedef struct limit_arg {
  limit_job *job;
  int id;
} limit_arg;

#ifdef UATTN_BENCH_X86
__attribute__((target("avx2"))) static double read_sum(const float *x, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(x + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(x + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(x + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(x + i + 24));
  }
  float t[8];
  _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

/* 12 independent FMA chains: enough to cover the FMA latency on two ports. */
__attribute__((target("avx2,fma"))) static double fma_loop(long iters) {
  __m256 a[12], b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int k = 0; k < 12; k++) a[k] = _mm256_set1_ps((float)k);
  for (long i = 0; i < iters; i++)
    for (int k = 0; k < 12; k++) a[k] = _mm256_fmadd_ps(a[k], b, c);
  float t[8];
  __m256 s = a[0];
  for (int k = 1; k < 12; k++) s = _mm256_add_ps(s, a[k]);
  _mm256_storeu_ps(t, s);
  return t[0];
}
#else
static double read_sum(const float *x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += x[i];
  return s;
}
static double fma_loop(long iters) {
  float a[12] = {0};
  for (long i = 0; i < iters; i++)
    for (int k = 0; k < 12; k++) a[k] = a[k] * 0.999999f + 1e-7f;
  return a[0];
}
#endif

static void *read_thread(void *p) {
  limit_arg *a = p;
  const size_t part = a->job->n / (size_t)a->job->threads;
  a->job->result[a->id] = read_sum(a->job->data + part * (size_t)a->id, part);
  return NULL;
}

static void *fma_thread(void *p) {
  limit_arg *a = p;
  a->job->result[a->id] = fma_loop(20000000);
  return NULL;
}

/* Runs fn on `threads` threads at once; returns the wall time. */
static double run_threads(void *(*fn)(void *), limit_job *job, int threads) {
  pthread_t t[64];
  limit_arg args[64];
  job->threads = threads;
  const double t0 = perf_seconds();
  for (int i = 0; i < threads; i++) {
    args[i] = (limit_arg){job, i};
    pthread_create(&t[i], NULL, fn, &args[i]);
  }
  for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
  return perf_seconds() - t0;
}

typedef struct limits {
  double read_gbs_1, read_gbs_all; /* GB/s */
  double fma_gflops_1, fma_gflops_all;
} limits;

/* The best of several runs: a limit is what the machine can do, and a busy neighbour only ever lowers it. */
static double fastest(const double *t, int n) {
  double m = t[0];
  for (int i = 1; i < n; i++) m = t[i] < m ? t[i] : m;
  return m;
}

static limits measure_limits(int threads, int runs) {
  limits L;
  const size_t n = (size_t)64 << 20; /* 256 MiB: far past the caches */
  float *x = aligned_alloc(64, n * sizeof(float));
  for (size_t i = 0; i < n; i++) x[i] = (float)(i & 7);
  limit_job job = {x, n, 1, {0}};
  double t[32];
  for (int k = 0; k < 2; k++) {
    const int th = k == 0 ? 1 : threads;
    for (int r = 0; r < runs; r++) t[r] = run_threads(read_thread, &job, th);
    const double gbs = (double)(n / (size_t)th * (size_t)th) * sizeof(float) / fastest(t, runs) * 1e-9;
    if (k == 0) L.read_gbs_1 = gbs;
    else L.read_gbs_all = gbs;
    for (int r = 0; r < runs; r++) t[r] = run_threads(fma_thread, &job, th);
    const double flops = 20000000.0 * 12 * 8 * 2 * th;
    if (k == 0) L.fma_gflops_1 = flops / fastest(t, runs) * 1e-9;
    else L.fma_gflops_all = flops / fastest(t, runs) * 1e-9;
  }
  free(x);
  return L;
}

/* ---- attention cases --------------------------------------------------------------------------------- */

typedef struct bench_case {
  const char *name;
  const char *bound; /* "memory" or "compute" */
  int32_t num_reqs, block_size, hq, hkv, head_dim;
  int32_t context;  /* cached keys per request */
  int32_t prefix;   /* of those, shared by all requests (block-aligned) */
  int32_t queries;  /* rows per request */
  bool prompt;      /* the rows are a prompt (causal part), else decode/verification */
} bench_case;

static const bench_case cases[] = {
    {"decode 1 x 32k", "memory", 1, 16, 32, 8, 128, 32768, 0, 1, false},
    {"decode 32 x 4k", "memory", 32, 16, 32, 8, 128, 4096, 0, 1, false},
    {"prefill 2048", "compute", 1, 16, 32, 8, 128, 0, 0, 2048, true},
    {"64 decodes, shared 4k prefix", "compute", 64, 16, 32, 8, 128, 4096 + 64, 4096, 1, false},
    {"spec decode 16 x 4", "compute", 16, 16, 32, 8, 128, 2048, 0, 4, false},
    {"spec decode 16 x 16", "compute", 16, 16, 32, 8, 128, 2048, 0, 16, false},
    {"spec decode 8 x 63", "compute", 8, 16, 32, 8, 128, 2048, 0, 63, false},
};

typedef struct case_result {
  double ms_1, ms_all;
  double kv_bytes, flops;
} case_result;

static uint16_t bf16_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static int run_case(const bench_case *c, uattn_runtime *one, uattn_runtime *all, int runs, case_result *res) {
  const int32_t bs = c->block_size, seq = c->context + c->queries;
  const int32_t per_req = (seq + bs - 1) / bs, prefix_blocks = c->prefix / bs;
  const int32_t num_blocks = prefix_blocks + c->num_reqs * (per_req - prefix_blocks) + 1;
  int32_t *table = malloc(sizeof(int32_t) * (size_t)c->num_reqs * per_req);
  int32_t nc[1024], ns[1024], np[1024];
  int32_t next = prefix_blocks;
  for (int32_t r = 0; r < c->num_reqs; r++) {
    for (int32_t b = 0; b < per_req; b++) table[r * per_req + b] = b < prefix_blocks ? b : next++;
    nc[r] = c->context;
    ns[r] = c->queries;
    np[r] = c->prompt ? seq : 1;
  }
  const int32_t T = c->num_reqs * c->queries;
  uattn_plan_config pc = uattn_plan_config_default(bs, num_blocks, c->num_reqs, T, seq);
  uattn_plan *plan;
  uattn_step step = {.num_reqs = c->num_reqs, .num_computed = nc, .num_scheduled = ns, .num_prompt = np,
                     .block_table = table, .block_table_stride = per_req};
  if (uattn_plan_create(&pc, &plan) || uattn_plan_step(plan, &step)) {
    fprintf(stderr, "uattn-bench: %s: %s\n", c->name, uattn_last_error());
    return -1;
  }
  const size_t cache_elems = (size_t)num_blocks * bs * c->hkv * c->head_dim;
  uint16_t *kc = malloc(cache_elems * 2), *vc = malloc(cache_elems * 2);
  uint16_t *q = malloc((size_t)T * c->hq * c->head_dim * 2), *k = malloc((size_t)T * c->hkv * c->head_dim * 2);
  uint16_t *v = malloc((size_t)T * c->hkv * c->head_dim * 2), *out = malloc((size_t)T * c->hq * c->head_dim * 2);
  uint64_t s = 1;
  for (size_t i = 0; i < cache_elems; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    kc[i] = bf16_of((float)((s >> 40) & 0xffff) / 65536.0f - 0.5f);
    vc[i] = kc[i] ^ 0x0101;
  }
  for (size_t i = 0; i < (size_t)T * c->hq * c->head_dim; i++) q[i] = bf16_of((float)(i % 97) / 97.0f - 0.5f);
  for (size_t i = 0; i < (size_t)T * c->hkv * c->head_dim; i++) k[i] = v[i] = bf16_of((float)(i % 89) / 89.0f - 0.5f);
  uattn_layer L = uattn_layer_default(c->hq, c->hkv, c->head_dim, UATTN_BF16);
  uattn_tensors t = {.q = q, .k = k, .v = v, .key_cache = kc, .value_cache = vc, .num_blocks = num_blocks,
                     .block_size = bs, .out = out};
  double times[32];
  for (int which = 0; which < 2; which++) {
    uattn_runtime *rt = which == 0 ? one : all;
    uattn_forward(plan, &L, &t, rt); /* warm-up: pages, scratch */
    for (int r = 0; r < runs; r++) {
      const double t0 = perf_seconds();
      if (uattn_forward(plan, &L, &t, rt)) {
        fprintf(stderr, "uattn-bench: %s: %s\n", c->name, uattn_last_error());
        return -1;
      }
      times[r] = perf_seconds() - t0;
    }
    (which == 0 ? &res->ms_1 : &res->ms_all)[0] = perf_median(times, runs) * 1e3;
  }
  /* the bytes that must be read: every distinct cached block once per KV head, K and V */
  const double distinct_keys = (double)c->prefix + (double)c->num_reqs * (c->context - c->prefix);
  res->kv_bytes = distinct_keys * c->hkv * c->head_dim * 2.0 * 2.0;
  double pairs = 0;
  for (int32_t i = 0; i < c->queries; i++) pairs += c->context + i + 1;
  res->flops = pairs * c->num_reqs * c->hq * 4.0 * c->head_dim;
  free(table), free(kc), free(vc), free(q), free(k), free(v), free(out);
  uattn_plan_destroy(plan);
  return 0;
}

int main(int argc, char **argv) {
  int runs = 5, json = 0;
  const char *only = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json")) json = 1;
    else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--case") && i + 1 < argc) only = argv[++i];
    else {
      fprintf(stderr, "usage: uattn-bench [--runs N] [--case NAME-PART] [--json]\n");
      return 2;
    }
  }
  if (runs < 1 || runs > 31) runs = 5;
  uattn_runtime_config one_cfg = uattn_runtime_config_default();
  one_cfg.num_threads = 1;
  uattn_runtime *one, *all;
  if (uattn_runtime_create(&one_cfg, &one) || uattn_runtime_create(NULL, &all)) {
    fprintf(stderr, "uattn-bench: %s\n", uattn_last_error());
    return 1;
  }
  uattn_topology topo;
  uattn_runtime_get_topology(all, &topo);
  fprintf(stderr, "uattn-bench: measuring the machine's limits...\n");
  const limits lim = measure_limits(topo.num_workers, runs);

  size_t n = 0;
  bench_case chosen[16];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    if (!only || strstr(cases[i].name, only)) chosen[n++] = cases[i];
  case_result res[16];
  for (size_t i = 0; i < n; i++) {
    fprintf(stderr, "\ruattn-bench: case %zu/%zu: %-32s", i + 1, n, chosen[i].name);
    if (run_case(&chosen[i], one, all, runs, &res[i])) return 1;
  }
  fprintf(stderr, "\n");

  if (json) {
    printf("{\"threads\": %d, \"limits\": {\"read_gbs_1\": %.2f, \"read_gbs_all\": %.2f, \"fma_gflops_1\": %.2f, "
           "\"fma_gflops_all\": %.2f},\n \"cases\": [",
           topo.num_workers, lim.read_gbs_1, lim.read_gbs_all, lim.fma_gflops_1, lim.fma_gflops_all);
    for (size_t i = 0; i < n; i++)
      printf("%s\n  {\"name\": \"%s\", \"bound\": \"%s\", \"ms_1\": %.3f, \"ms_all\": %.3f, \"gbs_all\": %.2f, "
             "\"gflops_all\": %.2f, \"fraction_of_read_bw\": %.3f, \"fraction_of_fma_peak\": %.3f, \"speedup\": %.2f}",
             i ? "," : "", chosen[i].name, chosen[i].bound, res[i].ms_1, res[i].ms_all,
             res[i].kv_bytes / res[i].ms_all * 1e-6, res[i].flops / res[i].ms_all * 1e-6,
             res[i].kv_bytes / res[i].ms_all * 1e-6 / lim.read_gbs_all,
             res[i].flops / res[i].ms_all * 1e-6 / lim.fma_gflops_all, res[i].ms_1 / res[i].ms_all);
    printf("]}\n");
  } else {
    printf("uattn-bench: cases are medians of %d runs, limits the best of them; bf16 caches, %d threads (%d cores)\n",
           runs, topo.num_workers,
           topo.usable.cores);
    printf("  machine: read %.1f GB/s (1 thread), %.1f GB/s (all); fp32 FMA %.1f GFLOP/s (1), %.1f (all)\n\n",
           lim.read_gbs_1, lim.read_gbs_all, lim.fma_gflops_1, lim.fma_gflops_all);
    printf("  %-30s %8s %10s %10s %9s %9s %8s\n", "case", "bound", "1 thr ms", "all ms", "of read", "of peak",
           "speedup");
    for (size_t i = 0; i < n; i++)
      printf("  %-30s %8s %10.2f %10.2f %8.1f%% %8.1f%% %7.2fx\n", chosen[i].name, chosen[i].bound, res[i].ms_1,
             res[i].ms_all, 100 * res[i].kv_bytes / res[i].ms_all * 1e-6 / lim.read_gbs_all,
             100 * res[i].flops / res[i].ms_all * 1e-6 / lim.fma_gflops_all, res[i].ms_1 / res[i].ms_all);
    printf("\n  'of read': KV bytes that must be read / time, over all-thread read bandwidth;\n"
           "  'of peak': attention flops (4 x head_dim per visible query-key pair and head) / time, over all-thread\n"
           "  fp32 FMA peak; speedup: one thread's time over all threads'.\n");
  }
  uattn_runtime_destroy(one);
  uattn_runtime_destroy(all);
  return 0;
}
