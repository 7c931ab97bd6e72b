/* uattn-run: replays one attention step dumped from an engine (a STEP.json and its .npy tensors), so a
 * mismatch or a slow step seen in production can be reproduced, inspected and timed outside the engine.
 *
 * It plans the step exactly as described (limits taken from the step itself, no bucketing), runs
 * uattn_forward on copies of the caches, and writes the output, the lse, the updated caches and the plan's
 * metadata. Every problem is one line on stderr naming the JSON key or the file, and exit status 2: an
 * engine developer fixes the dump, not this tool. The step's reading and checks are in step.c. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/npy.h"
#include "common/timing.h"
#include "convert.h"
#include "run/step.h"
#include "uattn.h"

#define EXIT_BAD 2

static const char usage_text[] =
    "usage: uattn-run STEP.json --out DIR [--repeat N] [--dump-biases]\n"
    "\n"
    "Replays one attention step dumped from an engine: plans it with uattn's planner (limits from the step,\n"
    "no bucketing), runs uattn_forward on copies of the caches and writes to DIR:\n"
    "  out.npy [T, Hq, D] f32, lse.npy [T, Hq] f32, key_cache.npy and value_cache.npy (after this step's\n"
    "  update, in the cache dtype and layout), plan.json (the planner's metadata)\n"
    "\n"
    "  --out DIR       where to write (created if missing)\n"
    "  --repeat N      plan and run the step N more times on scratch caches; writes timing.json with the\n"
    "                  median plan and forward times in ms\n"
    "  --dump-biases   also write the seed-format tensors: causal_bias, shared_bias, shared_usage,\n"
    "                  unique_bias, unique_block_mapping, shared_blocks (.npy)\n"
    "  -h, --help      this text\n"
    "\n"
    "STEP.json keys: block_size num_blocks num_q_heads num_kv_heads head_dim dtype (f32|bf16|f16) cache_dtype\n"
    "(f32|bf16|f16|fp8_e4m3|fp8_e5m2) kv_layout (NHD|HND) scale soft_cap sliding_window attn_type\n"
    "(decoder|encoder) [causal_width chunk_size threads k_scale v_scale] requests [{num_computed num_scheduled\n"
    "num_prompt block_table [draft_tokens]}] tensors {q k v key_cache value_cache [sinks alibi_slopes]}; tensor\n"
    "paths are relative to STEP.json. bf16 tensors are <u2 arrays of their bits, fp8 caches |u1 arrays of\n"
    "theirs; k_scale and v_scale (fp8 caches: the cache holds fp8(x / scale)) default to 1, finite and > 0.\n"
    "Exit status: 0, or 2 with one line on stderr naming the key or file at fault.\n";

/* ---- errors ------------------------------------------------------------------------------------------ */

static char error_line[2048];

/* Records the first failure; callers return -1 and unwind, and main prints it once. */
static int fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(error_line, sizeof error_line, fmt, ap);
  va_end(ap);
  return -1;
}

static int fail_lib(const char *call, uattn_status st) {
  return fail("%s: %s (%s)", call, uattn_last_error(), uattn_status_name(st));
}

/* ---- the run ------------------------------------------------------------------------------------------ */

typedef struct run {
  /* options */
  const char *json_path, *out_dir;
  int repeat;
  bool dump_biases;

  step s;                        /* STEP.json and its tensors (step.h) */
  void *key_cache, *value_cache; /* the copies uattn_forward updates */
  void *out;
  float *lse, *out_f32;

  uattn_plan *plan;
  uattn_runtime *rt;
} run;

static void run_free(run *r) {
  step_free(&r->s);
  free(r->key_cache);
  free(r->value_cache);
  free(r->out);
  free(r->lse);
  free(r->out_f32);
  uattn_plan_destroy(r->plan);
  uattn_runtime_destroy(r->rt);
}

/* Workers the runtime really has (the step's "threads", or the default when absent). */
static int32_t runtime_workers(const uattn_runtime *rt) {
  uattn_topology topo;
  return uattn_runtime_get_topology(rt, &topo) == UATTN_OK ? topo.num_workers : 0;
}

/* ---- output ------------------------------------------------------------------------------------------ */

static int mkdirs(const char *dir) {
  char *p = strdup(dir);
  if (!p) return fail("--out %s: out of memory", dir);
  for (char *s = p + 1;; s++) {
    const bool last = *s == '\0';
    if (*s == '/' || last) {
      *s = '\0';
      if (mkdir(p, 0777) != 0 && errno != EEXIST) {
        fail("--out %s: cannot create %s: %s", dir, p, strerror(errno));
        free(p);
        return -1;
      }
      if (last) break;
      *s = '/';
    }
  }
  free(p);
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return fail("--out %s: not a directory", dir);
  return 0;
}

static int write_npy(const run *r, const char *name, npy_dtype dtype, int ndim, const int64_t *shape,
                     const void *data) {
  char path[4096], err[512];
  snprintf(path, sizeof path, "%s/%s", r->out_dir, name);
  if (npy_write(path, dtype, ndim, shape, data, err, sizeof err)) return fail("%s: %s", path, err);
  return 0;
}

static cJSON *int_array(const int32_t *x, int32_t n) {
  cJSON *a = cJSON_CreateArray();
  for (int32_t i = 0; a && i < n; i++)
    if (!cJSON_AddItemToArray(a, cJSON_CreateNumber(x[i]))) {
      cJSON_Delete(a);
      return NULL;
    }
  return a;
}

/* Adds item to obj under name; false (and item freed) when either is missing. */
static bool add(cJSON *obj, const char *name, cJSON *item) {
  if (!item) return false;
  if (!cJSON_AddItemToObject(obj, name, item)) {
    cJSON_Delete(item);
    return false;
  }
  return true;
}

static int write_json(const run *r, const char *name, const cJSON *root) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", r->out_dir, name);
  char *text = cJSON_Print(root);
  if (!text) return fail("%s: out of memory", path);
  FILE *f = fopen(path, "w");
  if (!f) {
    cJSON_free(text);
    return fail("%s: cannot create: %s", path, strerror(errno));
  }
  const bool ok = fputs(text, f) >= 0 && fputc('\n', f) != EOF;
  cJSON_free(text);
  if (fclose(f) != 0 || !ok) return fail("%s: cannot write", path);
  return 0;
}

static cJSON *slots_array(const uattn_plan_info *in) {
  cJSON *a = cJSON_CreateArray();
  for (int32_t t = 0; a && t < in->num_tokens; t++)
    if (!cJSON_AddItemToArray(a, cJSON_CreateNumber((double)in->slot_mapping[t]))) {
      cJSON_Delete(a);
      a = NULL;
    }
  return a;
}

/* One row of a plan table: a unique block, a shared span, ... */
typedef int row_fn(const uattn_plan_info *in, int32_t k, int32_t *row); /* the row's width */

/* n rows of the plan as an array of integer arrays. */
static cJSON *rows_array(const uattn_plan_info *in, int32_t n, row_fn *fill) {
  cJSON *a = cJSON_CreateArray();
  for (int32_t k = 0; a && k < n; k++) {
    int32_t row[8];
    const int width = fill(in, k, row);
    if (!cJSON_AddItemToArray(a, int_array(row, width))) {
      cJSON_Delete(a);
      a = NULL;
    }
  }
  return a;
}

static int unique_row(const uattn_plan_info *in, int32_t k, int32_t *row) {
  const uattn_unique_block *u = &in->unique_blocks[k];
  row[0] = u->block, row[1] = u->token, row[2] = u->block_start, row[3] = u->usage;
  return 4;
}

/* Not asked for, but the spans are how shared blocks are read: what one needs to follow a row. */
static int span_row(const uattn_plan_info *in, int32_t k, int32_t *row) {
  const uattn_shared_span *s = &in->shared_spans[k];
  row[0] = s->shared_index, row[1] = s->req, row[2] = s->block_start, row[3] = s->token_begin, row[4] = s->token_end;
  return 5;
}

static cJSON *bucket_object(const uattn_bucket *b) {
  cJSON *o = cJSON_CreateObject();
  if (o && cJSON_AddNumberToObject(o, "query_len", b->query_len) &&
      cJSON_AddNumberToObject(o, "shared_blocks", b->shared_blocks) &&
      cJSON_AddNumberToObject(o, "unique_blocks", b->unique_blocks) && cJSON_AddNumberToObject(o, "logits", b->logits))
    return o;
  cJSON_Delete(o);
  return NULL;
}

static int write_plan_json(const run *r, const uattn_plan_info *in) {
  cJSON *root = cJSON_CreateObject();
  /* each item is built only once the ones before it are in place, so a failure leaks nothing */
  const bool ok = root && cJSON_AddNumberToObject(root, "num_tokens", in->num_tokens) &&
                  cJSON_AddNumberToObject(root, "num_reqs", in->num_reqs) &&
                  add(root, "num_scheduled", int_array(in->num_scheduled, in->num_reqs)) &&
                  add(root, "slot_mapping", slots_array(in)) &&
                  add(root, "token_positions", int_array(in->token_positions, in->num_tokens)) &&
                  add(root, "token_context_lens", int_array(in->token_context_lens, in->num_tokens)) &&
                  add(root, "logits_indices", int_array(in->logits_indices, in->num_logits)) &&
                  add(root, "logits_groups", int_array(in->logits_groups, in->num_logits)) &&
                  add(root, "new_token_positions", int_array(in->new_token_positions, in->num_logits)) &&
                  add(root, "query_start_loc", int_array(in->query_start_loc, in->num_reqs + 1)) &&
                  add(root, "seq_lens", int_array(in->seq_lens, in->num_reqs)) &&
                  add(root, "shared_blocks", int_array(in->shared_blocks, in->num_shared_blocks)) &&
                  add(root, "shared_spans", rows_array(in, in->num_shared_spans, span_row)) &&
                  add(root, "unique_blocks", rows_array(in, in->num_unique_blocks, unique_row)) &&
                  add(root, "bucket", bucket_object(&in->padded));
  const int rc = ok ? write_json(r, "plan.json", root) : fail("plan.json: out of memory");
  cJSON_Delete(root);
  return rc;
}

static int write_outputs(run *r) {
  const int64_t T = r->s.num_tokens, hq = r->s.hq, d = r->s.head_dim;
  const size_t n = (size_t)T * (size_t)hq * (size_t)d;
  const float *out = r->out;
  if (r->s.dtype != UATTN_F32) {
    if (!(r->out_f32 = malloc(sizeof(float) * (n ? n : 1)))) return fail("out.npy: out of memory");
    uattn_widen(r->s.dtype, r->out, r->out_f32, n);
    out = r->out_f32;
  }
  const int64_t out_shape[] = {T, hq, d}, lse_shape[] = {T, hq};
  const npy_array *kc = &r->s.t[STEP_KEY_CACHE].a;
  if (write_npy(r, "out.npy", NPY_F4, 3, out_shape, out) || write_npy(r, "lse.npy", NPY_F4, 2, lse_shape, r->lse) ||
      write_npy(r, "key_cache.npy", kc->dtype, kc->ndim, kc->shape, r->key_cache) ||
      write_npy(r, "value_cache.npy", kc->dtype, kc->ndim, kc->shape, r->value_cache))
    return -1;
  return 0;
}

/* The seed-format tensors. The shared bias goes alone first: the planner refuses it above its byte limit,
 * and that refusal must not cost the others. */
static int dump_biases(run *r) {
  uattn_seed_tensors s;
  const int64_t bs = r->s.block_size;
  uattn_status st = uattn_plan_materialize(r->plan, UATTN_SEED_SHARED_BIAS, &s);
  if (st == UATTN_ERR_TOO_LARGE) {
    fprintf(stderr, "uattn-run: warning: shared_bias.npy skipped (UATTN_ERR_TOO_LARGE): %s\n", uattn_last_error());
  } else if (st != UATTN_OK) {
    return fail_lib("uattn_plan_materialize", st);
  } else {
    const int64_t shape[] = {s.shape.query_len, s.shape.shared_blocks, bs};
    if (write_npy(r, "shared_bias.npy", NPY_F4, 3, shape, s.shared_bias)) return -1;
  }
  st = uattn_plan_materialize(r->plan, UATTN_SEED_CAUSAL_BIAS | UATTN_SEED_SHARED_USAGE | UATTN_SEED_UNIQUE_BIAS, &s);
  if (st != UATTN_OK) return fail_lib("uattn_plan_materialize", st);
  const int64_t tq = s.shape.query_len, ts = s.shape.shared_blocks, tu = s.shape.unique_blocks;
  const int64_t causal[] = {tq, tq}, usage[] = {tq, ts}, ubias[] = {tu, bs}, umap[] = {tu}, shared[] = {ts};
  if (write_npy(r, "causal_bias.npy", NPY_F4, 2, causal, s.causal_bias) ||
      write_npy(r, "shared_usage.npy", NPY_I4, 2, usage, s.shared_usage) ||
      write_npy(r, "unique_bias.npy", NPY_F4, 2, ubias, s.unique_bias) ||
      write_npy(r, "unique_block_mapping.npy", NPY_I4, 1, umap, s.unique_block_mapping))
    return -1;
  /* padded to the bucket like the other seed tensors, with the seed's -1 for a missing id */
  uattn_plan_info in;
  uattn_plan_get_info(r->plan, &in);
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)(ts ? ts : 1));
  if (!ids) return fail("shared_blocks.npy: out of memory");
  for (int64_t i = 0; i < ts; i++) ids[i] = i < in.num_shared_blocks ? in.shared_blocks[i] : -1;
  const int rc = write_npy(r, "shared_blocks.npy", NPY_I4, 1, shared, ids);
  free(ids);
  return rc;
}

/* ---- running ------------------------------------------------------------------------------------------ */

static uattn_step make_step(const run *r) {
  uattn_step s;
  memset(&s, 0, sizeof s);
  s.num_reqs = r->s.num_reqs;
  s.num_computed = r->s.num_computed;
  s.num_scheduled = r->s.num_scheduled;
  s.num_prompt = r->s.num_prompt;
  s.block_table = r->s.table;
  s.block_table_stride = r->s.stride;
  s.draft_tokens = r->s.drafts;
  s.draft_offsets = r->s.draft_offsets;
  return s;
}

static uattn_layer make_layer(const run *r) {
  uattn_layer l;
  memset(&l, 0, sizeof l);
  l.num_q_heads = r->s.hq;
  l.num_kv_heads = r->s.hkv;
  l.head_dim = r->s.head_dim;
  l.scale = r->s.scale;
  l.soft_cap = r->s.soft_cap;
  l.sliding_window = r->s.sliding_window;
  l.dtype = r->s.dtype;
  l.cache_dtype = r->s.cache_dtype;
  l.kv_layout = r->s.layout;
  l.attn_type = r->s.attn_type;
  l.sinks = r->s.t[STEP_SINKS].a.data;
  l.alibi_slopes = r->s.t[STEP_ALIBI].a.data;
  l.causal_width = r->s.causal_width;
  l.chunk_size = r->s.chunk_size;
  l.k_scale = r->s.k_scale;
  l.v_scale = r->s.v_scale;
  return l;
}

static int execute(run *r) {
  uattn_plan_config pc =
      uattn_plan_config_default(r->s.block_size, r->s.num_blocks, r->s.num_reqs, r->s.num_tokens, r->s.max_model_len);
  pc.chunk_size = r->s.chunk_size;
  if (mkdirs(r->out_dir)) return -1;
  uattn_status st = uattn_plan_create(&pc, &r->plan);
  if (st) return fail_lib("uattn_plan_create", st);
  const uattn_step batch = make_step(r);
  if ((st = uattn_plan_step(r->plan, &batch))) return fail_lib("uattn_plan_step", st);
  uattn_plan_info in;
  uattn_plan_get_info(r->plan, &in);
  if (in.num_tokens != r->s.num_tokens) /* the shapes were checked against our reading of the draft rule */
    return fail("requests: the planner schedules %d tokens, the runner expected %d (uattn-run bug)", in.num_tokens,
                r->s.num_tokens);

  const size_t rows = (size_t)r->s.num_tokens * (size_t)r->s.hq;
  const size_t cache_bytes = r->s.t[STEP_KEY_CACHE].a.count * uattn_dtype_size(r->s.cache_dtype);
  r->key_cache = malloc(cache_bytes ? cache_bytes : 1);
  r->value_cache = malloc(cache_bytes ? cache_bytes : 1);
  r->out = malloc(rows * (size_t)r->s.head_dim * uattn_dtype_size(r->s.dtype) + 1);
  r->lse = malloc(sizeof(float) * rows + 1);
  if (!r->key_cache || !r->value_cache || !r->out || !r->lse) return fail("out of memory for the outputs");
  memcpy(r->key_cache, r->s.t[STEP_KEY_CACHE].a.data, cache_bytes);
  memcpy(r->value_cache, r->s.t[STEP_VALUE_CACHE].a.data, cache_bytes);

  const uattn_layer layer = make_layer(r);
  uattn_tensors t;
  memset(&t, 0, sizeof t);
  t.q = r->s.t[STEP_Q].a.data;
  t.k = r->s.t[STEP_K].a.data;
  t.v = r->s.t[STEP_V].a.data;
  t.key_cache = r->key_cache;
  t.value_cache = r->value_cache;
  t.num_blocks = r->s.num_blocks;
  t.block_size = r->s.block_size;
  t.out = r->out;
  t.lse = r->lse;
  uattn_runtime_config rt_config = uattn_runtime_config_default();
  rt_config.num_threads = r->s.threads;
  if ((st = uattn_runtime_create(&rt_config, &r->rt))) return fail_lib("uattn_runtime_create", st);
  if ((st = uattn_forward(r->plan, &layer, &t, r->rt))) return fail_lib("uattn_forward", st);

  if (write_outputs(r) || write_plan_json(r, &in)) return -1;
  if (r->dump_biases && dump_biases(r)) return -1;
  printf(
      "uattn-run: %d requests, %d query rows, %d sampled; %d shared blocks (%d spans), %d unique blocks; "
      "wrote %s\n",
      in.num_reqs, in.num_tokens, in.num_logits, in.num_shared_blocks, in.num_shared_spans, in.num_unique_blocks,
      r->out_dir);
  if (!r->repeat) return 0;

  /* the timed runs start from the step's own caches each time, in the same buffers: the files are written */
  double *plan_ms = malloc(sizeof(double) * (size_t)r->repeat), *fwd_ms = malloc(sizeof(double) * (size_t)r->repeat);
  int rc = -1;
  if (!plan_ms || !fwd_ms) {
    fail("--repeat: out of memory");
    goto done;
  }
  for (int i = 0; i < r->repeat; i++) {
    memcpy(r->key_cache, r->s.t[STEP_KEY_CACHE].a.data, cache_bytes);
    memcpy(r->value_cache, r->s.t[STEP_VALUE_CACHE].a.data, cache_bytes);
    const double t0 = (perf_seconds() * 1e3);
    if ((st = uattn_plan_step(r->plan, &batch))) {
      fail_lib("uattn_plan_step (repeat)", st);
      goto done;
    }
    const double t1 = (perf_seconds() * 1e3);
    if ((st = uattn_forward(r->plan, &layer, &t, r->rt))) {
      fail_lib("uattn_forward (repeat)", st);
      goto done;
    }
    plan_ms[i] = t1 - t0;
    fwd_ms[i] = (perf_seconds() * 1e3) - t1;
  }
  cJSON *timing = cJSON_CreateObject();
  if (!timing || !cJSON_AddNumberToObject(timing, "forward_ms", perf_median(fwd_ms, r->repeat)) ||
      !cJSON_AddNumberToObject(timing, "plan_ms", perf_median(plan_ms, r->repeat)) ||
      !cJSON_AddNumberToObject(timing, "repeat", r->repeat) ||
      !cJSON_AddNumberToObject(timing, "threads", runtime_workers(r->rt))) {
    cJSON_Delete(timing);
    fail("timing.json: out of memory");
    goto done;
  }
  rc = write_json(r, "timing.json", timing);
  if (!rc)
    printf("uattn-run: median of %d runs: plan %.3f ms, forward %.3f ms\n", r->repeat,
           cJSON_GetObjectItem(timing, "plan_ms")->valuedouble, cJSON_GetObjectItem(timing, "forward_ms")->valuedouble);
  cJSON_Delete(timing);
done:
  free(plan_ms);
  free(fwd_ms);
  return rc;
}

/* ---- main --------------------------------------------------------------------------------------------- */

static int bad_usage(const char *fmt, const char *arg) {
  fputs("uattn-run: ", stderr);
  fprintf(stderr, fmt, arg);
  fputs("\n", stderr);
  fputs(usage_text, stderr);
  return EXIT_BAD;
}

int main(int argc, char **argv) {
  run r;
  memset(&r, 0, sizeof r);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      fputs(usage_text, stdout);
      return 0;
    } else if (strcmp(a, "--dump-biases") == 0) {
      r.dump_biases = true;
    } else if (strcmp(a, "--out") == 0 || strncmp(a, "--out=", 6) == 0) {
      const char *v = a[5] == '=' ? a + 6 : (i + 1 < argc ? argv[++i] : NULL);
      if (!v || !*v) return bad_usage("%s needs a directory", "--out");
      r.out_dir = v;
    } else if (strcmp(a, "--repeat") == 0 || strncmp(a, "--repeat=", 9) == 0) {
      const char *v = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[++i] : NULL);
      char *end = NULL;
      errno = 0;
      const long n = v ? strtol(v, &end, 10) : 0;
      if (!v || end == v || *end || errno || n < 1 || n > 1000000)
        return bad_usage("--repeat: '%s' is not a count in [1, 1000000]", v ? v : "");
      r.repeat = (int)n;
    } else if (a[0] == '-' && a[1]) {
      return bad_usage("unknown option %s", a);
    } else if (r.json_path) {
      return bad_usage("one STEP.json only (also got %s)", a);
    } else {
      r.json_path = a;
    }
  }
  if (!r.json_path) return bad_usage("%smissing STEP.json", "");
  if (!r.out_dir) return bad_usage("%smissing --out DIR", "");

  const int rc = step_read(&r.s, r.json_path, error_line, sizeof error_line) || execute(&r);
  if (rc) fprintf(stderr, "uattn-run: %s\n", error_line);
  run_free(&r);
  return rc ? EXIT_BAD : 0;
}
