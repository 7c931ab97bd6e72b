/* uattn-run's reading of a step (step.h): STEP.json through the library's strict JSON reader, in the tool's
 * phrasing (every problem one "key: what" line), then the tensors it names, checked against the config. */
#include "support/step.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/json.h"
#include "convert.h"
#include "support/fail.h"
#include "support/requests.h"

/* A refusal that is not about one JSON value (a shape, a request's blocks); -1 to unwind. */
static int fail(uattn_json_reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(uattn_json_reader *r, const char *fmt, ...) {
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  uattn_json_refuse(r, UATTN_ERR_INVALID_ARGUMENT, "%s", line);
  return -1;
}

/* Typos in optional keys would otherwise be silently ignored; they do not stop a replay. */
static void warn_unknown_key(const char *path) {
  fprintf(stderr, "uattn-run: warning: ignoring unknown key %s\n", path);
}

/* bf16 and fp8 travel as their bits: NumPy has no such dtypes */
static npy_dtype npy_of(uattn_dtype d) {
  switch (d) {
  case UATTN_F32: return NPY_F4;
  case UATTN_BF16: return NPY_U2;
  case UATTN_F16: return NPY_F2;
  case UATTN_FP8_E4M3:
  case UATTN_FP8_E5M2: return NPY_U1;
  }
  return NPY_F4;
}

/* ---- the config ---------------------------------------------------------------------------------------- */

static bool is_fp8(uattn_dtype d) { return d == UATTN_FP8_E4M3 || d == UATTN_FP8_E5M2; }

/* "head_dim_v" and "kv_latent" (uattn.h's multi-head latent attention), after head_dim. */
static int read_latent(uattn_json_reader *r, const cJSON *o, step *s) {
  const cJSON *latent = cJSON_GetObjectItemCaseSensitive(o, "kv_latent");
  if (latent && !cJSON_IsBool(latent))
    return fail(r, "kv_latent: must be true or false, got %s", uattn_json_kind(latent));
  s->kv_latent = latent && cJSON_IsTrue(latent);
  if (uattn_json_int(r, o, "", "head_dim_v", false, 0, 0, INT32_MAX, &s->head_dim_v)) return -1;
  if (s->kv_latent && !cJSON_GetObjectItemCaseSensitive(o, "head_dim_v"))
    return fail(r,
                "head_dim_v: missing; a kv_latent step needs it: the dims of each latent that are its value, "
                "0 < head_dim_v <= head_dim (%d)",
                s->head_dim);
  if (s->kv_latent && (s->head_dim_v < 1 || s->head_dim_v > s->head_dim))
    return fail(r, "head_dim_v: a kv_latent step needs 0 < head_dim_v <= head_dim (got %d, head_dim %d)", s->head_dim_v,
                s->head_dim);
  if (!s->head_dim_v) s->head_dim_v = s->head_dim;
  return 0;
}

static int read_config(uattn_json_reader *r, const cJSON *o, step *s) {
  static const char *const known[] = {
      "block_size", "num_blocks", "num_q_heads", "num_kv_heads",   "head_dim",  "dtype",        "cache_dtype",
      "kv_layout",  "scale",      "soft_cap",    "sliding_window", "attn_type", "causal_width", "chunk_size",
      "threads",    "requests",   "tensors",     "k_scale",        "v_scale",   "head_dim_v",   "kv_latent"};
  if (uattn_json_check_keys(r, o, "", known, sizeof known / sizeof *known) ||
      uattn_json_int(r, o, "", "block_size", true, 0, 1, INT32_MAX, &s->block_size) ||
      uattn_json_int(r, o, "", "num_blocks", true, 0, 1, INT32_MAX, &s->num_blocks) ||
      uattn_json_int(r, o, "", "num_q_heads", true, 0, 1, INT32_MAX, &s->hq) ||
      uattn_json_int(r, o, "", "num_kv_heads", true, 0, 1, INT32_MAX, &s->hkv) ||
      uattn_json_int(r, o, "", "head_dim", true, 0, 1, INT32_MAX, &s->head_dim) ||
      uattn_json_dtype(r, o, "", "dtype", true, false, &s->dtype) ||
      uattn_json_dtype(r, o, "", "cache_dtype", true, true, &s->cache_dtype))
    return -1;
  static const char *const layouts[] = {"NHD", "HND", "TILED"};
  static const int layout_values[] = {UATTN_LAYOUT_NHD, UATTN_LAYOUT_HND, UATTN_LAYOUT_TILED};
  static const char *const types[] = {"decoder", "encoder"};
  /* "encoder" in a step dump is an encoder-only model's bidirectional self-attention over its own
   * requests (the encoder of an encoder-decoder model would need cross-attention inputs we do not take) */
  static const int type_values[] = {UATTN_ATTENTION_DECODER, UATTN_ATTENTION_ENCODER_ONLY};
  int layout, type;
  if (uattn_json_choice(r, o, "", "kv_layout", layouts, layout_values, 3, "NHD, HND, TILED", &layout) ||
      uattn_json_choice(r, o, "", "attn_type", types, type_values, 2, "decoder, encoder", &type))
    return -1;
  s->layout = (uattn_kv_layout)layout;
  s->attn_type = (uattn_attention_type)type;
  if (s->hq % s->hkv != 0) return fail(r, "num_q_heads: %d is not a multiple of num_kv_heads (%d)", s->hq, s->hkv);
  if (read_latent(r, o, s)) return -1;
  if (s->kv_latent && s->layout == UATTN_LAYOUT_TILED)
    return fail(r, "kv_latent: needs kv_layout NHD or HND (a latent has no value rows to tile; got TILED)");
  /* TILED's cache shapes exist only for these (uattn.h); said here, or the tensors' check would name a shape
   * that cannot be */
  if (s->layout == UATTN_LAYOUT_TILED && (s->block_size % 16 || s->head_dim % 2))
    return fail(r, "kv_layout: TILED needs a block_size that is a multiple of 16 and an even head_dim (got %d, %d)",
                s->block_size, s->head_dim);
  double scale, soft_cap;
  if (uattn_json_number(r, o, "", "scale", -3.4e38, 3.4e38, &scale) ||
      uattn_json_number(r, o, "", "soft_cap", 0.0, 3.4e38, &soft_cap) ||
      uattn_json_int(r, o, "", "sliding_window", true, 0, 0, INT32_MAX, &s->sliding_window) ||
      uattn_json_int(r, o, "", "causal_width", false, 0, 0, INT32_MAX, &s->causal_width) ||
      uattn_json_int(r, o, "", "chunk_size", false, 0, 0, INT32_MAX, &s->chunk_size) ||
      uattn_json_int(r, o, "", "threads", false, 0, 1, INT32_MAX, &s->threads))
    return -1;
  s->scale = (float)scale;
  s->soft_cap = (float)soft_cap;
  /* The fp8 scales (uattn.h: finite and > 0; 1 when absent). Read whatever the cache dtype, so that a bad
   * value is never silently carried along; the library ignores them for other caches. The lower bound is
   * fp32's smallest positive value: a smaller one would become 0 as a float. */
  double ks = 1.0, vs = 1.0;
  if ((cJSON_GetObjectItemCaseSensitive(o, "k_scale") &&
       uattn_json_number(r, o, "", "k_scale", 0x1p-149, 3.4e38, &ks)) ||
      (cJSON_GetObjectItemCaseSensitive(o, "v_scale") && uattn_json_number(r, o, "", "v_scale", 0x1p-149, 3.4e38, &vs)))
    return -1;
  /* a latent's values are its keys' bytes, read through one scale (uattn.h); absent, v_scale is k_scale's */
  if (s->kv_latent && !cJSON_GetObjectItemCaseSensitive(o, "v_scale")) vs = ks;
  if (s->kv_latent && is_fp8(s->cache_dtype) && vs != ks)
    return fail(r,
                "v_scale: a kv_latent step on an fp8 cache reads its values through k_scale: v_scale (%g) must "
                "equal k_scale (%g) or be left out",
                vs, ks);
  s->k_scale = (float)ks;
  s->v_scale = (float)vs;
  return 0;
}

/* ---- the requests -------------------------------------------------------------------------------------- */

/* The scheduled tokens of a request after the planner's spec-decode rule (uattn.h, uattn_step), so the
 * tensor shapes and the plan's limits can be derived before planning. */
static int32_t effective_scheduled(int32_t reported, const int32_t *drafts, int32_t n) {
  if (n == 0) return reported;
  int32_t real = 0;
  for (int32_t i = 0; i < n; i++) real += drafts[i] != -1;
  return real + 1;
}

static int read_requests(uattn_json_reader *r, const cJSON *root, step *s) {
  static const char *const known[] = {"num_computed", "num_scheduled", "num_prompt", "block_table", "draft_tokens"};
  const cJSON *reqs = uattn_json_required(r, root, "", "requests");
  if (!reqs || uattn_json_expect(r, reqs, "requests", true, "an array of objects")) return -1;
  const int n = cJSON_GetArraySize(reqs);
  if (n == 0) return fail(r, "requests: the step has no requests");
  s->num_reqs = n;
  s->num_computed = calloc((size_t)n, sizeof(int32_t));
  s->num_scheduled = calloc((size_t)n, sizeof(int32_t));
  s->num_prompt = calloc((size_t)n, sizeof(int32_t));
  s->draft_offsets = calloc((size_t)n + 1, sizeof(int32_t));
  int32_t **rows = calloc((size_t)n, sizeof *rows), **drafts = calloc((size_t)n, sizeof *drafts);
  int32_t *row_len = calloc((size_t)n, sizeof(int32_t)), *draft_len = calloc((size_t)n, sizeof(int32_t));
  int rc = -1;
  if (!s->num_computed || !s->num_scheduled || !s->num_prompt || !s->draft_offsets || !rows || !drafts || !row_len ||
      !draft_len) {
    fail(r, "requests: out of memory");
    goto done;
  }

  int64_t total = 0, longest = 0;
  int32_t stride = 1, total_drafts = 0;
  const cJSON *q;
  int i = 0;
  cJSON_ArrayForEach(q, reqs) {
    char where[64], name[128];
    snprintf(where, sizeof where, "requests[%d].", i);
    snprintf(name, sizeof name, "requests[%d]", i);
    if (uattn_json_expect(r, q, name, false, "an object") || uattn_json_check_keys(r, q, where, known, 5) ||
        uattn_json_int(r, q, where, "num_computed", true, 0, 0, INT32_MAX, &s->num_computed[i]) ||
        uattn_json_int(r, q, where, "num_scheduled", true, 0, 0, INT32_MAX, &s->num_scheduled[i]) ||
        uattn_json_int(r, q, where, "num_prompt", true, 0, 1, INT32_MAX, &s->num_prompt[i]))
      goto done;
    const cJSON *bt = uattn_json_required(r, q, where, "block_table");
    snprintf(name, sizeof name, "%sblock_table", where);
    /* -1 pads a row; everything the step reads is checked against num_blocks below */
    if (!bt || uattn_json_int_list(r, bt, name, -1, INT32_MAX, &rows[i], &row_len[i])) goto done;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(q, "draft_tokens");
    snprintf(name, sizeof name, "%sdraft_tokens", where);
    if (dt && uattn_json_int_list(r, dt, name, -1, INT32_MAX, &drafts[i], &draft_len[i])) goto done;
    const int32_t ns = effective_scheduled(s->num_scheduled[i], drafts[i], draft_len[i]);
    if (ns < 1) {
      fail(r, "%snum_scheduled: a request schedules at least 1 token (got %d)", where, ns);
      goto done;
    }
    const int64_t seq_len = (int64_t)s->num_computed[i] + ns;
    if (seq_len > INT32_MAX) {
      fail(r, "%snum_computed: num_computed + scheduled tokens (%d + %d) overflows int32", where, s->num_computed[i],
           ns);
      goto done;
    }
    const int64_t needed = (seq_len + s->block_size - 1) / s->block_size;
    if (row_len[i] < needed) {
      fail(r,
           "%sblock_table: %d entries cover %lld positions; the request needs %lld (num_computed %d + %d "
           "scheduled, block_size %d)",
           where, row_len[i], (long long)row_len[i] * s->block_size, (long long)seq_len, s->num_computed[i], ns,
           s->block_size);
      goto done;
    }
    for (int64_t o = 0; o < needed; o++)
      if (rows[i][o] < 0 || rows[i][o] >= s->num_blocks) {
        fail(r, "%sblock_table[%lld]: %d is not a block id in [0, num_blocks = %d)", where, (long long)o, rows[i][o],
             s->num_blocks);
        goto done;
      }
    total += ns;
    if (seq_len > longest) longest = seq_len;
    if (row_len[i] > stride) stride = row_len[i];
    if ((int64_t)total_drafts + draft_len[i] > INT32_MAX) {
      fail(r, "%sdraft_tokens: too many drafts", where);
      goto done;
    }
    total_drafts += draft_len[i];
    s->draft_offsets[i + 1] = total_drafts;
    i++;
  }
  if (total > INT32_MAX) {
    fail(r, "requests: %lld scheduled tokens overflow int32", (long long)total);
    goto done;
  }
  s->num_tokens = (int32_t)total;
  const int64_t bs = s->block_size;
  const int64_t mml = (longest + bs - 1) / bs * bs;
  s->max_model_len = (int32_t)(mml > INT32_MAX ? INT32_MAX / bs * bs : mml);

  /* one [R, stride] table, rows padded with -1 */
  s->stride = stride;
  s->table = malloc(sizeof(int32_t) * (size_t)n * (size_t)stride);
  if (total_drafts) s->drafts = malloc(sizeof(int32_t) * (size_t)total_drafts);
  if (!s->table || (total_drafts && !s->drafts)) {
    fail(r, "requests: out of memory");
    goto done;
  }
  for (int k = 0; k < n; k++) {
    for (int32_t c = 0; c < stride; c++) s->table[(size_t)k * stride + c] = c < row_len[k] ? rows[k][c] : -1;
    if (draft_len[k]) memcpy(s->drafts + s->draft_offsets[k], drafts[k], sizeof(int32_t) * (size_t)draft_len[k]);
  }
  if (!total_drafts) { /* no spec-decode request: the plan's plain path */
    free(s->draft_offsets);
    s->draft_offsets = NULL;
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

/* ---- the tensors --------------------------------------------------------------------------------------- */

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

static int check_tensor(uattn_json_reader *r, const step_tensor *t, npy_dtype want, const char *dtype_key,
                        const char *dtype_val, int ndim, const int64_t *shape, const char *dims) {
  if (t->a.dtype != want) {
    if (dtype_key)
      return fail(r, "tensors.%s: %s: dtype %s does not match %s \"%s\" (%s)", t->key, t->path,
                  npy_dtype_descr(t->a.dtype), dtype_key, dtype_val, npy_dtype_descr(want));
    return fail(r, "tensors.%s: %s: dtype %s, expected %s (float32)", t->key, t->path, npy_dtype_descr(t->a.dtype),
                npy_dtype_descr(want));
  }
  bool same = t->a.ndim == ndim;
  for (int d = 0; same && d < ndim; d++) same = t->a.shape[d] == shape[d];
  if (!same) {
    char got[256], exp[256];
    format_shape(got, sizeof got, t->a.ndim, t->a.shape);
    format_shape(exp, sizeof exp, ndim, shape);
    return fail(r, "tensors.%s: shape %s does not match %s (%s)", t->key, got, exp, dims);
  }
  return 0;
}

static int load_tensors(uattn_json_reader *r, const cJSON *root, const char *json_path, step *s) {
  static const char *const keys[STEP_TENSORS] = {"q", "k", "v", "key_cache", "value_cache", "sinks", "alibi_slopes"};
  const cJSON *ts = uattn_json_required(r, root, "", "tensors");
  if (!ts || uattn_json_expect(r, ts, "tensors", false, "an object of file names") ||
      uattn_json_check_keys(r, ts, "tensors.", keys, STEP_TENSORS))
    return -1;
  for (int i = 0; i < STEP_TENSORS; i++) {
    step_tensor *t = &s->t[i];
    t->key = keys[i];
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(ts, t->key);
    const bool value = i == STEP_V || i == STEP_VALUE_CACHE;
    if (s->kv_latent && value) {
      /* a stray file would otherwise be silently ignored, and the engine's dump is then not what it ran */
      if (x)
        return fail(r,
                    "tensors.%s: a kv_latent step has no %s (each key's first head_dim_v dims are its value): "
                    "remove the key, or drop kv_latent",
                    t->key, i == STEP_V ? "values" : "value cache");
      continue;
    }
    if (!x && i >= STEP_SINKS) continue; /* optional */
    if (!x) return fail(r, "tensors.%s: missing required key", t->key);
    if (!cJSON_IsString(x) || !x->valuestring[0])
      return fail(r, "tensors.%s: must be a file name, got %s", t->key, uattn_json_kind(x));
    if (!(t->path = resolve(json_path, x->valuestring))) return fail(r, "tensors.%s: out of memory", t->key);
    char err[512];
    if (npy_read(t->path, &t->a, err, sizeof err)) return fail(r, "tensors.%s: %s: %s", t->key, t->path, err);
  }

  const int64_t T = s->num_tokens, hq = s->hq, hkv = s->hkv, d = s->head_dim, dv = s->head_dim_v;
  const int64_t nb = s->num_blocks, bs = s->block_size;
  const char *dt = uattn_dtype_name(s->dtype), *cdt = uattn_dtype_name(s->cache_dtype);
  const npy_dtype io = npy_of(s->dtype), cache = npy_of(s->cache_dtype);
  const int64_t q_shape[] = {T, hq, d}, k_shape[] = {T, hkv, d}, v_shape[] = {T, hkv, dv}, heads[] = {hq};
  /* the caches by layout (uattn.h): [0] keys (rows head_dim long), [1] values (head_dim_v) */
  const int64_t nhd_k[] = {nb * bs, hkv, d}, hnd_k[] = {nb, hkv, bs, d};
  const int64_t nhd_v[] = {nb * bs, hkv, dv}, hnd_v[] = {nb, hkv, bs, dv};
  const int64_t tiled_k[] = {nb, bs / 16, hkv, d / 2, 16, 2}, tiled_v[] = {nb, bs / 16, hkv, 8, dv, 2};
  const int64_t *c_shape[2] = {nhd_k, nhd_v};
  int c_ndim = 3;
  const char *c_dims[2] = {"num_blocks * block_size, num_kv_heads, head_dim",
                           "num_blocks * block_size, num_kv_heads, head_dim_v"};
  if (s->layout == UATTN_LAYOUT_HND) {
    c_shape[0] = hnd_k, c_shape[1] = hnd_v;
    c_ndim = 4;
    c_dims[0] = "num_blocks, num_kv_heads, block_size, head_dim";
    c_dims[1] = "num_blocks, num_kv_heads, block_size, head_dim_v";
  } else if (s->layout == UATTN_LAYOUT_TILED) {
    c_shape[0] = tiled_k, c_shape[1] = tiled_v;
    c_ndim = 6;
    c_dims[0] = "TILED keys: num_blocks, block_size / 16, num_kv_heads, head_dim / 2, 16, 2";
    c_dims[1] = "TILED values: num_blocks, block_size / 16, num_kv_heads, 8, head_dim_v, 2";
  }
  if (check_tensor(r, &s->t[STEP_Q], io, "dtype", dt, 3, q_shape, "T, num_q_heads, head_dim") ||
      check_tensor(r, &s->t[STEP_K], io, "dtype", dt, 3, k_shape, "T, num_kv_heads, head_dim") ||
      (!s->kv_latent && check_tensor(r, &s->t[STEP_V], io, "dtype", dt, 3, v_shape, "T, num_kv_heads, head_dim_v")) ||
      check_tensor(r, &s->t[STEP_KEY_CACHE], cache, "cache_dtype", cdt, c_ndim, c_shape[0], c_dims[0]) ||
      (!s->kv_latent &&
       check_tensor(r, &s->t[STEP_VALUE_CACHE], cache, "cache_dtype", cdt, c_ndim, c_shape[1], c_dims[1])))
    return -1;
  for (int i = STEP_SINKS; i <= STEP_ALIBI; i++)
    if (s->t[i].path && check_tensor(r, &s->t[i], NPY_F4, NULL, NULL, 1, heads, "num_q_heads")) return -1;
  return 0;
}

/* ---- the step ------------------------------------------------------------------------------------------ */

int step_read(step *s, const char *json_path, char *why, size_t cap) {
  memset(s, 0, sizeof *s);
  why[0] = '\0';
  uattn_json_reader r = {.phrasing = UATTN_JSON_TOOL, .why = why, .cap = cap, .unknown_key = warn_unknown_key};
  cJSON *root = uattn_json_read_object(&r, json_path, 0);
  const int rc =
      !root || read_config(&r, root, s) || read_requests(&r, root, s) || load_tensors(&r, root, json_path, s);
  cJSON_Delete(root);
  return rc ? -1 : 0;
}

void step_free(step *s) {
  free(s->num_computed);
  free(s->num_scheduled);
  free(s->num_prompt);
  free(s->table);
  free(s->drafts);
  free(s->draft_offsets);
  for (int i = 0; i < STEP_TENSORS; i++) {
    free(s->t[i].path);
    npy_free(&s->t[i].a);
  }
  memset(s, 0, sizeof *s);
}

/* ---- running and writing -------------------------------------------------------------------------------- */

uattn_plan_config step_plan_config(const step *s) {
  uattn_plan_config pc =
      uattn_plan_config_default(s->block_size, s->num_blocks, s->num_reqs, s->num_tokens, s->max_model_len);
  pc.chunk_size = s->chunk_size;
  return pc;
}

uattn_step step_batch(const step *s) {
  uattn_step b = step_requests(s->num_reqs, s->num_computed, s->num_scheduled, s->num_prompt, s->table, s->stride);
  b.draft_tokens = s->drafts;
  b.draft_offsets = s->draft_offsets;
  return b;
}

uattn_layer step_layer(const step *s) {
  uattn_layer l;
  memset(&l, 0, sizeof l);
  l.num_q_heads = s->hq;
  l.num_kv_heads = s->hkv;
  l.head_dim = s->head_dim;
  l.scale = s->scale;
  l.soft_cap = s->soft_cap;
  l.sliding_window = s->sliding_window;
  l.dtype = s->dtype;
  l.cache_dtype = s->cache_dtype;
  l.kv_layout = s->layout;
  l.attn_type = s->attn_type;
  l.sinks = s->t[STEP_SINKS].a.data;
  l.alibi_slopes = s->t[STEP_ALIBI].a.data;
  l.causal_width = s->causal_width;
  l.chunk_size = s->chunk_size;
  l.k_scale = s->k_scale;
  l.v_scale = s->v_scale;
  /* 0 where the values are as wide as the keys: the layer an engine without latent attention passes */
  l.head_dim_v = s->kv_latent || s->head_dim_v != s->head_dim ? s->head_dim_v : 0;
  l.kv_latent = s->kv_latent;
  return l;
}

int step_make_dir(const char *dir, char *why, size_t cap) {
  char *p = strdup(dir);
  if (!p) return fail_with(why, cap, "--out %s: out of memory", dir);
  for (char *c = p + 1;; c++) {
    const bool last = *c == '\0';
    if (*c == '/' || last) {
      *c = '\0';
      if (mkdir(p, 0777) != 0 && errno != EEXIST) {
        fail_with(why, cap, "--out %s: cannot create %s: %s", dir, p, strerror(errno));
        free(p);
        return -1;
      }
      if (last) break;
      *c = '/';
    }
  }
  free(p);
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return fail_with(why, cap, "--out %s: not a directory", dir);
  return 0;
}

int step_write_npy(const char *dir, const char *name, npy_dtype dtype, int ndim, const int64_t *shape, const void *data,
                   char *why, size_t cap) {
  char path[4096], err[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (npy_write(path, dtype, ndim, shape, data, err, sizeof err)) return fail_with(why, cap, "%s: %s", path, err);
  return 0;
}

int step_write_results(const step *s, const char *dir, const void *out, const float *lse, const void *key_cache,
                       const void *value_cache, char *why, size_t cap) {
  const int64_t T = s->num_tokens, hq = s->hq, d = s->head_dim_v;
  const size_t n = (size_t)T * (size_t)hq * (size_t)d;
  float *widened = NULL;
  if (s->dtype != UATTN_F32) {
    if (!(widened = malloc(sizeof(float) * (n ? n : 1)))) return fail_with(why, cap, "out.npy: out of memory");
    uattn_widen(s->dtype, out, widened, n);
    out = widened;
  }
  const int64_t out_shape[] = {T, hq, d}, lse_shape[] = {T, hq};
  /* each in its input's shape: a TILED cache's keys and values are shaped differently */
  const npy_array *kc = &s->t[STEP_KEY_CACHE].a, *vc = &s->t[STEP_VALUE_CACHE].a;
  const int rc = step_write_npy(dir, "out.npy", NPY_F4, 3, out_shape, out, why, cap) ||
                         step_write_npy(dir, "lse.npy", NPY_F4, 2, lse_shape, lse, why, cap) ||
                         step_write_npy(dir, "key_cache.npy", kc->dtype, kc->ndim, kc->shape, key_cache, why, cap) ||
                         (!s->kv_latent &&
                          step_write_npy(dir, "value_cache.npy", vc->dtype, vc->ndim, vc->shape, value_cache, why, cap))
                     ? -1
                     : 0;
  free(widened);
  return rc;
}

int step_write_json(const char *dir, const char *name, const cJSON *root, char *why, size_t cap) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  char *text = cJSON_Print(root);
  if (!text) return fail_with(why, cap, "%s: out of memory", path);
  FILE *f = fopen(path, "w");
  if (!f) {
    cJSON_free(text);
    return fail_with(why, cap, "%s: cannot create: %s", path, strerror(errno));
  }
  const bool ok = fputs(text, f) >= 0 && fputc('\n', f) != EOF;
  cJSON_free(text);
  if (fclose(f) != 0 || !ok) return fail_with(why, cap, "%s: cannot write", path);
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

int step_write_plan(const uattn_plan_info *in, const char *dir, char *why, size_t cap) {
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
  const int rc =
      ok ? step_write_json(dir, "plan.json", root, why, cap) : fail_with(why, cap, "plan.json: out of memory");
  cJSON_Delete(root);
  return rc;
}
