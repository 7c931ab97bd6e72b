/* A serving-trace simulator: continuous batching the way vLLM's v1 scheduler does it, producing one
 * uattn_step per engine step. Requests share a system prompt (its blocks are cached once and appear in every
 * request's table at the same positions), prompts are chunked to the token budget, decodes run every step,
 * and a share of requests verify speculative drafts. Used by the demo and the benchmarks. */
#ifndef UATTN_PERF_TRACE_H
#define UATTN_PERF_TRACE_H

#include <stdint.h>

#include "uattn.h"

typedef struct trace_config {
  int32_t block_size;
  int32_t num_blocks;
  int32_t max_num_seqs;
  int32_t max_num_batched_tokens;
  int32_t max_model_len;
  int32_t system_prompt_len;      /* shared by every request, cached from the start */
  int32_t prompt_min, prompt_max; /* user part of the prompt */
  int32_t output_min, output_max;
  double spec_decode_share; /* requests that verify drafts */
  int32_t num_spec_tokens;  /* drafts per verification step */
  int32_t arrivals_per_step;
  uint64_t seed;
} trace_config;

/* A default trace for a serving workload with the given limits. */
trace_config trace_config_default(int32_t block_size, int32_t num_blocks, int32_t max_num_seqs,
                                  int32_t max_num_batched_tokens, int32_t max_model_len);

/* What one step holds, by kind of request. */
typedef struct trace_step_mix {
  int32_t prefills, prefill_tokens;  /* prompt chunks */
  int32_t decodes;                   /* one-token decodes */
  int32_t spec_decodes, spec_tokens; /* verification of drafts */
  int32_t finished;                  /* requests that finished with the previous step and left */
} trace_step_mix;

typedef struct trace trace;

/* NULL on bad config or no memory. */
trace *trace_create(const trace_config *config);
void trace_destroy(trace *t);
/* Applies the previous step as if it ran, then schedules the next one into *step (arrays owned by the
 * trace, valid until the next call). Returns 0 when nothing is left to schedule. */
int trace_next(trace *t, uattn_step *step, trace_step_mix *mix);

#endif
