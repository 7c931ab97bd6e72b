/* uattn-run: replays one attention step dumped from an engine (a STEP.json and its .npy tensors), so a
 * mismatch or a slow step seen in production can be reproduced, inspected and timed outside the engine.
 *
 * It plans the step exactly as described (limits taken from the step itself, no bucketing), runs
 * uattn_forward on copies of the caches, and writes the output, the lse, the updated caches and the plan's
 * metadata. Every problem is one line on stderr naming the JSON key or the file, and exit status 2: an
 * engine developer fixes the dump, not this tool. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/npy.h"
#include "common/timing.h"
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
    "STEP.json keys: block_size num_blocks num_q_heads num_kv_heads head_dim dtype cache_dtype (f32|bf16|f16)\n"
    "kv_layout (NHD|HND) scale soft_cap sliding_window attn_type (decoder|encoder) [causal_width chunk_size\n"
    "threads] requests [{num_computed num_scheduled num_prompt block_table [draft_tokens]}] tensors {q k v\n"
    "key_cache value_cache [sinks alibi_slopes]}; tensor paths are relative to STEP.json.\n"
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

/* ---- the step, as read ------------------------------------------------------------------------------- */

typedef struct tensor_in {
  const char *key; /* "q", ... as in "tensors" */
  bool optional;
  char *path;
  npy_array a;
} tensor_in;

enum { T_Q, T_K, T_V, T_KC, T_VC, T_SINKS, T_ALIBI, T_COUNT };

typedef struct run {
  /* options */
  const char *json_path, *out_dir;
  int repeat;
  bool dump_biases;

  cJSON *root;
  int32_t block_size, num_blocks, hq, hkv, head_dim;
  uattn_dtype dtype, cache_dtype;
  uattn_kv_layout layout;
  uattn_attention_type attn_type;
  float scale, soft_cap;
  int32_t sliding_window, causal_width, chunk_size;
  int32_t threads; /* workers of the runtime; 0 (absent) = one per core, or $UATTN_NUM_THREADS */

  int32_t num_reqs, stride, num_tokens, max_model_len;
  int32_t *num_computed, *num_scheduled, *num_prompt, *table;
  int32_t *drafts, *draft_offsets; /* CSR; NULL when no request lists drafts */

  tensor_in t[T_COUNT];
  void *key_cache, *value_cache; /* the copies uattn_forward updates */
  void *out;
  float *lse, *out_f32;

  uattn_plan *plan;
  uattn_runtime *rt;
} run;

static void run_free(run *r) {
  cJSON_Delete(r->root);
  free(r->num_computed);
  free(r->num_scheduled);
  free(r->num_prompt);
  free(r->table);
  free(r->drafts);
  free(r->draft_offsets);
  for (int i = 0; i < T_COUNT; i++) {
    free(r->t[i].path);
    npy_free(&r->t[i].a);
  }
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

static size_t dtype_size(uattn_dtype d) { return d == UATTN_F32 ? 4 : 2; }
static npy_dtype npy_of(uattn_dtype d) { return d == UATTN_F32 ? NPY_F4 : d == UATTN_BF16 ? NPY_U2 : NPY_F2; }
static const char *dtype_name(uattn_dtype d) { return d == UATTN_F32 ? "f32" : d == UATTN_BF16 ? "bf16" : "f16"; }

/* ---- JSON access, every failure naming its key -------------------------------------------------------- */

/* Typos in optional keys would otherwise be silently ignored, so unknown keys are reported; duplicates are
 * refused because cJSON would quietly take the first. */
static int check_keys(const cJSON *obj, const char *where, const char *const *known, size_t n) {
  for (const cJSON *a = obj->child; a; a = a->next) {
    for (const cJSON *b = obj->child; b != a; b = b->next)
      if (strcmp(a->string, b->string) == 0) return fail("%s%s: key appears twice", where, a->string);
    size_t i = 0;
    while (i < n && strcmp(a->string, known[i]) != 0) i++;
    if (i == n) fprintf(stderr, "uattn-run: warning: ignoring unknown key %s%s\n", where, a->string);
  }
  return 0;
}

static const char *json_kind(const cJSON *x) {
  if (cJSON_IsNumber(x)) return "a number";
  if (cJSON_IsString(x)) return "a string";
  if (cJSON_IsBool(x)) return "a boolean";
  if (cJSON_IsNull(x)) return "null";
  if (cJSON_IsArray(x)) return "an array";
  if (cJSON_IsObject(x)) return "an object";
  return "invalid";
}

/* An integer in [lo, hi]; name is the full key path for messages. */
static int as_int(const cJSON *x, const char *name, int64_t lo, int64_t hi, int32_t *out) {
  if (!cJSON_IsNumber(x)) return fail("%s: must be an integer, got %s", name, json_kind(x));
  const double v = x->valuedouble;
  if (!isfinite(v) || v != floor(v)) return fail("%s: must be an integer, got %g", name, v);
  if (v < (double)lo) return fail("%s: %.0f must be >= %lld", name, v, (long long)lo);
  if (v > (double)hi) return fail("%s: %.0f is over %lld", name, v, (long long)hi);
  *out = (int32_t)v;
  return 0;
}

static int get_int(const cJSON *obj, const char *key, bool required, int32_t def, int64_t lo, int32_t *out) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!x) {
    if (required) return fail("%s: missing required key", key);
    *out = def;
    return 0;
  }
  return as_int(x, key, lo, INT32_MAX, out);
}

static int get_float(const cJSON *obj, const char *key, double lo, float *out) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!x) return fail("%s: missing required key", key);
  if (!cJSON_IsNumber(x)) return fail("%s: must be a number, got %s", key, json_kind(x));
  if (!isfinite(x->valuedouble) || x->valuedouble < lo || x->valuedouble > 3.4e38)
    return fail("%s: %g is not a usable value (finite, >= %g)", key, x->valuedouble, lo);
  *out = (float)x->valuedouble;
  return 0;
}

/* One of names[] (each "a|b" lists aliases), giving values[i]. */
static int get_choice(const cJSON *obj, const char *key, const char *const *names, const int *values, int n,
                      const char *allowed, int *out) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!x) return fail("%s: missing required key", key);
  if (!cJSON_IsString(x)) return fail("%s: must be a string (%s), got %s", key, allowed, json_kind(x));
  for (int i = 0; i < n; i++) {
    const char *p = names[i];
    const size_t len = strlen(x->valuestring);
    while (*p) {
      const char *bar = strchr(p, '|');
      const size_t seg = bar ? (size_t)(bar - p) : strlen(p);
      if (seg == len && strncmp(p, x->valuestring, len) == 0) {
        *out = values[i];
        return 0;
      }
      p += seg + (bar ? 1 : 0);
    }
  }
  return fail("%s: \"%s\" is not one of %s", key, x->valuestring, allowed);
}

static int get_dtype(const cJSON *obj, const char *key, uattn_dtype *out) {
  static const char *const names[] = {"f32|float32", "bf16|bfloat16", "f16|float16"};
  static const int values[] = {UATTN_F32, UATTN_BF16, UATTN_F16};
  int v;
  if (get_choice(obj, key, names, values, 3, "f32, bf16, f16", &v)) return -1;
  *out = (uattn_dtype)v;
  return 0;
}

/* A JSON array of integers in [lo, hi], as a fresh array (never NULL on success, even when empty). */
static int get_int_list(const cJSON *x, const char *name, int64_t lo, int64_t hi, int32_t **out, int32_t *count) {
  if (!cJSON_IsArray(x)) return fail("%s: must be an array of integers, got %s", name, json_kind(x));
  const int n = cJSON_GetArraySize(x);
  int32_t *v = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  if (!v) return fail("%s: out of memory", name);
  int i = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, x) {
    char elem[128];
    snprintf(elem, sizeof elem, "%s[%d]", name, i);
    if (as_int(e, elem, lo, hi, &v[i])) {
      free(v);
      return -1;
    }
    i++;
  }
  *out = v;
  *count = n;
  return 0;
}

/* ---- reading STEP.json ------------------------------------------------------------------------------- */

static char *read_text(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fail("%s: cannot open: %s", path, strerror(errno));
    return NULL;
  }
  char *text = NULL;
  size_t cap = 0, n = 0;
  for (;;) {
    if (n + 4096 + 1 > cap) {
      cap = cap ? cap * 2 : 65536;
      char *grown = realloc(text, cap);
      if (!grown) {
        free(text);
        fclose(f);
        fail("%s: out of memory", path);
        return NULL;
      }
      text = grown;
    }
    const size_t got = fread(text + n, 1, cap - n - 1, f);
    n += got;
    if (got == 0) break;
  }
  const bool bad = ferror(f);
  fclose(f);
  if (bad) {
    free(text);
    fail("%s: read error", path);
    return NULL;
  }
  text[n] = '\0';
  *len = n;
  return text;
}

static int parse_json(run *r) {
  size_t len = 0;
  char *text = read_text(r->json_path, &len);
  if (!text) return -1;
  const size_t nul = strlen(text);
  if (nul != len) {
    free(text);
    return fail("%s: malformed JSON: a NUL byte at offset %zu", r->json_path, nul);
  }
  const char *end = NULL;
  /* the length counts the terminating NUL: that is how cJSON tells the end from trailing garbage */
  r->root = cJSON_ParseWithLengthOpts(text, len + 1, &end, true);
  if (!r->root) {
    /* point at the line and column, which is what an editor needs */
    const char *at = end ? end : cJSON_GetErrorPtr();
    int line = 1, col = 1;
    if (at && at >= text && at <= text + len)
      for (const char *p = text; p < at; p++) {
        if (*p == '\n') line++, col = 1;
        else col++;
      }
    fail("%s: malformed JSON at line %d, column %d", r->json_path, line, col);
    free(text);
    return -1;
  }
  free(text);
  if (!cJSON_IsObject(r->root)) return fail("%s: the top level must be a JSON object", r->json_path);
  return 0;
}

static int read_config(run *r) {
  static const char *const known[] = {"block_size", "num_blocks", "num_q_heads", "num_kv_heads", "head_dim",
                                      "dtype", "cache_dtype", "kv_layout", "scale", "soft_cap", "sliding_window",
                                      "attn_type", "causal_width", "chunk_size", "threads", "requests", "tensors"};
  const cJSON *o = r->root;
  if (check_keys(o, "", known, sizeof known / sizeof *known)) return -1;
  if (get_int(o, "block_size", true, 0, 1, &r->block_size) || get_int(o, "num_blocks", true, 0, 1, &r->num_blocks) ||
      get_int(o, "num_q_heads", true, 0, 1, &r->hq) || get_int(o, "num_kv_heads", true, 0, 1, &r->hkv) ||
      get_int(o, "head_dim", true, 0, 1, &r->head_dim) || get_dtype(o, "dtype", &r->dtype) ||
      get_dtype(o, "cache_dtype", &r->cache_dtype))
    return -1;
  static const char *const layouts[] = {"NHD", "HND"};
  static const int layout_values[] = {UATTN_LAYOUT_NHD, UATTN_LAYOUT_HND};
  static const char *const types[] = {"decoder", "encoder"};
  /* "encoder" in a step dump is an encoder-only model's bidirectional self-attention over its own
   * requests (the encoder of an encoder-decoder model would need cross-attention inputs we do not take) */
  static const int type_values[] = {UATTN_ATTENTION_DECODER, UATTN_ATTENTION_ENCODER_ONLY};
  int layout, type;
  if (get_choice(o, "kv_layout", layouts, layout_values, 2, "NHD, HND", &layout) ||
      get_choice(o, "attn_type", types, type_values, 2, "decoder, encoder", &type))
    return -1;
  r->layout = (uattn_kv_layout)layout;
  r->attn_type = (uattn_attention_type)type;
  if (r->hq % r->hkv != 0)
    return fail("num_q_heads: %d is not a multiple of num_kv_heads (%d)", r->hq, r->hkv);
  if (get_float(o, "scale", -3.4e38, &r->scale) || get_float(o, "soft_cap", 0.0, &r->soft_cap) ||
      get_int(o, "sliding_window", true, 0, 0, &r->sliding_window) ||
      get_int(o, "causal_width", false, 0, 0, &r->causal_width) ||
      get_int(o, "chunk_size", false, 0, 0, &r->chunk_size) || get_int(o, "threads", false, 0, 1, &r->threads))
    return -1;
  return 0;
}

/* The scheduled tokens of a request after the planner's spec-decode rule (uattn.h, uattn_step), so the
 * tensor shapes and the plan's limits can be derived before planning. */
static int32_t effective_scheduled(int32_t reported, const int32_t *drafts, int32_t n) {
  if (n == 0) return reported;
  int32_t real = 0;
  for (int32_t i = 0; i < n; i++) real += drafts[i] != -1;
  return real + 1;
}

static int read_requests(run *r) {
  static const char *const known[] = {"num_computed", "num_scheduled", "num_prompt", "block_table", "draft_tokens"};
  const cJSON *reqs = cJSON_GetObjectItemCaseSensitive(r->root, "requests");
  if (!reqs) return fail("requests: missing required key");
  if (!cJSON_IsArray(reqs)) return fail("requests: must be an array of objects, got %s", json_kind(reqs));
  const int n = cJSON_GetArraySize(reqs);
  if (n == 0) return fail("requests: the step has no requests");
  r->num_reqs = n;
  r->num_computed = calloc((size_t)n, sizeof(int32_t));
  r->num_scheduled = calloc((size_t)n, sizeof(int32_t));
  r->num_prompt = calloc((size_t)n, sizeof(int32_t));
  r->draft_offsets = calloc((size_t)n + 1, sizeof(int32_t));
  int32_t **rows = calloc((size_t)n, sizeof *rows), **drafts = calloc((size_t)n, sizeof *drafts);
  int32_t *row_len = calloc((size_t)n, sizeof(int32_t)), *draft_len = calloc((size_t)n, sizeof(int32_t));
  int rc = -1;
  if (!r->num_computed || !r->num_scheduled || !r->num_prompt || !r->draft_offsets || !rows || !drafts ||
      !row_len || !draft_len) {
    fail("requests: out of memory");
    goto done;
  }

  int64_t total = 0, longest = 0;
  int32_t stride = 1, total_drafts = 0;
  const cJSON *q;
  int i = 0;
  cJSON_ArrayForEach(q, reqs) {
    char where[64], name[128];
    snprintf(where, sizeof where, "requests[%d].", i);
    if (!cJSON_IsObject(q)) {
      fail("requests[%d]: must be an object, got %s", i, json_kind(q));
      goto done;
    }
    if (check_keys(q, where, known, sizeof known / sizeof *known)) goto done;
    const char *ikeys[] = {"num_computed", "num_scheduled", "num_prompt"};
    int32_t *dst[] = {&r->num_computed[i], &r->num_scheduled[i], &r->num_prompt[i]};
    const int64_t mins[] = {0, 0, 1};
    for (int k = 0; k < 3; k++) {
      snprintf(name, sizeof name, "%s%s", where, ikeys[k]);
      const cJSON *x = cJSON_GetObjectItemCaseSensitive(q, ikeys[k]);
      if (!x) {
        fail("%s: missing required key", name);
        goto done;
      }
      if (as_int(x, name, mins[k], INT32_MAX, dst[k])) goto done;
    }
    snprintf(name, sizeof name, "%sblock_table", where);
    const cJSON *bt = cJSON_GetObjectItemCaseSensitive(q, "block_table");
    if (!bt) {
      fail("%s: missing required key", name);
      goto done;
    }
    /* -1 pads a row; everything the step reads is checked against num_blocks below */
    if (get_int_list(bt, name, -1, INT32_MAX, &rows[i], &row_len[i])) goto done;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(q, "draft_tokens");
    if (dt) {
      snprintf(name, sizeof name, "%sdraft_tokens", where);
      if (get_int_list(dt, name, -1, INT32_MAX, &drafts[i], &draft_len[i])) goto done;
    }
    const int32_t ns = effective_scheduled(r->num_scheduled[i], drafts[i], draft_len[i]);
    if (ns < 1) {
      fail("%snum_scheduled: a request schedules at least 1 token (got %d)", where, ns);
      goto done;
    }
    const int64_t seq_len = (int64_t)r->num_computed[i] + ns;
    if (seq_len > INT32_MAX) {
      fail("%snum_computed: num_computed + scheduled tokens (%d + %d) overflows int32", where,
           r->num_computed[i], ns);
      goto done;
    }
    const int64_t needed = (seq_len + r->block_size - 1) / r->block_size;
    if (row_len[i] < needed) {
      fail("%sblock_table: %d entries cover %lld positions; the request needs %lld (num_computed %d + %d "
           "scheduled, block_size %d)",
           where, row_len[i], (long long)row_len[i] * r->block_size, (long long)seq_len, r->num_computed[i], ns,
           r->block_size);
      goto done;
    }
    for (int64_t o = 0; o < needed; o++)
      if (rows[i][o] < 0 || rows[i][o] >= r->num_blocks) {
        fail("%sblock_table[%lld]: %d is not a block id in [0, num_blocks = %d)", where, (long long)o, rows[i][o],
             r->num_blocks);
        goto done;
      }
    total += ns;
    if (seq_len > longest) longest = seq_len;
    if (row_len[i] > stride) stride = row_len[i];
    if ((int64_t)total_drafts + draft_len[i] > INT32_MAX) {
      fail("%sdraft_tokens: too many drafts", where);
      goto done;
    }
    total_drafts += draft_len[i];
    r->draft_offsets[i + 1] = total_drafts;
    i++;
  }
  if (total > INT32_MAX) {
    fail("requests: %lld scheduled tokens overflow int32", (long long)total);
    goto done;
  }
  r->num_tokens = (int32_t)total;
  const int64_t bs = r->block_size;
  const int64_t mml = (longest + bs - 1) / bs * bs;
  r->max_model_len = (int32_t)(mml > INT32_MAX ? INT32_MAX / bs * bs : mml);

  /* one [R, stride] table, rows padded with -1 */
  r->stride = stride;
  r->table = malloc(sizeof(int32_t) * (size_t)n * (size_t)stride);
  if (total_drafts) r->drafts = malloc(sizeof(int32_t) * (size_t)total_drafts);
  if (!r->table || (total_drafts && !r->drafts)) {
    fail("requests: out of memory");
    goto done;
  }
  for (int k = 0; k < n; k++) {
    for (int32_t c = 0; c < stride; c++) r->table[(size_t)k * stride + c] = c < row_len[k] ? rows[k][c] : -1;
    if (draft_len[k]) memcpy(r->drafts + r->draft_offsets[k], drafts[k], sizeof(int32_t) * (size_t)draft_len[k]);
  }
  if (!total_drafts) { /* no spec-decode request: the plan's plain path */
    free(r->draft_offsets);
    r->draft_offsets = NULL;
  }
  rc = 0;
done:
  for (int k = 0; k < n; k++) {
    if (rows) free(rows[k]);
    if (drafts) free(drafts[k]);
  }
  free(rows);
  free(drafts);
  free(row_len);
  free(draft_len);
  return rc;
}

/* ---- tensors ------------------------------------------------------------------------------------------ */

/* path relative to the directory of the JSON file, unless absolute */
static char *resolve(const char *json_path, const char *rel) {
  const char *slash = strrchr(json_path, '/');
  const size_t dir = (rel[0] == '/' || !slash) ? 0 : (size_t)(slash - json_path) + 1;
  char *p = malloc(dir + strlen(rel) + 1);
  if (!p) return NULL;
  memcpy(p, json_path, dir);
  strcpy(p + dir, rel);
  return p;
}

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
  size_t len = (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < ndim && len < cap; d++)
    len += (size_t)snprintf(buf + len, cap - len, d ? ", %lld" : "%lld", (long long)shape[d]);
  if (len < cap) snprintf(buf + len, cap - len, "]");
}

static int check_tensor(const tensor_in *t, npy_dtype want, const char *dtype_key, const char *dtype_val, int ndim,
                        const int64_t *shape, const char *dims) {
  if (t->a.dtype != want) {
    if (dtype_key)
      return fail("tensors.%s: %s: dtype %s does not match %s \"%s\" (%s)", t->key, t->path,
                  npy_dtype_descr(t->a.dtype), dtype_key, dtype_val, npy_dtype_descr(want));
    return fail("tensors.%s: %s: dtype %s, expected %s (float32)", t->key, t->path, npy_dtype_descr(t->a.dtype),
                npy_dtype_descr(want));
  }
  bool same = t->a.ndim == ndim;
  for (int d = 0; same && d < ndim; d++) same = t->a.shape[d] == shape[d];
  if (!same) {
    char got[256], exp[256];
    format_shape(got, sizeof got, t->a.ndim, t->a.shape);
    format_shape(exp, sizeof exp, ndim, shape);
    return fail("tensors.%s: shape %s does not match %s (%s)", t->key, got, exp, dims);
  }
  return 0;
}

static int load_tensors(run *r) {
  static const char *const keys[T_COUNT] = {"q", "k", "v", "key_cache", "value_cache", "sinks", "alibi_slopes"};
  const cJSON *ts = cJSON_GetObjectItemCaseSensitive(r->root, "tensors");
  if (!ts) return fail("tensors: missing required key");
  if (!cJSON_IsObject(ts)) return fail("tensors: must be an object of file names, got %s", json_kind(ts));
  if (check_keys(ts, "tensors.", keys, T_COUNT)) return -1;
  for (int i = 0; i < T_COUNT; i++) {
    tensor_in *t = &r->t[i];
    t->key = keys[i];
    t->optional = i >= T_SINKS;
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(ts, t->key);
    if (!x) {
      if (t->optional) continue;
      return fail("tensors.%s: missing required key", t->key);
    }
    if (!cJSON_IsString(x) || !x->valuestring[0])
      return fail("tensors.%s: must be a file name, got %s", t->key, json_kind(x));
    if (!(t->path = resolve(r->json_path, x->valuestring))) return fail("tensors.%s: out of memory", t->key);
    char err[512];
    if (npy_read(t->path, &t->a, err, sizeof err)) return fail("tensors.%s: %s: %s", t->key, t->path, err);
  }

  const int64_t T = r->num_tokens, hq = r->hq, hkv = r->hkv, d = r->head_dim, nb = r->num_blocks,
                bs = r->block_size;
  const char *dt = dtype_name(r->dtype), *cdt = dtype_name(r->cache_dtype);
  const npy_dtype io = npy_of(r->dtype), cache = npy_of(r->cache_dtype);
  const int64_t q_shape[] = {T, hq, d}, kv_shape[] = {T, hkv, d}, heads[] = {hq};
  const int64_t nhd[] = {nb * bs, hkv, d}, hnd[] = {nb, hkv, bs, d};
  const bool is_nhd = r->layout == UATTN_LAYOUT_NHD;
  const int64_t *c_shape = is_nhd ? nhd : hnd;
  const int c_ndim = is_nhd ? 3 : 4;
  const char *c_dims = is_nhd ? "num_blocks * block_size, num_kv_heads, head_dim"
                              : "num_blocks, num_kv_heads, block_size, head_dim";
  if (check_tensor(&r->t[T_Q], io, "dtype", dt, 3, q_shape, "T, num_q_heads, head_dim") ||
      check_tensor(&r->t[T_K], io, "dtype", dt, 3, kv_shape, "T, num_kv_heads, head_dim") ||
      check_tensor(&r->t[T_V], io, "dtype", dt, 3, kv_shape, "T, num_kv_heads, head_dim") ||
      check_tensor(&r->t[T_KC], cache, "cache_dtype", cdt, c_ndim, c_shape, c_dims) ||
      check_tensor(&r->t[T_VC], cache, "cache_dtype", cdt, c_ndim, c_shape, c_dims))
    return -1;
  for (int i = T_SINKS; i <= T_ALIBI; i++)
    if (r->t[i].path && check_tensor(&r->t[i], NPY_F4, NULL, NULL, 1, heads, "num_q_heads")) return -1;
  return 0;
}

/* ---- output ------------------------------------------------------------------------------------------ */

static float bf16_to_f32(uint16_t h) {
  const uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in fp32 */
    const float v = (float)man * 0x1p-24f;
    return sign ? -v : v;
  }
  const uint32_t bits = exp == 31 ? sign | 0x7f800000u | man << 13 : sign | (exp + 112u) << 23 | man << 13;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

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

static cJSON *unique_array(const uattn_plan_info *in) {
  cJSON *a = cJSON_CreateArray();
  for (int32_t k = 0; a && k < in->num_unique_blocks; k++) {
    const uattn_unique_block *u = &in->unique_blocks[k];
    const int32_t row[4] = {u->block, u->token, u->block_start, u->usage};
    if (!cJSON_AddItemToArray(a, int_array(row, 4))) {
      cJSON_Delete(a);
      a = NULL;
    }
  }
  return a;
}

/* Not asked for, but the spans are how shared blocks are read: what one needs to follow a row. */
static cJSON *spans_array(const uattn_plan_info *in) {
  cJSON *a = cJSON_CreateArray();
  for (int32_t k = 0; a && k < in->num_shared_spans; k++) {
    const uattn_shared_span *s = &in->shared_spans[k];
    const int32_t row[5] = {s->shared_index, s->req, s->block_start, s->token_begin, s->token_end};
    if (!cJSON_AddItemToArray(a, int_array(row, 5))) {
      cJSON_Delete(a);
      a = NULL;
    }
  }
  return a;
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
  const bool ok =
      root && cJSON_AddNumberToObject(root, "num_tokens", in->num_tokens) &&
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
      add(root, "shared_spans", spans_array(in)) && add(root, "unique_blocks", unique_array(in)) &&
      add(root, "bucket", bucket_object(&in->padded));
  const int rc = ok ? write_json(r, "plan.json", root) : fail("plan.json: out of memory");
  cJSON_Delete(root);
  return rc;
}

static int write_outputs(run *r) {
  const int64_t T = r->num_tokens, hq = r->hq, d = r->head_dim;
  const size_t n = (size_t)T * (size_t)hq * (size_t)d;
  const float *out = r->out;
  if (r->dtype != UATTN_F32) {
    if (!(r->out_f32 = malloc(sizeof(float) * (n ? n : 1)))) return fail("out.npy: out of memory");
    const uint16_t *h = r->out;
    for (size_t i = 0; i < n; i++) r->out_f32[i] = r->dtype == UATTN_BF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
    out = r->out_f32;
  }
  const int64_t out_shape[] = {T, hq, d}, lse_shape[] = {T, hq};
  const npy_array *kc = &r->t[T_KC].a;
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
  const int64_t bs = r->block_size;
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
  s.num_reqs = r->num_reqs;
  s.num_computed = r->num_computed;
  s.num_scheduled = r->num_scheduled;
  s.num_prompt = r->num_prompt;
  s.block_table = r->table;
  s.block_table_stride = r->stride;
  s.draft_tokens = r->drafts;
  s.draft_offsets = r->draft_offsets;
  return s;
}

static uattn_layer make_layer(const run *r) {
  uattn_layer l;
  memset(&l, 0, sizeof l);
  l.num_q_heads = r->hq;
  l.num_kv_heads = r->hkv;
  l.head_dim = r->head_dim;
  l.scale = r->scale;
  l.soft_cap = r->soft_cap;
  l.sliding_window = r->sliding_window;
  l.dtype = r->dtype;
  l.cache_dtype = r->cache_dtype;
  l.kv_layout = r->layout;
  l.attn_type = r->attn_type;
  l.sinks = r->t[T_SINKS].a.data;
  l.alibi_slopes = r->t[T_ALIBI].a.data;
  l.causal_width = r->causal_width;
  l.chunk_size = r->chunk_size;
  return l;
}

static int execute(run *r) {
  uattn_plan_config pc = uattn_plan_config_default(r->block_size, r->num_blocks, r->num_reqs, r->num_tokens,
                                                   r->max_model_len);
  pc.chunk_size = r->chunk_size;
  if (mkdirs(r->out_dir)) return -1;
  uattn_status st = uattn_plan_create(&pc, &r->plan);
  if (st) return fail_lib("uattn_plan_create", st);
  const uattn_step step = make_step(r);
  if ((st = uattn_plan_step(r->plan, &step))) return fail_lib("uattn_plan_step", st);
  uattn_plan_info in;
  uattn_plan_get_info(r->plan, &in);
  if (in.num_tokens != r->num_tokens) /* the shapes were checked against our reading of the draft rule */
    return fail("requests: the planner schedules %d tokens, the runner expected %d (uattn-run bug)", in.num_tokens,
                r->num_tokens);

  const size_t rows = (size_t)r->num_tokens * (size_t)r->hq;
  const size_t cache_bytes = r->t[T_KC].a.count * dtype_size(r->cache_dtype);
  r->key_cache = malloc(cache_bytes ? cache_bytes : 1);
  r->value_cache = malloc(cache_bytes ? cache_bytes : 1);
  r->out = malloc(rows * (size_t)r->head_dim * dtype_size(r->dtype) + 1);
  r->lse = malloc(sizeof(float) * rows + 1);
  if (!r->key_cache || !r->value_cache || !r->out || !r->lse) return fail("out of memory for the outputs");
  memcpy(r->key_cache, r->t[T_KC].a.data, cache_bytes);
  memcpy(r->value_cache, r->t[T_VC].a.data, cache_bytes);

  const uattn_layer layer = make_layer(r);
  uattn_tensors t;
  memset(&t, 0, sizeof t);
  t.q = r->t[T_Q].a.data;
  t.k = r->t[T_K].a.data;
  t.v = r->t[T_V].a.data;
  t.key_cache = r->key_cache;
  t.value_cache = r->value_cache;
  t.num_blocks = r->num_blocks;
  t.block_size = r->block_size;
  t.out = r->out;
  t.lse = r->lse;
  uattn_runtime_config rt_config = uattn_runtime_config_default();
  rt_config.num_threads = r->threads;
  if ((st = uattn_runtime_create(&rt_config, &r->rt))) return fail_lib("uattn_runtime_create", st);
  if ((st = uattn_forward(r->plan, &layer, &t, r->rt))) return fail_lib("uattn_forward", st);

  if (write_outputs(r) || write_plan_json(r, &in)) return -1;
  if (r->dump_biases && dump_biases(r)) return -1;
  printf("uattn-run: %d requests, %d query rows, %d sampled; %d shared blocks (%d spans), %d unique blocks; "
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
    memcpy(r->key_cache, r->t[T_KC].a.data, cache_bytes);
    memcpy(r->value_cache, r->t[T_VC].a.data, cache_bytes);
    const double t0 = (perf_seconds() * 1e3);
    if ((st = uattn_plan_step(r->plan, &step))) {
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

/* STEP.json and the tensors it names, read and checked against each other: all of the dump that is read
 * before planning. */
static int read_step(run *r) { return parse_json(r) || read_config(r) || read_requests(r) || load_tensors(r); }

#ifdef UATTN_RUN_NO_MAIN
/* For tests/fuzz/fuzz_step_runner.c, which links this file without main: reads a step as main does, then
 * frees it. Returns 0, or -1 with the line main would print in *why. */
int uattn_run_read_step(const char *json_path, const char **why) {
  run r;
  memset(&r, 0, sizeof r);
  r.json_path = json_path;
  error_line[0] = '\0';
  const int rc = read_step(&r);
  run_free(&r);
  *why = error_line;
  return rc ? -1 : 0;
}
#else

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

  const int rc = read_step(&r) || execute(&r);
  if (rc) fprintf(stderr, "uattn-run: %s\n", error_line);
  run_free(&r);
  return rc ? EXIT_BAD : 0;
}
#endif
