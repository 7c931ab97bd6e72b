/* The step runner (perf/run/uattn_run.c) and its .npy reader/writer (support/npy.c).
 *
 * npy: round trips of every dtype and of odd shapes, NumPy's own files (when $UATTN_PYTHON has numpy),
 * every malformed header we could think of, each refused with its reason and without a leak.
 * uattn-run ($UATTN_RUN, the built binary): every kind of bad input exits 2 with one line naming the key or
 * file, and whole steps — f32; bf16 with an f16 HND cache, sinks, ALiBi, soft cap and a sliding window;
 * fp8 caches with scales; TILED caches; encoder — are compared with a dense attention computed here in
 * double, straight from the semantics (docs/design.md), never from the plan.
 *
 * This header holds what the suite's files share: the scratch directory and its files (files.c), and the step
 * built here, written out and run through the binary (spec.c). */
#ifndef UATTN_TEST_STEP_RUNNER_H
#define UATTN_TEST_STEP_RUNNER_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/support.h"
#include "support/npy.h"

/* ---- a scratch directory per test (each test is its own process) ---------------------------------------- */

/* the test's directory, made by the suites' init */
extern char scratch[512];
/* name in the scratch directory, in one of four static buffers */
const char *in_scratch(const char *name);
void write_bytes(const char *path, const void *data, size_t n);
void write_text(const char *path, const char *text);
bool file_exists(const char *path);
/* A file with exactly this header text (NumPy pads; the reader must not need it). */
void raw_npy(const char *path, int major, const char *header, const void *data, size_t bytes);
/* ---- the runner: a step, built here ------------------------------------------------------------------- */

enum { MAX_REQS = 4, MAX_COLS = 8 };

typedef struct spec {
  int32_t bs, nb, hq, hkv, d;
  const char *dtype, *cache_dtype, *layout, *attn;
  double scale, soft_cap;
  int32_t window;
  int nreq;
  int32_t nc[MAX_REQS], ns[MAX_REQS], np[MAX_REQS];
  int32_t table[MAX_REQS][MAX_COLS];
  int tlen[MAX_REQS];
  int32_t drafts[MAX_REQS][4];
  int ndrafts[MAX_REQS]; /* -1: no draft_tokens key */
  bool sinks, alibi;
  double k_scale, v_scale; /* fp8 caches; 0: no key in the JSON (the default, 1) */
  int32_t dv;              /* "head_dim_v": values dv wide; 0: no key in the JSON (values d wide) */
  bool latent;             /* "kv_latent": no v, no value cache; a key's first dv dims are its value */
  /* data, as exact values k/64 (|k| <= 128) so every dtype holds them exactly */
  int32_t T, qsl[MAX_REQS + 1], eff[MAX_REQS];
  float *q, *k, *v, *kc, *vc, sink[16], slope[16]; /* caches as [slot][h][d] whatever the layout */
} spec;

/* The row length of the spec's keys (value false) or values (true): d, or dv where the spec sets it. */
int spec_dims(const spec *s, bool value);

float *random_exact(test_rng *rng, size_t n);
void spec_fill(spec *s, uint64_t seed);
void spec_free(spec *s);
/* A shared prefix, a chunked prefill, a decode, a spec-decode verification with a placeholder, and a fresh
 * prompt: every path of the plan (causal, shared, unique) in one small f32 step. */
spec base_spec(void);
/* An f32 decoder step of 4 requests, 4 query and 2 KV heads of dim 8, on nb blocks of bs in the layout: what
 * base_spec and the TILED step share, their requests left to them. */
spec four_request_spec(int32_t bs, int32_t nb, const char *layout);
cJSON *ints(const int32_t *x, int n);
cJSON *spec_json(const spec *s);
bool is_fp8(const char *dtype);
npy_dtype npy_of(const char *dtype);
/* Where (slot, KV head h, dim d) of a key cache (value false) or value cache (value true) lies in the spec's
 * layout, D = spec_dims, written from uattn.h's definitions: NHD [slots, Hkv, D], HND [blocks, Hkv, bs, D], TILED keys
 * [blocks, bs / 16, Hkv, D / 2, 16, 2] at (b, o / 16, h, d / 2, o % 16, d % 2) and values
 * [blocks, bs / 16, Hkv, 8, D, 2] at (b, o / 16, h, o % 16 / 2, d, o % 2), with b = slot / bs, o = slot % bs. */
size_t layout_index(const spec *s, bool value, int64_t slot, int h, int d);
/* a [slot][h][d] key (value false) or value cache in the spec's layout and dtype; scale: an fp8 cache's
 * k_scale or v_scale */
void *encode_cache(const spec *s, const float *c, double scale, bool value, int64_t *shape, int *ndim);
void save(const char *name, npy_dtype dtype, int ndim, const int64_t *shape, const void *data);
void write_json_file(const char *name, const cJSON *root);
/* The step's files in the scratch directory: step.json and its tensors. */
void spec_write(const spec *s);

/* ---- running the binary --------------------------------------------------------------------------------- */
typedef struct result {
  int rc;
  char err[8192];
  char out[4096];
} result;

/* Runs uattn-run with args (NULL-terminated), its output captured. */
result run_tool(const char *const *args);
result run_step(const char *extra);
/* Exit status 2 and exactly one line on stderr, "uattn-run: ..." holding every fragment given. */
void expect_error(const result *r, const char *what, const char *frag1, const char *frag2);
/* Writes the base step with one change to its JSON, runs it, expects the error. */
typedef void (*mutation)(cJSON *root);
/* The step's files as spec_write writes them, its step.json edited by m first. */
void spec_write_edited(const spec *s, mutation m);
void expect_json_error(mutation m, const char *what, const char *frag1, const char *frag2);

#endif
