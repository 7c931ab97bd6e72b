/* uattn-sweep: tunes uattn for this machine and a workload. Per kernel bucket (block size, head dim, cache
 * dtype) it times the workload under each value of the tunables (thread count, query tile, shared-part
 * chunk size, split-K), one tunable at a time from the defaults, keeps a value only when it is clearly
 * faster, and writes the best per bucket as a tuning file (include/uattn.h, the tuning section), a PNG plot
 * of time against each tunable (gnuplot) and every measurement as JSON. It also plans the workload under
 * several batch-bucket sets and reports the padding each wastes. Only public knobs are used. The command line
 * is parsed in options.c. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sweep/options.h"
#include "sweep/sweep.h"
#include "common/random.h"
#include "common/tensors.h"
#include "common/timing.h"
#include "convert.h"
#include "uattn.h"
#include "uattn_tuning.h"

/* The tunables' names, indexed by T_THREADS to T_SPLIT (options.h). */
static const char *const tunable_names[NUM_TUNABLES] = {"threads", "query_tile", "chunk_size", "split"};

/* ---- progress on stderr --------------------------------------------------------------------------------- */

typedef struct progress {
  int done, total; /* done: passes timed or skipped */
  int passes;      /* timed */
  double start;
  bool tty;
} progress;

static void progress_show(progress *p, const char *what, double ms) {
  p->done++;
  p->passes++;
  const double elapsed = perf_seconds() - p->start, eta = elapsed / p->done * (p->total - p->done);
  char bar[31];
  const int fill = p->total ? 30 * p->done / p->total : 30;
  for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
  bar[30] = '\0';
  fprintf(stderr, "%s[%s] %3d/%d  %-44.44s %9.2f ms  eta %4.0f s%s", p->tty ? "\r" : "", bar, p->done, p->total, what,
          ms, eta, p->tty ? "\033[K" : "\n");
  fflush(stderr);
}

/* ---- timing one configuration --------------------------------------------------------------------------- */

typedef struct config {
  int v[NUM_TUNABLES]; /* index into the candidates of each tunable */
} config;

typedef struct bench {
  const options *o;
  const sweep_workload *w;
  bucket b;
  sweep_layout layout;
  void *q, *k, *v, *key_cache, *value_cache, *out;
  uattn_runtime *runtimes[MAX_CANDIDATES]; /* per thread-count candidate, made when first needed */
  double *samples;
} bench;

/* Values in [-1, 1) in the dtype. */
static void fill_random(void *p, size_t n, uattn_dtype d, uint64_t *rng) {
  for (size_t i = 0; i < n; i++) {
    const uint64_t z = perf_random_next(rng);
    const float f = (float)((double)(z >> 11) * 0x1.0p-52 - 1.0);
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if (d == UATTN_F32)
      ((float *)p)[i] = f;
    else if (d == UATTN_BF16)
      ((uint16_t *)p)[i] = (uint16_t)(bits >> 16);
    else if (uattn_dtype_is_fp8(d))
      ((uint8_t *)p)[i] = uattn_f32_to_fp8(d, f);
    else
      ((uint16_t *)p)[i] = (uint16_t)((z & 0x8000u) | (uint16_t)((13 + (z >> 20) % 2) << 10) | ((z >> 32) & 0x3FF));
  }
}

/* q, k, v and out of a bucket's layers: the cache dtype, but bf16 for an fp8 cache (fp8 is a cache dtype only,
 * and the models whose caches engines quantize to fp8 are bf16 ones). */
static uattn_dtype input_dtype(uattn_dtype cache) { return uattn_dtype_is_fp8(cache) ? UATTN_BF16 : cache; }

static int bench_init(bench *be, const options *o, const sweep_workload *w, bucket b) {
  memset(be, 0, sizeof *be);
  be->o = o, be->w = w, be->b = b;
  if (sweep_layout_build(&be->layout, w, b.block_size)) {
    fprintf(stderr, "uattn-sweep: out of memory laying out the workload for block size %d\n", b.block_size);
    return -1;
  }
  const uattn_dtype in = input_dtype(b.dtype);
  const size_t es = uattn_dtype_size(b.dtype), is = uattn_dtype_size(in);
  const size_t tokens = (size_t)w->max_num_batched_tokens, D = (size_t)b.head_dim;
  const size_t cache = (size_t)be->layout.num_blocks * (size_t)b.block_size * (size_t)o->hkv * D;
  be->q = malloc(tokens * (size_t)o->hq * D * is);
  be->out = malloc(tokens * (size_t)o->hq * D * is);
  be->k = malloc(tokens * (size_t)o->hkv * D * is);
  be->v = malloc(tokens * (size_t)o->hkv * D * is);
  be->key_cache = malloc(cache * es);
  be->value_cache = malloc(cache * es);
  be->samples = malloc(sizeof(double) * (size_t)o->runs * MAX_CANDIDATES);
  if (!be->q || !be->out || !be->k || !be->v || !be->key_cache || !be->value_cache || !be->samples) {
    fprintf(stderr, "uattn-sweep: out of memory for bucket %d:%d:%s (caches of %zu MiB each)\n", b.block_size,
            b.head_dim, uattn_dtype_name(b.dtype), cache * es >> 20);
    return -1;
  }
  uint64_t rng = 99;
  fill_random(be->q, tokens * (size_t)o->hq * D, in, &rng);
  fill_random(be->k, tokens * (size_t)o->hkv * D, in, &rng);
  fill_random(be->v, tokens * (size_t)o->hkv * D, in, &rng);
  fill_random(be->key_cache, cache, b.dtype, &rng);
  fill_random(be->value_cache, cache, b.dtype, &rng);
  return 0;
}

static void bench_free(bench *be) {
  for (int i = 0; i < MAX_CANDIDATES; i++) uattn_runtime_destroy(be->runtimes[i]);
  free(be->q), free(be->out), free(be->k), free(be->v), free(be->key_cache), free(be->value_cache), free(be->samples);
  sweep_layout_free(&be->layout);
}

static uattn_runtime *runtime_for(bench *be, int index) {
  if (be->runtimes[index]) return be->runtimes[index];
  uattn_runtime_config rc = uattn_runtime_config_default();
  rc.num_threads = be->o->cand[T_THREADS][index];
  if (uattn_runtime_create(&rc, &be->runtimes[index]) != UATTN_OK) {
    fprintf(stderr, "\nuattn-sweep: a runtime of %d threads: %s\n", rc.num_threads, uattn_last_error());
    return NULL;
  }
  return be->runtimes[index];
}

/* One pass over the workload under c: the sum of one forward call per step, in ms; -1 on an error. */
static double time_pass(bench *be, const config *c) {
  const options *o = be->o;
  uattn_runtime *rt = runtime_for(be, c->v[T_THREADS]);
  if (!rt) return -1;
  uattn_plan_config pc = sweep_plan_config(be->w, &be->layout);
  if (c->v[T_SPLIT]) {
    pc.split_min_keys = o->split_min[c->v[T_SPLIT]];
    pc.split_keys = o->split_keys[c->v[T_SPLIT]];
  }
  uattn_plan *plan;
  if (uattn_plan_create(&pc, &plan) != UATTN_OK) {
    fprintf(stderr, "\nuattn-sweep: plan: %s\n", uattn_last_error());
    return -1;
  }
  uattn_layer L = uattn_layer_default(o->hq, o->hkv, be->b.head_dim, input_dtype(be->b.dtype));
  L.cache_dtype = be->b.dtype;
  L.causal_width = o->cand[T_TILE][c->v[T_TILE]];
  L.chunk_size = o->cand[T_CHUNK][c->v[T_CHUNK]];
  const uattn_tensors t = perf_tensors(be->q, be->k, be->v, be->key_cache, be->value_cache, be->layout.num_blocks,
                                       be->b.block_size, be->out);
  double total = 0;
  for (int32_t s = 0; s < be->layout.num_steps; s++) {
    if (uattn_plan_step(plan, &be->layout.steps[s]) != UATTN_OK) {
      fprintf(stderr, "\nuattn-sweep: step %d: %s\n", s, uattn_last_error());
      total = -1;
      break;
    }
    const double t0 = perf_seconds();
    if (uattn_forward(plan, &L, &t, rt) != UATTN_OK) {
      fprintf(stderr, "\nuattn-sweep: forward, step %d: %s\n", s, uattn_last_error());
      total = -1;
      break;
    }
    total += (perf_seconds() - t0) * 1e3;
  }
  uattn_plan_destroy(plan);
  return total;
}

/* Times n configurations interleaved: --runs rounds, each a pass of every configuration in turn, so a
 * change of the machine's load hits them all alike; ms[i] is configuration i's median pass. */
static int time_group(bench *be, const config *configs, char (*labels)[96], int n, int runs, progress *pr, double *ms) {
  for (int r = 0; r < runs; r++)
    for (int i = 0; i < n; i++) {
      const double x = time_pass(be, &configs[i]);
      if (x < 0) return -1;
      be->samples[(size_t)i * (size_t)runs + (size_t)r] = x;
      progress_show(pr, labels[i], x);
    }
  for (int i = 0; i < n; i++) ms[i] = perf_median(be->samples + (size_t)i * (size_t)runs, runs);
  return 0;
}

/* ---- the sweep of one bucket ----------------------------------------------------------------------------- */

typedef struct point {
  int tunable, index;
  double ms, relative; /* relative: to this tunable at its default, the others as they were */
} point;

typedef struct bucket_result {
  bucket b;
  config winner;                         /* the sweep's pick */
  config best;                           /* what is written: the pick, or the defaults when it lost the head-to-head */
  double default_ms, winner_ms, best_ms; /* from the head-to-head */
  point points[NUM_TUNABLES * MAX_CANDIDATES];
  int num_points;
  bool kept_defaults; /* the winner was not min_gain faster in the head-to-head */
} bucket_result;

/* The defaults are 0 in a config and a tuning file; they are shown as what they stand for. */
static const char *const default_labels[NUM_TUNABLES] = {"all", "auto", "whole", "8192/4096"};

static void value_label(const options *o, int t, int index, char *buf, size_t cap) {
  if (index == 0)
    snprintf(buf, cap, "%s", default_labels[t]);
  else if (t == T_SPLIT)
    snprintf(buf, cap, "%d/%d", o->split_min[index], o->split_keys[index]);
  else
    snprintf(buf, cap, "%d", o->cand[t][index]);
}

static void config_label(const options *o, const bucket *b, const config *c, int changed, char *buf, size_t cap) {
  char v[32] = "defaults";
  if (changed >= 0) value_label(o, changed, c->v[changed], v, sizeof v);
  snprintf(buf, cap, "%d:%d:%s %s%s%s", b->block_size, b->head_dim, uattn_dtype_name(b->dtype),
           changed >= 0 ? tunable_names[changed] : "", changed >= 0 ? "=" : "", v);
}

/* Each tunable in turn over its candidates, the others at their best so far; a candidate replaces the
 * current value only when min_gain faster. Then the winner against the defaults, head to head. */
static int sweep_bucket(bench *be, progress *pr, bucket_result *res) {
  const options *o = be->o;
  memset(res, 0, sizeof *res);
  res->b = be->b;
  config best = {{0}}, group[MAX_CANDIDATES];
  char labels[MAX_CANDIDATES][96];
  double ms[MAX_CANDIDATES];
  for (int t = 0; t < NUM_TUNABLES; t++) {
    const int n = o->num_cand[t], current = best.v[t];
    for (int i = 0; i < n; i++) {
      group[i] = best;
      group[i].v[t] = i;
      config_label(o, &be->b, &group[i], t, labels[i], sizeof labels[i]);
    }
    if (time_group(be, group, labels, n, o->runs, pr, ms)) return -1;
    int winner = current;
    for (int i = 0; i < n; i++) {
      res->points[res->num_points++] = (point){t, i, ms[i], ms[i] / ms[0]};
      if (ms[i] < ms[winner]) winner = i;
    }
    if (ms[winner] < ms[current] * (1 - o->min_gain)) best.v[t] = winner;
  }
  const config defaults = {{0}};
  res->best = res->winner = best;
  if (!memcmp(&best, &defaults, sizeof best)) { /* nothing to compare: the first group timed the defaults */
    res->default_ms = res->best_ms = res->winner_ms = res->points[0].ms;
    pr->done += 2 * 2 * o->runs;
    return 0;
  }
  group[0] = defaults;
  group[1] = best;
  config_label(o, &be->b, &defaults, -1, labels[0], sizeof labels[0]);
  snprintf(labels[1], sizeof labels[1], "%d:%d:%s the winner", be->b.block_size, be->b.head_dim,
           uattn_dtype_name(be->b.dtype));
  if (time_group(be, group, labels, 2, 2 * o->runs, pr, ms)) return -1;
  res->default_ms = ms[0];
  res->best_ms = res->winner_ms = ms[1];
  if (!(res->best_ms < res->default_ms * (1 - o->min_gain))) {
    res->kept_defaults = true;
    res->best = defaults;
    res->best_ms = res->default_ms;
  }
  return 0;
}

static uattn_tuning_entry entry_of(const options *o, const bucket_result *r) {
  const config *c = &r->best;
  uattn_tuning_entry e = {r->b.block_size,
                          r->b.head_dim,
                          r->b.dtype,
                          o->cand[T_CHUNK][c->v[T_CHUNK]],
                          o->cand[T_TILE][c->v[T_TILE]],
                          o->split_min[c->v[T_SPLIT]],
                          o->split_keys[c->v[T_SPLIT]],
                          o->cand[T_THREADS][c->v[T_THREADS]],
                          r->best_ms,
                          r->default_ms};
  return e;
}

static void print_result(const options *o, const bucket_result *r) {
  printf("\nbucket block %d, head_dim %d, %s: the workload's time (ms) per value, the others at their pick so far\n",
         r->b.block_size, r->b.head_dim, uattn_dtype_name(r->b.dtype));
  for (int t = 0; t < NUM_TUNABLES; t++) {
    printf("  %-11s", tunable_names[t]);
    for (int i = 0; i < r->num_points; i++)
      if (r->points[i].tunable == t) {
        char v[32];
        value_label(o, t, r->points[i].index, v, sizeof v);
        printf("  %s %.1f%s", v, r->points[i].ms, r->winner.v[t] == r->points[i].index ? "*" : "");
      }
    printf("\n");
  }
  char pick[160] = "";
  for (int t = 0; t < NUM_TUNABLES; t++) {
    char v[32];
    value_label(o, t, r->winner.v[t], v, sizeof v);
    snprintf(pick + strlen(pick), sizeof pick - strlen(pick), "%s%s %s", t ? ", " : "", tunable_names[t], v);
  }
  if (r->winner_ms == r->default_ms && !r->kept_defaults)
    printf("  pick (*): the defaults, nothing was --min-gain faster\n");
  else
    printf("  pick (*): %s; head to head %.1f ms against %.1f ms with the defaults (%+.1f%%): %s\n", pick, r->winner_ms,
           r->default_ms, 100 * (r->winner_ms / r->default_ms - 1),
           r->kept_defaults ? "not --min-gain faster, the defaults are written" : "written");
}

/* ---- outputs ------------------------------------------------------------------------------------------- */

static char *join(const char *dir, const char *file) {
  static char paths[4][1024];
  static int i;
  i = (i + 1) % 4;
  snprintf(paths[i], sizeof paths[i], "%s/%s", dir, file);
  return paths[i];
}

static cJSON *results_json(const options *o, const bucket_result *res, int n) {
  cJSON *list = cJSON_CreateArray();
  for (int b = 0; b < n; b++) {
    const bucket_result *r = &res[b];
    cJSON *x = cJSON_CreateObject(), *pts = cJSON_CreateArray();
    char name[64];
    snprintf(name, sizeof name, "%d:%d:%s", r->b.block_size, r->b.head_dim, uattn_dtype_name(r->b.dtype));
    cJSON_AddStringToObject(x, "bucket", name);
    cJSON_AddNumberToObject(x, "default_ms", r->default_ms);
    cJSON_AddNumberToObject(x, "tuned_ms", r->best_ms);
    cJSON_AddBoolToObject(x, "kept_defaults", r->kept_defaults);
    for (int i = 0; i < r->num_points; i++) {
      cJSON *p = cJSON_CreateObject();
      char v[32];
      value_label(o, r->points[i].tunable, r->points[i].index, v, sizeof v);
      cJSON_AddStringToObject(p, "tunable", tunable_names[r->points[i].tunable]);
      cJSON_AddStringToObject(p, "value", v);
      cJSON_AddNumberToObject(p, "ms", r->points[i].ms);
      cJSON_AddNumberToObject(p, "relative", r->points[i].relative);
      cJSON_AddItemToArray(pts, p);
    }
    cJSON_AddItemToObject(x, "points", pts);
    cJSON_AddItemToArray(list, x);
  }
  return list;
}

static int write_json(const char *path, cJSON *doc) {
  char *text = cJSON_Print(doc);
  FILE *f = text ? fopen(path, "w") : NULL;
  int rc = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF ? 0 : -1;
  if (f && fclose(f)) rc = -1;
  cJSON_free(text);
  return rc;
}

static bool have_gnuplot(void) {
  const char *path = getenv("PATH");
  char dir[1024];
  while (path && *path) {
    const char *colon = strchr(path, ':');
    const size_t n = colon ? (size_t)(colon - path) : strlen(path);
    snprintf(dir, sizeof dir, "%.*s/gnuplot", (int)n, path);
    if (n && access(dir, X_OK) == 0) return true;
    path = colon ? colon + 1 : NULL;
  }
  return false;
}

/* Time against each tunable, relative to the tunable at its default, one panel per tunable. */
static void plot(const options *o, const bucket_result *res, int n, const char *title) {
  const char *dat = join(o->out_dir, "sweep.dat"), *png = join(o->out_dir, "sweep.png");
  if (!have_gnuplot()) {
    printf("\nplot: skipped, gnuplot is not installed (apt-get install gnuplot-nox); the data is in %s\n",
           join(o->out_dir, "sweep.json"));
    return;
  }
  FILE *f = fopen(dat, "w");
  if (!f) {
    printf("\nplot: skipped, cannot write %s: %s\n", dat, strerror(errno));
    return;
  }
  /* index t * n + b: tunable t of bucket b, points in candidate order */
  for (int t = 0; t < NUM_TUNABLES; t++)
    for (int b = 0; b < n; b++) {
      fprintf(f, "# %s, bucket %d\n", tunable_names[t], b);
      for (int i = 0; i < o->num_cand[t]; i++)
        for (int k = 0; k < res[b].num_points; k++)
          if (res[b].points[k].tunable == t && res[b].points[k].index == i) {
            char v[32];
            value_label(o, t, i, v, sizeof v);
            fprintf(f, "\"%s\" %.4f %.4f\n", v, res[b].points[k].ms, res[b].points[k].relative);
            break;
          }
      fprintf(f, "\n\n");
    }
  fclose(f);
  FILE *g = popen("gnuplot 2>&1", "w");
  if (!g) {
    printf("\nplot: skipped, cannot run gnuplot: %s\n", strerror(errno));
    return;
  }
  fprintf(g, "set terminal pngcairo size 1400,1000 noenhanced font ',10'\nset output '%s'\n", png);
  fprintf(g, "set multiplot layout 2,2 title '%s'\nset grid ytics\nset key top left\nset offsets 0.3,0.3,0,0\n", title);
  fprintf(g, "set ylabel 'time / time at the default'\nnames = \"");
  for (int b = 0; b < n; b++)
    fprintf(g, "%s%d:%d:%s", b ? " " : "", res[b].b.block_size, res[b].b.head_dim, uattn_dtype_name(res[b].b.dtype));
  fprintf(g, "\"\n");
  for (int t = 0; t < NUM_TUNABLES; t++)
    fprintf(g,
            "set title '%s'\nset xlabel '%s'\nplot for [b=0:%d] '%s' index (%d*%d+b) using 0:3:xtic(1) "
            "with linespoints pt 7 title word(names, b+1)\n",
            tunable_names[t], t == T_SPLIT ? "split_min_keys/split_keys" : tunable_names[t], n - 1, dat, t, n);
  fprintf(g, "unset multiplot\n");
  if (pclose(g) != 0)
    printf("\nplot: gnuplot failed; the data is in %s\n", dat);
  else
    printf("\nplot: %s\n", png);
}

/* ---- main ------------------------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  options o;
  if (sweep_parse_options(argc, argv, &o)) return 2;
  /* the sweep times explicit values: a tuning file would only blur which is which */
  unsetenv("UATTN_TUNING_FILE");
  if (mkdir(o.out_dir, 0777) && errno != EEXIST) {
    fprintf(stderr, "uattn-sweep: cannot create %s: %s\n", o.out_dir, strerror(errno));
    return 2;
  }

  sweep_workload w;
  char err[600];
  if (o.trace_file) {
    if (sweep_workload_load(&w, o.trace_file, err, sizeof err)) {
      fprintf(stderr, "uattn-sweep: %s\n", err);
      return 2;
    }
  } else {
    trace_config tc = trace_config_default(16, 1 << 20, o.seqs, o.tokens, o.max_len);
    tc.system_prompt_len = o.prefix;
    tc.prompt_min = 32;
    tc.prompt_max = o.max_len / 8;
    tc.output_min = 32;
    tc.output_max = o.max_len / 4;
    tc.arrivals_per_step = 2;
    tc.seed = o.seed;
    if (sweep_workload_generate(&w, &tc, o.skip, o.stride, o.steps, err, sizeof err)) {
      fprintf(stderr, "uattn-sweep: %s\n", err);
      return 2;
    }
  }
  if (sweep_workload_save(&w, join(o.out_dir, "trace.json")))
    fprintf(stderr, "uattn-sweep: cannot write %s: %s\n", join(o.out_dir, "trace.json"), strerror(errno));

  uattn_tuning_host host;
  uattn_tuning_host_get(&host);
  printf("uattn %s sweep on %s \"%s\", the %s kernel set, %ld CPUs online\n", uattn_version(), host.cpu_vendor,
         host.cpu_model, host.kernel_set, sysconf(_SC_NPROCESSORS_ONLN));
  int64_t request_steps = 0;
  for (int32_t i = 0; i < w.num_steps; i++) request_steps += w.steps[i].num_reqs;
  printf(
      "workload: %s, %d steps, %lld query tokens (%lld prefill, %lld decode, %lld verification rows), "
      "%.0f cached keys per request a step; %d query / %d KV heads; median of %d passes\n",
      w.source, w.num_steps, (long long)w.query_tokens, (long long)w.prefill_tokens, (long long)w.decode_rows,
      (long long)w.verify_rows, (double)w.context_keys / (double)request_steps, o.hq, o.hkv, o.runs);

  progress pr = {0, 0, 0, perf_seconds(), isatty(STDERR_FILENO)};
  int per_bucket = 2 * 2; /* the head-to-head at the end, twice the passes */
  for (int t = 0; t < NUM_TUNABLES; t++) per_bucket += o.num_cand[t];
  pr.total = per_bucket * o.num_buckets * o.runs;

  bucket_result *res = calloc((size_t)o.num_buckets, sizeof *res);
  uattn_tuning_entry entries[MAX_BUCKETS];
  int rc = res ? 0 : 1;
  for (int b = 0; b < o.num_buckets && rc == 0; b++) {
    bench be;
    if (bench_init(&be, &o, &w, o.buckets[b]) || sweep_bucket(&be, &pr, &res[b])) rc = 1;
    bench_free(&be);
    if (rc == 0) entries[b] = entry_of(&o, &res[b]);
  }
  if (pr.tty) fprintf(stderr, "\n");
  if (rc) {
    fprintf(stderr, "uattn-sweep: stopped\n");
    free(res);
    sweep_workload_free(&w);
    return rc;
  }
  printf("sweep: %d passes over the workload in %.1f s\n", pr.passes, perf_seconds() - pr.start);
  for (int b = 0; b < o.num_buckets; b++) print_result(&o, &res[b]);

  /* the padding of batch-bucket sets, over the first bucket's block size */
  sweep_layout layout;
  cJSON *buckets_json = NULL;
  if (sweep_layout_build(&layout, &w, o.buckets[0].block_size) == 0) {
    buckets_json = sweep_batch_buckets(&w, &layout, stdout);
    sweep_layout_free(&layout);
  }

  /* the tuning file, with the workload it was tuned on */
  cJSON *workload = sweep_workload_json(&w);
  cJSON_AddNumberToObject(workload, "num_q_heads", o.hq);
  cJSON_AddNumberToObject(workload, "num_kv_heads", o.hkv);
  cJSON_AddNumberToObject(workload, "runs", o.runs);
  cJSON_AddNumberToObject(workload, "min_gain", o.min_gain);
  char *workload_text = cJSON_PrintUnformatted(workload);
  char tuning[1024];
  snprintf(tuning, sizeof tuning, "%s", join(o.out_dir, "tuning.json"));
  if (uattn_tuning_write(tuning, entries, o.num_buckets, workload_text, NULL) != UATTN_OK) {
    fprintf(stderr, "uattn-sweep: %s\n", uattn_last_error());
    rc = 1;
  }
  cJSON_free(workload_text);

  cJSON *doc = cJSON_CreateObject();
  cJSON_AddItemToObject(doc, "workload", workload);
  cJSON_AddItemToObject(doc, "buckets", results_json(&o, res, o.num_buckets));
  if (buckets_json) cJSON_AddItemToObject(doc, "batch_buckets", buckets_json);
  if (write_json(join(o.out_dir, "sweep.json"), doc)) {
    fprintf(stderr, "uattn-sweep: cannot write %s\n", join(o.out_dir, "sweep.json"));
    rc = 1;
  }
  cJSON_Delete(doc);

  if (o.plot) {
    char title[700];
    snprintf(title, sizeof title, "uattn-sweep: %s \"%s\", %s kernels; %s workload, %d steps", host.cpu_vendor,
             host.cpu_model, host.kernel_set, w.source, w.num_steps);
    for (char *p = title; *p; p++)
      if (*p == '\'') *p = ' ';
    plot(&o, res, o.num_buckets, title);
  }

  /* the file loads back: what a runtime reports with it */
  uattn_runtime_config one = uattn_runtime_config_default();
  one.num_threads = 1;
  uattn_runtime *rt;
  if (rc == 0 && uattn_runtime_create(&one, &rt) == UATTN_OK) {
    if (uattn_runtime_load_tuning(rt, tuning) != UATTN_OK) {
      fprintf(stderr, "uattn-sweep: the file just written does not load: %s\n", uattn_last_error());
      rc = 1;
    }
    size_t len = 0;
    uattn_runtime_tuning_report(rt, NULL, 0, &len);
    char *text = malloc(len + 1);
    if (text && uattn_runtime_tuning_report(rt, text, len + 1, &len) == UATTN_OK) printf("\n%s", text);
    free(text);
    uattn_runtime_destroy(rt);
  }
  printf("\nuse it: UATTN_TUNING_FILE=%s (or uattn_runtime_load_tuning); the workload: %s\n", tuning,
         join(o.out_dir, "trace.json"));
  free(res);
  sweep_workload_free(&w);
  return rc;
}
