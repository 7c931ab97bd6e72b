/* The step the runner's tests build (step_runner.h): its requests and exact random data, its JSON and tensors
 * written to the scratch directory in any dtype and cache layout, and uattn-run run on it. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/dense_oracle.h"
#include "step_runner.h"
/* ---- the runner: a step, built here ------------------------------------------------------------------- */

static int32_t scheduled(const spec *s, int r) {
  if (s->ndrafts[r] <= 0) return s->ns[r];
  int32_t n = 1;
  for (int i = 0; i < s->ndrafts[r]; i++) n += s->drafts[r][i] != -1;
  return n;
}

float *random_exact(test_rng *rng, size_t n) {
  float *x = malloc(sizeof(float) * (n ? n : 1));
  for (size_t i = 0; i < n; i++) x[i] = (float)test_rng_range(rng, -128, 128) / 64.0f;
  return x;
}

void spec_fill(spec *s, uint64_t seed) {
  test_rng rng = {seed};
  s->qsl[0] = 0;
  for (int r = 0; r < s->nreq; r++) {
    s->eff[r] = scheduled(s, r);
    s->qsl[r + 1] = s->qsl[r] + s->eff[r];
  }
  s->T = s->qsl[s->nreq];
  const size_t slots = (size_t)s->nb * s->bs, dv = (size_t)spec_dims(s, true);
  s->q = random_exact(&rng, (size_t)s->T * s->hq * s->d);
  s->k = random_exact(&rng, (size_t)s->T * s->hkv * s->d);
  s->v = random_exact(&rng, (size_t)s->T * s->hkv * dv); /* a latent spec's are drawn but never written */
  s->kc = random_exact(&rng, slots * s->hkv * s->d);
  s->vc = random_exact(&rng, slots * s->hkv * dv);
  for (int h = 0; h < s->hq; h++) {
    s->sink[h] = (float)test_rng_range(&rng, -64, 128) / 64.0f;
    s->slope[h] = 1.0f / (float)(2 << h);
  }
}

int spec_dims(const spec *s, bool value) { return value && s->dv > 0 ? s->dv : s->d; }

void spec_free(spec *s) {
  free(s->q);
  free(s->k);
  free(s->v);
  free(s->kc);
  free(s->vc);
}

spec four_request_spec(int32_t bs, int32_t nb, const char *layout) {
  spec s;
  memset(&s, 0, sizeof s);
  s.bs = bs, s.nb = nb, s.hq = 4, s.hkv = 2, s.d = 8;
  s.dtype = s.cache_dtype = "f32";
  s.layout = layout;
  s.attn = "decoder";
  s.scale = 0.3;
  s.nreq = 4;
  return s;
}

spec base_spec(void) {
  spec s = four_request_spec(4, 12, "NHD");
  /* request 0: a prompt chunk at positions 8..10 over blocks 0, 1 (shared with request 1) */
  s.nc[0] = 8, s.ns[0] = 3, s.np[0] = 20, s.tlen[0] = 4;
  memcpy(s.table[0], (int32_t[]){0, 1, 2, 3}, 4 * sizeof(int32_t));
  /* request 1: a decode at position 13 */
  s.nc[1] = 13, s.ns[1] = 1, s.np[1] = 6, s.tlen[1] = 4;
  memcpy(s.table[1], (int32_t[]){0, 1, 4, 5}, 4 * sizeof(int32_t));
  /* request 2: verifies 2 drafts (the scheduler reports 4: the placeholder does not count) */
  s.nc[2] = 5, s.ns[2] = 4, s.np[2] = 3, s.tlen[2] = 3;
  memcpy(s.table[2], (int32_t[]){6, 7, 8}, 3 * sizeof(int32_t));
  s.ndrafts[2] = 3;
  memcpy(s.drafts[2], (int32_t[]){11, -1, 12}, 3 * sizeof(int32_t));
  /* request 3: a whole prompt */
  s.nc[3] = 0, s.ns[3] = 5, s.np[3] = 5, s.tlen[3] = 2;
  memcpy(s.table[3], (int32_t[]){9, 10}, 2 * sizeof(int32_t));
  s.ndrafts[0] = s.ndrafts[1] = s.ndrafts[3] = -1;
  return s;
}

cJSON *ints(const int32_t *x, int n) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(x[i]));
  return a;
}

cJSON *spec_json(const spec *s) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "block_size", s->bs);
  cJSON_AddNumberToObject(o, "num_blocks", s->nb);
  cJSON_AddNumberToObject(o, "num_q_heads", s->hq);
  cJSON_AddNumberToObject(o, "num_kv_heads", s->hkv);
  cJSON_AddNumberToObject(o, "head_dim", s->d);
  cJSON_AddStringToObject(o, "dtype", s->dtype);
  cJSON_AddStringToObject(o, "cache_dtype", s->cache_dtype);
  cJSON_AddStringToObject(o, "kv_layout", s->layout);
  cJSON_AddNumberToObject(o, "scale", s->scale);
  cJSON_AddNumberToObject(o, "soft_cap", s->soft_cap);
  cJSON_AddNumberToObject(o, "sliding_window", s->window);
  cJSON_AddStringToObject(o, "attn_type", s->attn);
  if (s->k_scale > 0) cJSON_AddNumberToObject(o, "k_scale", s->k_scale);
  if (s->v_scale > 0) cJSON_AddNumberToObject(o, "v_scale", s->v_scale);
  if (s->dv > 0) cJSON_AddNumberToObject(o, "head_dim_v", s->dv);
  if (s->latent) cJSON_AddBoolToObject(o, "kv_latent", true);
  cJSON *reqs = cJSON_AddArrayToObject(o, "requests");
  for (int r = 0; r < s->nreq; r++) {
    cJSON *q = cJSON_CreateObject();
    cJSON_AddNumberToObject(q, "num_computed", s->nc[r]);
    cJSON_AddNumberToObject(q, "num_scheduled", s->ns[r]);
    cJSON_AddNumberToObject(q, "num_prompt", s->np[r]);
    cJSON_AddItemToObject(q, "block_table", ints(s->table[r], s->tlen[r]));
    if (s->ndrafts[r] >= 0) cJSON_AddItemToObject(q, "draft_tokens", ints(s->drafts[r], s->ndrafts[r]));
    cJSON_AddItemToArray(reqs, q);
  }
  cJSON *t = cJSON_AddObjectToObject(o, "tensors");
  cJSON_AddStringToObject(t, "q", "q.npy");
  cJSON_AddStringToObject(t, "k", "k.npy");
  if (!s->latent) cJSON_AddStringToObject(t, "v", "v.npy");
  cJSON_AddStringToObject(t, "key_cache", "kc.npy");
  if (!s->latent) cJSON_AddStringToObject(t, "value_cache", "vc.npy");
  if (s->sinks) cJSON_AddStringToObject(t, "sinks", "sinks.npy");
  if (s->alibi) cJSON_AddStringToObject(t, "alibi_slopes", "alibi.npy");
  return o;
}

static uint16_t to_bf16(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  cr_assert_eq(b & 0xffffu, 0, "%g is not exact in bf16", x);
  return (uint16_t)(b >> 16);
}

static uint16_t to_f16(float x) { /* exact values only, which is all the test makes */
  uint32_t b;
  memcpy(&b, &x, 4);
  if ((b & 0x7fffffffu) == 0) return (uint16_t)(b >> 16);
  const int e = (int)((b >> 23) & 0xff) - 127 + 15;
  cr_assert(e > 0 && e < 31 && (b & 0x1fffu) == 0, "%g is not exact in f16", x);
  return (uint16_t)(((b >> 16) & 0x8000u) | (uint32_t)e << 10 | ((b & 0x7fffffu) >> 13));
}

bool is_fp8(const char *dtype) { return !strncmp(dtype, "fp8_", 4); }

static uattn_dtype fp8_of(const char *dtype) { return !strcmp(dtype, "fp8_e4m3") ? UATTN_FP8_E4M3 : UATTN_FP8_E5M2; }

/* The fp8 code holding x / scale, for values that are exactly code * scale (all the fp8 test makes): the
 * expected cache is then exact, and so is the dense attention on the float values. */
static uint8_t to_fp8(float x, const char *dtype, float scale) {
  const uattn_dtype t = fp8_of(dtype);
  const uint8_t b = oracle_quantize_fp8(t, x, scale);
  cr_assert_eq(oracle_fp8_to_double(t, b) * scale, (double)x, "%g is not exact in %s times %g", x, dtype, scale);
  return b;
}

npy_dtype npy_of(const char *dtype) {
  return is_fp8(dtype) ? NPY_U1 : !strcmp(dtype, "f32") ? NPY_F4 : !strcmp(dtype, "bf16") ? NPY_U2 : NPY_F2;
}

/* x in dtype, as the bytes a file holds (an fp8 cache's through its scale) */
static void *encode_scaled(const float *x, size_t n, const char *dtype, float scale) {
  if (is_fp8(dtype)) {
    uint8_t *y = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) y[i] = to_fp8(x[i], dtype, scale);
    return y;
  }
  if (!strcmp(dtype, "f32")) {
    float *y = malloc(sizeof(float) * (n ? n : 1));
    memcpy(y, x, sizeof(float) * n);
    return y;
  }
  uint16_t *y = malloc(sizeof(uint16_t) * (n ? n : 1));
  for (size_t i = 0; i < n; i++) y[i] = !strcmp(dtype, "bf16") ? to_bf16(x[i]) : to_f16(x[i]);
  return y;
}

static void *encode(const float *x, size_t n, const char *dtype) { return encode_scaled(x, n, dtype, 1.0f); }

size_t layout_index(const spec *s, bool value, int64_t slot, int h, int d) {
  const size_t b = (size_t)(slot / s->bs), o = (size_t)(slot % s->bs), H = (size_t)s->hkv;
  const size_t D = (size_t)spec_dims(s, value);
  if (!strcmp(s->layout, "NHD")) return ((size_t)slot * H + (size_t)h) * D + (size_t)d;
  if (!strcmp(s->layout, "HND")) return ((b * H + (size_t)h) * (size_t)s->bs + o) * D + (size_t)d;
  const size_t tiles = (size_t)s->bs / 16, t = o / 16, i = o % 16;
  if (value) return (((((b * tiles + t) * H + (size_t)h) * 8 + i / 2) * D + (size_t)d) * 2) + i % 2;
  return ((((b * tiles + t) * H + (size_t)h) * (D / 2) + (size_t)d / 2) * 16 + i) * 2 + (size_t)d % 2;
}

/* The shape of a key or value cache in the spec's layout (as layout_index); its dimensions in *ndim. */
static void cache_shape(const spec *s, bool value, int64_t *shape, int *ndim) {
  const int64_t D = spec_dims(s, value);
  if (!strcmp(s->layout, "NHD")) {
    shape[0] = (int64_t)s->nb * s->bs, shape[1] = s->hkv, shape[2] = D;
    *ndim = 3;
  } else if (!strcmp(s->layout, "HND")) {
    shape[0] = s->nb, shape[1] = s->hkv, shape[2] = s->bs, shape[3] = D;
    *ndim = 4;
  } else {
    const int64_t k[6] = {s->nb, s->bs / 16, s->hkv, D / 2, 16, 2}, v[6] = {s->nb, s->bs / 16, s->hkv, 8, D, 2};
    memcpy(shape, value ? v : k, sizeof k);
    *ndim = 6;
  }
}

void *encode_cache(const spec *s, const float *c, double scale, bool value, int64_t *shape, int *ndim) {
  const int D = spec_dims(s, value);
  const size_t n = (size_t)s->nb * s->bs * s->hkv * D;
  float *perm = malloc(sizeof(float) * n);
  for (int64_t slot = 0; slot < (int64_t)s->nb * s->bs; slot++)
    for (int h = 0; h < s->hkv; h++)
      for (int d = 0; d < D; d++) perm[layout_index(s, value, slot, h, d)] = c[((size_t)slot * s->hkv + h) * D + d];
  cache_shape(s, value, shape, ndim);
  void *out = encode_scaled(perm, n, s->cache_dtype, scale > 0 ? (float)scale : 1.0f);
  free(perm);
  return out;
}

void save(const char *name, npy_dtype dtype, int ndim, const int64_t *shape, const void *data) {
  char err[256];
  cr_assert_eq(npy_write(in_scratch(name), dtype, ndim, shape, data, err, sizeof err), 0, "%s: %s", name, err);
}

static void save_encoded(const char *name, const char *dtype, int ndim, const int64_t *shape, const float *x) {
  size_t n = 1;
  for (int d = 0; d < ndim; d++) n *= (size_t)shape[d];
  void *e = encode(x, n, dtype);
  save(name, npy_of(dtype), ndim, shape, e);
  free(e);
}

void write_json_file(const char *name, const cJSON *root) {
  char *text = cJSON_Print(root);
  write_text(in_scratch(name), text);
  cJSON_free(text);
}

void spec_write(const spec *s) {
  const int64_t qs[] = {s->T, s->hq, s->d}, ks[] = {s->T, s->hkv, s->d}, vs[] = {s->T, s->hkv, spec_dims(s, true)},
                hs[] = {s->hq};
  save_encoded("q.npy", s->dtype, 3, qs, s->q);
  save_encoded("k.npy", s->dtype, 3, ks, s->k);
  if (!s->latent) save_encoded("v.npy", s->dtype, 3, vs, s->v);
  int64_t kshape[6], vshape[6];
  int nd;
  void *kc = encode_cache(s, s->kc, s->k_scale, false, kshape, &nd);
  save("kc.npy", npy_of(s->cache_dtype), nd, kshape, kc);
  free(kc);
  if (!s->latent) {
    void *vc = encode_cache(s, s->vc, s->v_scale, true, vshape, &nd);
    save("vc.npy", npy_of(s->cache_dtype), nd, vshape, vc);
    free(vc);
  }
  if (s->sinks) save("sinks.npy", NPY_F4, 1, hs, s->sink);
  if (s->alibi) save("alibi.npy", NPY_F4, 1, hs, s->slope);
  cJSON *j = spec_json(s);
  write_json_file("step.json", j);
  cJSON_Delete(j);
}

/* ---- running the binary --------------------------------------------------------------------------------- */

static void slurp(const char *path, char *buf, size_t cap) {
  buf[0] = '\0';
  FILE *f = fopen(path, "rb");
  if (!f) return;
  const size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = '\0';
  fclose(f);
}

result run_tool(const char *const *args) {
  const char *exe = getenv("UATTN_RUN"); /* checked by setup_runner */
  const char *argv[32] = {exe};
  int n = 1;
  while (args[n - 1] && n < 31) argv[n] = args[n - 1], n++;
  argv[n] = NULL;
  char out_path[1024], err_path[1024];
  snprintf(out_path, sizeof out_path, "%s/.stdout", scratch);
  snprintf(err_path, sizeof err_path, "%s/.stderr", scratch);
  fflush(NULL);
  const pid_t pid = fork();
  cr_assert_neq(pid, -1, "fork: %s", strerror(errno));
  if (pid == 0) {
    const int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0) _exit(127);
    execv(exe, (char *const *)argv);
    _exit(127);
  }
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  result r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  slurp(err_path, r.err, sizeof r.err);
  slurp(out_path, r.out, sizeof r.out);
  return r;
}

result run_step(const char *extra) {
  const char *args[] = {in_scratch("step.json"), "--out", in_scratch("out"), extra, NULL};
  return run_tool(args);
}

void expect_error(const result *r, const char *what, const char *frag1, const char *frag2) {
  cr_assert_eq(r->rc, 2, "%s: exit %d, stderr: %s", what, r->rc, r->err);
  const char *nl = strchr(r->err, '\n');
  cr_assert(nl && nl[1] == '\0', "%s: not one line: %s", what, r->err);
  cr_assert(!strncmp(r->err, "uattn-run: ", 11), "%s: %s", what, r->err);
  cr_assert(strstr(r->err, frag1), "%s: \"%s\" not in: %s", what, frag1, r->err);
  if (frag2) cr_assert(strstr(r->err, frag2), "%s: \"%s\" not in: %s", what, frag2, r->err);
}

void spec_write_edited(const spec *s, mutation m) {
  spec_write(s);
  cJSON *j = spec_json(s);
  m(j);
  write_json_file("step.json", j);
  cJSON_Delete(j);
}

void expect_json_error(mutation m, const char *what, const char *frag1, const char *frag2) {
  spec s = base_spec();
  spec_fill(&s, 1);
  spec_write_edited(&s, m);
  const result r = run_step(NULL);
  expect_error(&r, what, frag1, frag2);
  spec_free(&s);
}
