/* uattn-run on whole steps, compared with a dense attention computed here in double: f32; bf16 with an f16 HND
 * cache, sinks, ALiBi, soft cap and a sliding window; fp8 caches with scales; TILED caches; f16; encoder; and
 * its repeat, threads and bias dump options. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/dense_oracle.h"
#include "step_runner.h"
/* ---- the runner: whole steps against a dense attention -------------------------------------------------- */

static int64_t slot_of(const spec *s, int r, int32_t pos) {
  return (int64_t)s->table[r][pos / s->bs] * s->bs + pos % s->bs;
}

/* docs/design.md read literally, in double: every key of the request up to the query's position (all of them
 * for an encoder), from the cache below num_computed and from this step's k/v above. Values are dv wide; a
 * latent spec's value is its key's first dv dims (uattn.h, kv_latent). */
static void dense_attention(const spec *s, double *out, double *lse) {
  const int group = s->hq / s->hkv, dv = spec_dims(s, true);
  const bool encoder = !strcmp(s->attn, "encoder");
  for (int r = 0; r < s->nreq; r++) {
    const int32_t seq = s->nc[r] + s->eff[r];
    double *score = malloc(sizeof(double) * (size_t)seq);
    for (int32_t t = s->qsl[r]; t < s->qsl[r + 1]; t++) {
      const int32_t p = s->nc[r] + (t - s->qsl[r]);
      for (int h = 0; h < s->hq; h++) {
        const int kh = h / group;
        double m = s->sinks ? s->sink[h] : -INFINITY;
        for (int32_t j = 0; j < seq; j++) {
          bool visible = encoder || j <= p;
          if (s->window > 0) visible = visible && j > p - s->window;
          score[j] = -INFINITY;
          if (!visible) continue;
          const float *key = j < s->nc[r] ? s->kc + ((size_t)slot_of(s, r, j) * s->hkv + kh) * s->d
                                          : s->k + ((size_t)(s->qsl[r] + j - s->nc[r]) * s->hkv + kh) * s->d;
          double dot = 0;
          for (int d = 0; d < s->d; d++) dot += (double)s->q[((size_t)t * s->hq + h) * s->d + d] * key[d];
          double sc = (double)(float)s->scale * dot;
          if (s->soft_cap > 0) sc = s->soft_cap * tanh(sc / s->soft_cap);
          if (s->alibi) sc += (double)s->slope[h] * (j - p);
          score[j] = sc;
          if (sc > m) m = sc;
        }
        double sum = s->sinks ? exp(s->sink[h] - m) : 0.0;
        double *o = out + ((size_t)t * s->hq + h) * dv;
        for (int d = 0; d < dv; d++) o[d] = 0;
        for (int32_t j = 0; j < seq; j++) {
          if (score[j] == -INFINITY) continue;
          const double w = exp(score[j] - m);
          sum += w;
          const size_t cached = (size_t)slot_of(s, r, j) * s->hkv + kh,
                       fresh = (size_t)(s->qsl[r] + j - s->nc[r]) * s->hkv + kh;
          const float *val = s->latent ? (j < s->nc[r] ? s->kc + cached * s->d : s->k + fresh * s->d)
                                       : (j < s->nc[r] ? s->vc + cached * dv : s->v + fresh * dv);
          for (int d = 0; d < dv; d++) o[d] += w * val[d];
        }
        for (int d = 0; d < dv; d++) o[d] /= sum;
        lse[(size_t)t * s->hq + h] = m + log(sum);
      }
    }
    free(score);
  }
}

/* The caches after the step: this step's k/v at each new token's slot. */
static void updated_caches(const spec *s, float *kc, float *vc) {
  const size_t row = (size_t)s->hkv * s->d, vrow = (size_t)s->hkv * spec_dims(s, true), slots = (size_t)s->nb * s->bs;
  memcpy(kc, s->kc, sizeof(float) * slots * row);
  memcpy(vc, s->vc, sizeof(float) * slots * vrow);
  for (int r = 0; r < s->nreq; r++)
    for (int32_t i = 0; i < s->eff[r]; i++) {
      const int64_t slot = slot_of(s, r, s->nc[r] + i);
      memcpy(kc + (size_t)slot * row, s->k + (size_t)(s->qsl[r] + i) * row, sizeof(float) * row);
      memcpy(vc + (size_t)slot * vrow, s->v + (size_t)(s->qsl[r] + i) * vrow, sizeof(float) * vrow);
    }
}

static npy_array load(const char *name) {
  npy_array a;
  char err[256];
  cr_assert_eq(npy_read(in_scratch(name), &a, err, sizeof err), 0, "%s: %s", name, err);
  return a;
}

static void check_shape(const npy_array *a, const char *name, npy_dtype dtype, int ndim, const int64_t *shape) {
  cr_assert_eq(a->dtype, dtype, "%s: dtype %s", name, npy_dtype_descr(a->dtype));
  cr_assert_eq(a->ndim, ndim, "%s: ndim %d", name, a->ndim);
  for (int d = 0; d < ndim; d++)
    cr_assert_eq(a->shape[d], shape[d], "%s: dim %d is %lld, not %lld", name, d, (long long)a->shape[d],
                 (long long)shape[d]);
}

/* The key and the value cache are checked alike: out/NAME must be `want` (count elements) encoded in the input's
 * layout and dtype, shape and every byte. */
static void check_cache(const spec *s, const float *want, double scale, bool value, const char *name, size_t count) {
  int64_t shape[6];
  int nd;
  void *encoded = encode_cache(s, want, scale, value, shape, &nd);
  char path[64];
  snprintf(path, sizeof path, "out/%s", name);
  npy_array got = load(path);
  check_shape(&got, name, npy_of(s->cache_dtype), nd, shape);
  cr_assert(memcmp(got.data, encoded, count * npy_dtype_size(got.dtype)) == 0, "%s differs from the expected update",
            name);
  npy_free(&got);
  free(encoded);
}

/* Runs the step and checks every output: out and lse against the dense attention within tol (relative to
 * the largest |out|), the caches exactly, plan.json's slots and offsets. */
static void run_and_check(spec *s, const char *extra, double tol) {
  spec_write(s);
  const result r = run_step(extra);
  cr_assert_eq(r.rc, 0, "uattn-run failed (%d): %s", r.rc, r.err);
  const int dv = spec_dims(s, true);
  const size_t rows = (size_t)s->T * s->hq, n = rows * dv;
  double *out = malloc(sizeof(double) * n), *lse = malloc(sizeof(double) * rows);
  dense_attention(s, out, lse);

  npy_array o = load("out/out.npy"), l = load("out/lse.npy");
  check_shape(&o, "out.npy", NPY_F4, 3, (int64_t[]){s->T, s->hq, dv});
  check_shape(&l, "lse.npy", NPY_F4, 2, (int64_t[]){s->T, s->hq});
  double scale = 0, worst = 0, worst_lse = 0;
  size_t at = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(out[i]));
  for (size_t i = 0; i < n; i++) {
    const double e = fabs(((float *)o.data)[i] - out[i]);
    if (e > worst) worst = e, at = i;
  }
  for (size_t i = 0; i < rows; i++) worst_lse = fmax(worst_lse, fabs(((float *)l.data)[i] - lse[i]));
  cr_assert(worst <= tol * scale, "out: error %.3g at row %zu head %zu (got %g, want %g), allowed %.3g", worst,
            at / ((size_t)s->hq * dv), at / dv % s->hq, ((float *)o.data)[at], out[at], tol * scale);
  cr_assert(worst_lse <= 1e-4, "lse: error %.3g", worst_lse); /* fp32 whatever the dtype: inputs are exact */
  npy_free(&o);
  npy_free(&l);

  /* caches: exactly the inputs with this step's k/v written, in the input's layout and dtype; a latent step
   * writes its keys alone and has no value cache to write out */
  const size_t slots = (size_t)s->nb * s->bs, cn = slots * s->hkv * s->d, vn = slots * s->hkv * dv;
  float *kc = malloc(sizeof(float) * cn), *vc = malloc(sizeof(float) * vn);
  updated_caches(s, kc, vc);
  check_cache(s, kc, s->k_scale, false, "key_cache.npy", cn);
  if (s->latent)
    cr_assert_not(file_exists(in_scratch("out/value_cache.npy")), "a kv_latent step has no value cache to write");
  else
    check_cache(s, vc, s->v_scale, true, "value_cache.npy", vn);
  free(kc);
  free(vc);

  /* plan.json */
  cJSON *plan = test_load_json(in_scratch("out/plan.json"));
  cr_assert_not_null(plan);
  int32_t got[64];
  cr_assert_eq(test_json_ints(cJSON_GetObjectItem(plan, "slot_mapping"), got, 64), s->T);
  for (int q = 0; q < s->nreq; q++)
    for (int32_t i = 0; i < s->eff[q]; i++)
      cr_assert_eq(got[s->qsl[q] + i], slot_of(s, q, s->nc[q] + i), "slot_mapping[%d]", s->qsl[q] + i);
  cr_assert_eq(test_json_ints(cJSON_GetObjectItem(plan, "query_start_loc"), got, 64), s->nreq + 1);
  for (int q = 0; q <= s->nreq; q++) cr_assert_eq(got[q], s->qsl[q]);
  cr_assert_eq(test_json_ints(cJSON_GetObjectItem(plan, "seq_lens"), got, 64), s->nreq);
  for (int q = 0; q < s->nreq; q++) cr_assert_eq(got[q], s->nc[q] + s->eff[q]);
  cr_assert_eq(test_json_ints(cJSON_GetObjectItem(plan, "token_positions"), got, 64), s->T);
  const char *lists[] = {"logits_indices", "logits_groups", "new_token_positions", "shared_blocks"};
  for (int i = 0; i < 4; i++) cr_assert(cJSON_IsArray(cJSON_GetObjectItem(plan, lists[i])), "%s", lists[i]);
  const cJSON *unique = cJSON_GetObjectItem(plan, "unique_blocks");
  cr_assert(cJSON_IsArray(unique));
  const cJSON *u;
  cJSON_ArrayForEach(u, unique) cr_assert_eq(cJSON_GetArraySize(u), 4, "[block, token, block_start, usage]");
  const cJSON *bucket = cJSON_GetObjectItem(plan, "bucket");
  cr_assert_eq(cJSON_GetObjectItem(bucket, "query_len")->valueint, s->T);
  cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(bucket, "shared_blocks")));
  cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(bucket, "unique_blocks")));
  cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(bucket, "logits")));
  cJSON_Delete(plan);
  free(out);
  free(lse);
}

Test(step_runner, f32_step_matches_dense_attention) {
  spec s = base_spec();
  spec_fill(&s, 10);
  run_and_check(&s, NULL, 1e-5);
  cr_assert_not(file_exists(in_scratch("out/timing.json")));
  cr_assert_not(file_exists(in_scratch("out/causal_bias.npy")));
  spec_free(&s);
}

Test(step_runner, repeat_keeps_first_outputs_and_writes_timing) {
  spec s = base_spec();
  spec_fill(&s, 11);
  run_and_check(&s, "--repeat=3", 1e-5); /* the caches checked are those of one update, not four */
  cJSON *t = test_load_json(in_scratch("out/timing.json"));
  cr_assert_not_null(t);
  cr_assert(cJSON_GetObjectItem(t, "forward_ms")->valuedouble >= 0);
  cr_assert(cJSON_GetObjectItem(t, "plan_ms")->valuedouble >= 0);
  cr_assert_eq(cJSON_GetObjectItem(t, "repeat")->valueint, 3);
  cr_assert(cJSON_GetObjectItem(t, "threads")->valueint >= 1, "the workers that ran");
  cJSON_Delete(t);
  spec_free(&s);
}

static void add_thread_and_slice_keys(cJSON *j) {
  cJSON_AddNumberToObject(j, "threads", 2);
  cJSON_AddNumberToObject(j, "causal_width", 2); /* several causal slices in a 5-token prompt */
  cJSON_AddNumberToObject(j, "chunk_size", 1);   /* one shared block per online-softmax chunk */
}

Test(step_runner, threads_key_is_recorded) {
  spec s = base_spec();
  spec_fill(&s, 12);
  spec_write_edited(&s, add_thread_and_slice_keys);
  const char *args[] = {in_scratch("step.json"), "--out", in_scratch("out"), "--repeat", "1", NULL};
  const result r = run_tool(args);
  cr_assert_eq(r.rc, 0, "%s", r.err);
  cJSON *t = test_load_json(in_scratch("out/timing.json"));
  cr_assert_eq(cJSON_GetObjectItem(t, "threads")->valueint, 2);
  cr_assert_eq(cJSON_GetObjectItem(t, "repeat")->valueint, 1);
  cJSON_Delete(t);
  /* and the options change nothing in the result */
  const size_t rows = (size_t)s.T * s.hq;
  double *out = malloc(sizeof(double) * rows * s.d), *lse = malloc(sizeof(double) * rows);
  dense_attention(&s, out, lse);
  npy_array o = load("out/out.npy");
  for (size_t i = 0; i < rows * s.d; i++)
    cr_assert(fabs(((float *)o.data)[i] - out[i]) <= 1e-5 * 2, "out[%zu]: %g vs %g", i, ((float *)o.data)[i], out[i]);
  npy_free(&o);
  free(out);
  free(lse);
  spec_free(&s);
}

Test(step_runner, bf16_with_f16_hnd_cache_sinks_alibi_soft_cap_window) {
  spec s = base_spec();
  s.dtype = "bf16";
  s.cache_dtype = "f16";
  s.layout = "HND";
  s.sinks = s.alibi = true;
  s.soft_cap = 1.5;
  s.window = 6;
  s.scale = 0.25; /* exact in every dtype the library might hold it in */
  spec_fill(&s, 13);
  run_and_check(&s, NULL, 1.0 / 64); /* out is rounded to bf16 (8 bits) before the runner widens it */
  spec_free(&s);
}

/* Values that are exactly an fp8 code of both formats times scale: m * 2^e (m in 4..7, e in [-8, -2], so
 * 3 significant bits inside both formats' normal ranges), either sign, or 0. */
static void fp8_exact(test_rng *rng, float *x, size_t n, double scale) {
  for (size_t i = 0; i < n; i++) {
    const int m = test_rng_range(rng, 3, 7), e = test_rng_range(rng, -8, -2), sign = test_rng_range(rng, 0, 1);
    x[i] = m == 3 ? 0.0f : (float)((sign ? -1 : 1) * ldexp(m, e) * scale);
  }
}

/* The step's new keys and values and both caches redrawn as fp8_exact values of its k_scale / v_scale. */
static void fp8_exact_tensors(spec *s, uint64_t seed) {
  test_rng rng = {seed};
  const size_t slots = (size_t)s->nb * s->bs, dv = (size_t)spec_dims(s, true);
  const double v_scale = s->v_scale > 0 ? s->v_scale : s->k_scale; /* a latent spec leaves it out */
  fp8_exact(&rng, s->k, (size_t)s->T * s->hkv * s->d, s->k_scale);
  fp8_exact(&rng, s->v, (size_t)s->T * s->hkv * dv, v_scale);
  fp8_exact(&rng, s->kc, slots * s->hkv * s->d, s->k_scale);
  fp8_exact(&rng, s->vc, slots * s->hkv * dv, v_scale);
}

/* fp8 caches end to end: |u1 cache files in and out, k_scale / v_scale from the JSON (0.5 and 3, so a
 * swapped or missing scale shows), every path of base_spec (causal, shared, unique; the decode and the
 * verification read their own new keys back from the fp8 cache). The keys and values are exactly
 * representable (fp8_exact), so the cache after the step is known bit for bit and the dense attention on
 * the float values is exact: f32 accumulation is all that is left (1e-5). */
Test(step_runner, fp8_caches) {
  const char *const formats[] = {"fp8_e4m3", "fp8_e5m2"}, *const layouts[] = {"NHD", "HND"};
  for (int f = 0; f < 2; f++) {
    spec s = base_spec();
    s.cache_dtype = formats[f];
    s.layout = layouts[f];
    s.k_scale = 0.5;
    s.v_scale = 3.0;
    spec_fill(&s, 15 + (uint64_t)f);
    fp8_exact_tensors(&s, 99 + (uint64_t)f);
    run_and_check(&s, NULL, 1e-5);
    spec_free(&s);
  }
}

/* base_spec's paths on a TILED cache: blocks of 32 keys, two tiles each, so that every index of uattn.h's
 * definition moves (block, tile, key in the tile, KV head, dim pair and its element, key pair). Request 0's
 * chunk writes across a tile boundary, request 1's decode into the second tile of its block; both read
 * block 0 (shared), request 3's prompt fills one block and starts the next. */
static spec tiled_spec(void) {
  spec s = four_request_spec(32, 8, "TILED");
  /* request 0: a prompt chunk at positions 45..50 (block 1, tile 0 keys 13..15 and tile 1 keys 0..2) */
  s.nc[0] = 45, s.ns[0] = 6, s.np[0] = 60, s.tlen[0] = 2;
  memcpy(s.table[0], (int32_t[]){0, 1}, 2 * sizeof(int32_t));
  /* request 1: a decode at position 50 (block 3, tile 1 key 2) */
  s.nc[1] = 50, s.ns[1] = 1, s.np[1] = 20, s.tlen[1] = 2;
  memcpy(s.table[1], (int32_t[]){0, 3}, 2 * sizeof(int32_t));
  /* request 2: verifies 2 drafts at positions 20..22 (the placeholder does not count) */
  s.nc[2] = 20, s.ns[2] = 4, s.np[2] = 3, s.tlen[2] = 1;
  s.table[2][0] = 4;
  s.ndrafts[2] = 3;
  memcpy(s.drafts[2], (int32_t[]){11, -1, 12}, 3 * sizeof(int32_t));
  /* request 3: a whole prompt of 40 */
  s.nc[3] = 0, s.ns[3] = 40, s.np[3] = 40, s.tlen[3] = 3;
  memcpy(s.table[3], (int32_t[]){5, 6, 7}, 3 * sizeof(int32_t));
  s.ndrafts[0] = s.ndrafts[1] = s.ndrafts[3] = -1;
  return s;
}

/* A TILED step in f32, in bf16 on a bf16 cache, and on fp8 caches with scales (exact values, as above):
 * the output against the dense attention on the [slot][h][d] values, and the caches after the step, shaped
 * and laid out as layout_index says, bit for bit. */
Test(step_runner, tiled_caches) {
  const char *const dtypes[] = {"f32", "bf16", "f32"}, *const caches[] = {"f32", "bf16", "fp8_e4m3"};
  const double tol[] = {1e-5, 1.0 / 64, 1e-5}; /* bf16: out rounded to 8 bits, P maybe too */
  for (int c = 0; c < 3; c++) {
    spec s = tiled_spec();
    s.dtype = dtypes[c];
    s.cache_dtype = caches[c];
    if (is_fp8(s.cache_dtype)) s.k_scale = 0.5, s.v_scale = 3.0;
    if (!strcmp(s.dtype, "bf16")) s.scale = 0.25; /* exact in every dtype the library might hold it in */
    spec_fill(&s, 40 + (uint64_t)c);
    if (is_fp8(s.cache_dtype)) fp8_exact_tensors(&s, 140 + (uint64_t)c);
    run_and_check(&s, NULL, tol[c]);
    spec_free(&s);
  }
}

static void fp8_cache_zero_k_scale(cJSON *o) {
  cJSON_ReplaceItemInObject(o, "cache_dtype", cJSON_CreateString("fp8_e4m3"));
  cJSON_AddNumberToObject(o, "k_scale", 0);
}
static void negative_v_scale(cJSON *o) { cJSON_AddNumberToObject(o, "v_scale", -1); }
static void string_k_scale(cJSON *o) { cJSON_AddStringToObject(o, "k_scale", "1"); }
static void fp8_dtype(cJSON *o) { cJSON_ReplaceItemInObject(o, "dtype", cJSON_CreateString("fp8_e5m2")); }

Test(step_runner, bad_fp8_keys_are_named) {
  expect_json_error(fp8_cache_zero_k_scale, "k_scale", "k_scale: 0 is not a usable value", NULL);
  expect_json_error(negative_v_scale, "v_scale", "v_scale: -1 is not a usable value", NULL);
  expect_json_error(string_k_scale, "k_scale type", "k_scale: must be a number", NULL);
  expect_json_error(fp8_dtype, "fp8 dtype", "dtype: fp8_e5m2 is a cache dtype only", NULL);
}

Test(step_runner, f16_step) {
  spec s = base_spec();
  s.dtype = s.cache_dtype = "f16";
  spec_fill(&s, 14);
  run_and_check(&s, NULL, 1.0 / 512);
  spec_free(&s);
}

Test(step_runner, encoder_attention_is_bidirectional) {
  spec s = base_spec();
  s.attn = "encoder";
  s.nreq = 2; /* two fresh prompts */
  s.nc[0] = 0, s.ns[0] = 6, s.np[0] = 6, s.tlen[0] = 2;
  memcpy(s.table[0], (int32_t[]){3, 5}, 2 * sizeof(int32_t));
  s.nc[1] = 0, s.ns[1] = 3, s.np[1] = 3, s.tlen[1] = 1;
  memcpy(s.table[1], (int32_t[]){7}, sizeof(int32_t));
  s.ndrafts[0] = s.ndrafts[1] = -1;
  spec_fill(&s, 15);
  run_and_check(&s, NULL, 1e-5);
  spec_free(&s);
}

Test(step_runner, dump_biases_writes_seed_tensors) {
  spec s = base_spec();
  spec_fill(&s, 16);
  run_and_check(&s, "--dump-biases", 1e-5);
  cJSON *plan = test_load_json(in_scratch("out/plan.json"));
  const cJSON *b = cJSON_GetObjectItem(plan, "bucket");
  const int64_t tq = cJSON_GetObjectItem(b, "query_len")->valueint;
  const int64_t ts = cJSON_GetObjectItem(b, "shared_blocks")->valueint;
  const int64_t tu = cJSON_GetObjectItem(b, "unique_blocks")->valueint;
  cJSON_Delete(plan);
  /* blocks 0 and 1 are read by requests 0 and 1; 6 and 7 by the three rows of request 2 */
  cr_assert_eq(ts, 4);
  npy_array a = load("out/causal_bias.npy");
  check_shape(&a, "causal_bias", NPY_F4, 2, (int64_t[]){tq, tq});
  const float *cb = a.data;
  /* row 1 (request 0, a prompt chunk) sees rows 0 and 1; row 3 (request 1, a decode) sees none here */
  cr_assert(cb[1 * tq + 0] == 0.0f && cb[1 * tq + 1] == 0.0f && isinf(cb[1 * tq + 2]));
  for (int64_t j = 0; j < tq; j++) cr_assert(isinf(cb[3 * tq + j]) && cb[3 * tq + j] < 0);
  npy_free(&a);
  a = load("out/shared_bias.npy");
  check_shape(&a, "shared_bias", NPY_F4, 3, (int64_t[]){tq, ts, s.bs});
  npy_free(&a);
  a = load("out/shared_usage.npy");
  check_shape(&a, "shared_usage", NPY_I4, 2, (int64_t[]){tq, ts});
  const int32_t *usage = a.data;
  cr_assert_eq(usage[0 * ts + 1], s.bs, "row 0 reads all of block 1");
  /* per token: the drafts at positions 5, 6, 7 see 2, 3, 4 keys of block 7 (not one usage per block) */
  cr_assert(usage[4 * ts + 3] == 2 && usage[5 * ts + 3] == 3 && usage[6 * ts + 3] == 4);
  npy_free(&a);
  a = load("out/unique_bias.npy");
  check_shape(&a, "unique_bias", NPY_F4, 2, (int64_t[]){tu, s.bs});
  npy_free(&a);
  a = load("out/unique_block_mapping.npy");
  check_shape(&a, "unique_block_mapping", NPY_I4, 1, (int64_t[]){tu});
  npy_free(&a);
  a = load("out/shared_blocks.npy");
  check_shape(&a, "shared_blocks", NPY_I4, 1, (int64_t[]){ts});
  const int32_t *ids = a.data;
  cr_assert(ids[0] == 0 && ids[1] == 1 && ids[2] == 6 && ids[3] == 7);
  npy_free(&a);
  spec_free(&s);
}

/* 256 spec-decode requests of two rows each over 9 blocks of 64: every block is shared (by its request's
 * two rows), so the seed's shared bias [512, 2304, 64] is 288 MiB, over the planner's 256 MiB limit, while
 * the attention itself is tiny. The refusal is a warning; everything else is written. */
Test(step_runner, refused_shared_bias_is_a_warning) {
  const int32_t bs = 64, per = 9, R = 256, T = 2 * R, nb = R * per;
  cJSON *j = cJSON_CreateObject();
  cJSON_AddNumberToObject(j, "block_size", bs);
  cJSON_AddNumberToObject(j, "num_blocks", nb);
  cJSON_AddNumberToObject(j, "num_q_heads", 1);
  cJSON_AddNumberToObject(j, "num_kv_heads", 1);
  cJSON_AddNumberToObject(j, "head_dim", 4);
  cJSON_AddStringToObject(j, "dtype", "f32");
  cJSON_AddStringToObject(j, "cache_dtype", "f32");
  cJSON_AddStringToObject(j, "kv_layout", "NHD");
  cJSON_AddNumberToObject(j, "scale", 0.5);
  cJSON_AddNumberToObject(j, "soft_cap", 0);
  cJSON_AddNumberToObject(j, "sliding_window", 0);
  cJSON_AddStringToObject(j, "attn_type", "decoder");
  cJSON *reqs = cJSON_AddArrayToObject(j, "requests");
  for (int32_t r = 0; r < R; r++) {
    cJSON *q = cJSON_CreateObject();
    int32_t table[9], draft = 5;
    for (int32_t i = 0; i < per; i++) table[i] = r * per + i;
    cJSON_AddNumberToObject(q, "num_computed", per * bs - 2);
    cJSON_AddNumberToObject(q, "num_scheduled", 2);
    cJSON_AddNumberToObject(q, "num_prompt", 10);
    cJSON_AddItemToObject(q, "block_table", ints(table, per));
    cJSON_AddItemToObject(q, "draft_tokens", ints(&draft, 1));
    cJSON_AddItemToArray(reqs, q);
  }
  cJSON *t = cJSON_AddObjectToObject(j, "tensors");
  const char *names[] = {"q", "k", "v", "key_cache", "value_cache"};
  const char *files[] = {"q.npy", "k.npy", "v.npy", "kc.npy", "vc.npy"};
  for (int i = 0; i < 5; i++) cJSON_AddStringToObject(t, names[i], files[i]);
  write_json_file("step.json", j);
  cJSON_Delete(j);
  test_rng rng = {17};
  float *x = random_exact(&rng, (size_t)nb * bs * 4);
  save("q.npy", NPY_F4, 3, (int64_t[]){T, 1, 4}, x);
  save("k.npy", NPY_F4, 3, (int64_t[]){T, 1, 4}, x + 1);
  save("v.npy", NPY_F4, 3, (int64_t[]){T, 1, 4}, x + 2);
  save("kc.npy", NPY_F4, 3, (int64_t[]){(int64_t)nb * bs, 1, 4}, x);
  save("vc.npy", NPY_F4, 3, (int64_t[]){(int64_t)nb * bs, 1, 4}, x);
  free(x);

  const result r = run_step("--dump-biases");
  cr_assert_eq(r.rc, 0, "%s", r.err);
  cr_assert(strstr(r.err, "uattn-run: warning: shared_bias.npy skipped (UATTN_ERR_TOO_LARGE)"), "%s", r.err);
  cr_assert_not(file_exists(in_scratch("out/shared_bias.npy")));
  npy_array a = load("out/shared_usage.npy");
  check_shape(&a, "shared_usage", NPY_I4, 2, (int64_t[]){T, nb});
  npy_free(&a);
  const char *rest[] = {"out/causal_bias.npy",   "out/unique_bias.npy", "out/unique_block_mapping.npy",
                        "out/shared_blocks.npy", "out/out.npy",         "out/plan.json"};
  for (int i = 0; i < 6; i++) cr_assert(file_exists(in_scratch(rest[i])), "%s", rest[i]);
}

/* Multi-head latent attention's expanded form (uattn.h, head_dim_v): keys 48 wide, values 32, on every path of
 * base_spec, in f32 on NHD, bf16 on an HND bf16 cache, and on the TILED step; the value cache's rows and out
 * are 32 wide, checked against the dense attention over the 32-dim values and the caches bit for bit. */
Test(step_runner, mla_expanded_values_narrower_than_keys) {
  const char *const dtypes[] = {"f32", "bf16", "f32"}, *const layouts[] = {"NHD", "HND", "TILED"};
  const double tol[] = {1e-5, 1.0 / 64, 1e-5};
  for (int c = 0; c < 3; c++) {
    spec s = !strcmp(layouts[c], "TILED") ? tiled_spec() : base_spec();
    s.layout = layouts[c];
    s.dtype = s.cache_dtype = dtypes[c];
    s.d = 48, s.dv = 32;
    s.scale = 0.125; /* exact in every dtype */
    spec_fill(&s, 60 + (uint64_t)c);
    run_and_check(&s, NULL, tol[c]);
    spec_free(&s);
  }
}

/* The absorbed form (uattn.h, kv_latent): one KV head of 72-dim latents whose first 64 dims are the values;
 * the step names no v and no value cache, the runner writes the keys alone and no value_cache.npy. f32 on NHD,
 * bf16 on an HND bf16 cache, and an fp8 cache with k_scale only (v_scale is then k_scale's) on exact values. */
Test(step_runner, mla_absorbed_latent_keys_are_values) {
  const char *const dtypes[] = {"f32", "bf16", "f32"}, *const caches[] = {"f32", "bf16", "fp8_e4m3"},
                    *const layouts[] = {"NHD", "HND", "NHD"};
  const double tol[] = {1e-5, 1.0 / 64, 1e-5};
  for (int c = 0; c < 3; c++) {
    spec s = base_spec();
    s.layout = layouts[c];
    s.dtype = dtypes[c];
    s.cache_dtype = caches[c];
    s.hkv = 1, s.d = 72, s.dv = 64, s.latent = true;
    s.scale = 0.125;
    if (is_fp8(s.cache_dtype)) s.k_scale = 0.5;
    spec_fill(&s, 70 + (uint64_t)c);
    if (is_fp8(s.cache_dtype)) fp8_exact_tensors(&s, 170 + (uint64_t)c);
    run_and_check(&s, NULL, tol[c]);
    spec_free(&s);
  }
}
