/* One attention step dumped from an engine, as uattn-run reads it (perf/run/step.c): STEP.json and the .npy
 * tensors it names, read and checked against each other; the format is in uattn-run --help. A library of its
 * own, so tests/fuzz/fuzz_step_runner.c reads steps as uattn-run does. */
#ifndef UATTN_PERF_STEP_H
#define UATTN_PERF_STEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/npy.h"
#include "uattn.h"

typedef struct step_tensor {
  const char *key; /* "q", ... as in "tensors" */
  char *path;      /* resolved against STEP.json's directory; NULL for an optional tensor not given */
  npy_array a;
} step_tensor;

enum { STEP_Q, STEP_K, STEP_V, STEP_KEY_CACHE, STEP_VALUE_CACHE, STEP_SINKS, STEP_ALIBI, STEP_TENSORS };

typedef struct step {
  int32_t block_size, num_blocks, hq, hkv, head_dim;
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

#endif
