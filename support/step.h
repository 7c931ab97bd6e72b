/* One attention step dumped from an engine, as uattn-run reads it (support/step.c): STEP.json and the .npy
 * tensors it names, read and checked against each other; the format is in uattn-run --help. A library of its
 * own, so tests/fuzz/fuzz_step_runner.c reads steps as uattn-run does. */
#ifndef UATTN_SUPPORT_STEP_H
#define UATTN_SUPPORT_STEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "support/npy.h"
#include "uattn.h"

typedef struct step_tensor {
  const char *key; /* "q", ... as in "tensors" */
  char *path;      /* resolved against STEP.json's directory; NULL for an optional tensor not given */
  npy_array a;
} step_tensor;

enum { STEP_Q, STEP_K, STEP_V, STEP_KEY_CACHE, STEP_VALUE_CACHE, STEP_SINKS, STEP_ALIBI, STEP_TENSORS };

typedef struct step {
  int32_t block_size, num_blocks, hq, hkv, head_dim;
  int32_t head_dim_v; /* Dv of v, the value cache and out: "head_dim_v", head_dim when absent or 0 */
  bool kv_latent;     /* "kv_latent": no v and no value cache, each key's first head_dim_v dims its value */
  uattn_dtype dtype, cache_dtype;
  uattn_kv_layout layout;
  uattn_attention_type attn_type;
  float scale, soft_cap;
  float k_scale, v_scale; /* fp8 caches: "k_scale" / "v_scale", 1 when absent */
  int32_t sliding_window, causal_width, chunk_size;
  int32_t threads; /* workers of the runtime; 0 (absent) = one per core, or $UATTN_NUM_THREADS */

  int32_t num_reqs, stride, num_tokens, max_model_len;
  int32_t *num_computed, *num_scheduled, *num_prompt, *table;
  int32_t *drafts, *draft_offsets; /* CSR; NULL when no request lists drafts */

  step_tensor t[STEP_TENSORS];
} step;

/* Reads json_path into *s (step_free it, whatever the result): 0, or -1 with the one line uattn-run prints,
 * naming the JSON key or the file at fault, in why[cap]. Unknown keys are warnings on stderr. */
int step_read(step *s, const char *json_path, char *why, size_t cap);
void step_free(step *s);

/* ---- running a step and writing its results: uattn-run and uattn-run-cp (perf/run_cp) alike ------------- */

/* The plan's config as uattn-run plans a step: limits from the step itself, no bucketing. */
uattn_plan_config step_plan_config(const step *s);
/* The scheduler state and the layer the step describes (pointers into *s). */
uattn_step step_batch(const step *s);
uattn_layer step_layer(const step *s);

/* The functions below return 0, or -1 with the one line uattn-run prints in why[cap]. */

/* Creates the output directory and its parents (mkdir -p). */
int step_make_dir(const char *dir, char *why, size_t cap);
/* dir/name as a .npy file. */
int step_write_npy(const char *dir, const char *name, npy_dtype dtype, int ndim, const int64_t *shape, const void *data,
                   char *why, size_t cap);
/* out.npy [T, Hq, Dv] (widened to f32 from the step's dtype), lse.npy and the caches after the update
 * (key_cache.npy, value_cache.npy, in the step's cache dtype and layout; a kv_latent step has no value cache
 * and value_cache is ignored) in dir. */
int step_write_results(const step *s, const char *dir, const void *out, const float *lse, const void *key_cache,
                       const void *value_cache, char *why, size_t cap);
/* plan.json: the planner's metadata of the planned step. */
int step_write_plan(const uattn_plan_info *in, const char *dir, char *why, size_t cap);
/* dir/name as JSON text (cJSON_Print). */
struct cJSON;
int step_write_json(const char *dir, const char *name, const struct cJSON *root, char *why, size_t cap);

#endif
