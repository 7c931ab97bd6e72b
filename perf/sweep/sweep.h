/* uattn-sweep's workload (perf/sweep/workload.c): a list of steps independent of the block size, made from
 * the serving-trace simulator (perf/common/trace.h) or read from a trace file, laid out over a paged cache for one
 * block size at a time, and the batch-bucketing sweep over it. The timing sweep is in perf/sweep/sweep.c. */
#ifndef UATTN_PERF_SWEEP_H
#define UATTN_PERF_SWEEP_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "common/trace.h"
#include "uattn.h"

/* One request of a step, in tokens: what a trace file says. */
typedef struct sweep_req {
  int32_t computed;  /* tokens already in the cache */
  int32_t scheduled; /* new tokens this step (drafts + 1 for a verification) */
  int32_t prompt;    /* prompt length */
  int32_t drafts;    /* speculative drafts verified this step, 0 = none */
} sweep_req;

typedef struct sweep_step {
  int32_t num_reqs;
  sweep_req *reqs;
} sweep_step;

typedef struct sweep_workload {
  char source[300]; /* "generated" or the trace file's path */
  int32_t num_steps;
  sweep_step *steps;
  int32_t shared_prefix; /* tokens at the start of every request held once in the cache */
  int32_t max_num_seqs, max_num_batched_tokens, max_model_len;
  /* totals, for the report */
  int64_t query_tokens, prefill_tokens, decode_rows, verify_rows, context_keys;
} sweep_workload;

/* The workload over a paged cache of one block size: steps the planner takes. Each request's blocks are
 * its own except the shared prefix's full blocks (a request reads them once they are in its cache); ids are
 * shuffled over a pool a little larger than the largest step needs, as in an engine's cache. */
typedef struct sweep_layout {
  int32_t block_size, num_blocks, stride;
  int32_t num_steps;
  uattn_step *steps;
} sweep_layout;

/* steps of the trace simulator's: skip, skip + stride, skip + 2 * stride, ... (fewer if it runs dry).
 * 0, or -1 with a message. */
int sweep_workload_generate(sweep_workload *w, const trace_config *tc, int32_t skip, int32_t stride, int32_t steps,
                            char *err, size_t cap);
/* A trace file (format in uattn-sweep --help). 0, or -1 with a message naming the file and the key. */
int sweep_workload_load(sweep_workload *w, const char *path, char *err, size_t cap);
/* Writes w as a trace file. 0 or -1 (errno). */
int sweep_workload_save(const sweep_workload *w, const char *path);
/* A JSON description of w for the tuning file's "workload". */
cJSON *sweep_workload_json(const sweep_workload *w);
void sweep_workload_free(sweep_workload *w);

int sweep_layout_build(sweep_layout *l, const sweep_workload *w, int32_t block_size);
void sweep_layout_free(sweep_layout *l);
/* A plan config sized for the layout (no bucketing, default split-K). */
uattn_plan_config sweep_plan_config(const sweep_workload *w, const sweep_layout *l);

/* Plans every step with the seed's bucket set and a few alternatives, prints the padding each wastes
 * against the real sizes to out and returns the same as JSON (NULL on an error, with a message on stderr). */
cJSON *sweep_batch_buckets(const sweep_workload *w, const sweep_layout *l, FILE *out);

#endif
