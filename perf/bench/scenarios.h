/* uattn-bench's model presets and scenarios: the steps it times, and what each must cost at the least (the
 * KV bytes it must read and the flops of its visible query-key pairs). */
#ifndef UATTN_PERF_SCENARIOS_H
#define UATTN_PERF_SCENARIOS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/trace.h"
#include "uattn.h"

/* Which cases a preset runs. Multi-head latent attention has two forms, each for its own kind of step (an engine
 * runs decodes and verifications in the absorbed form and prompts in the expanded one), so its presets run only
 * the cases of their form. */
typedef enum bench_case_set {
  BENCH_CASES_ALL = 0,
  BENCH_CASES_DECODE = 1, /* cases without prompt rows: decodes, verifications, a shared prefix */
  BENCH_CASES_PROMPT = 2, /* cases of prompt chunks alone */
} bench_case_set;

/* One attention layer of a model, as one rank runs it. */
typedef struct bench_preset {
  const char *name;
  const char *what;
  int32_t hq, hkv, head_dim;
  float soft_cap;     /* 0: none */
  int32_t head_dim_v; /* of the values and out; 0: head_dim */
  bool kv_latent;     /* uattn_layer.kv_latent: one latent row per key, its first head_dim_v dims the value */
  float scale;        /* 0: 1/sqrt(head_dim) */
  bench_case_set cases;
} bench_preset;

extern const bench_preset bench_presets[];
extern const int bench_num_presets;

/* Requests of one kind in a case: count of them, cached keys spread evenly from context_lo to context_hi,
 * `queries` rows each, a prompt chunk (its rows also attend to each other, the causal part) or not (a
 * decode, or a verification of queries - 1 drafts, reading every key from the cache). */
typedef struct bench_group {
  int32_t count;
  int32_t context_lo, context_hi;
  int32_t queries;
  bool prompt;
} bench_group;

/* One case of a scenario: a fixed batch, or (from_trace) a step of the serving-trace simulator. */
typedef struct bench_case {
  const char *scenario; /* what --scenario matches a part of, with name */
  const char *name;
  const char *what;
  int32_t shared_prefix; /* keys at the start of every request that are the same cache blocks */
  bench_group groups[2];
  bool from_trace;
} bench_case;

extern const bench_case bench_cases[];
extern const int bench_num_cases;

/* Whether preset p runs case c (its case set). */
bool bench_preset_runs(const bench_preset *p, const bench_case *c);
/* The width of p's values and out. */
int32_t bench_head_dim_v(const bench_preset *p);

/* A case's step at a block size, with a cache to hold it. */
typedef struct bench_step {
  uattn_step step;
  int32_t num_blocks; /* blocks the cache needs */
  int32_t max_model_len;
  int32_t max_tokens;
  char what[200];  /* the case's description, with the trace step's mix */
  int32_t *arrays; /* owned */
  trace *tr;       /* owned; holds the step's arrays for a trace case */
} bench_step;

/* scatter: a fixed batch's blocks (but a shared prefix's) numbered in a shuffled order, not as handed out
 * (a trace step's always are). Returns 0, or -1 with a message in err (out of memory, a block size too large
 * for the trace). */
int bench_step_build(const bench_case *c, int32_t block_size, bool scatter, bench_step *out, char *err,
                     size_t err_size);
void bench_step_free(bench_step *s);

/* What a planned step must cost at the least. */
typedef struct bench_work {
  int32_t tokens;     /* query rows */
  double cache_bytes; /* KV read from the cache: each distinct block once per KV head, the keys used */
  double io_bytes;    /* q, k, v read, out written, the new k and v written to the cache */
  double flops;       /* 2 x (head_dim + head_dim_v) per visible (query, key) pair and query head */
} bench_work;

/* For a decoder layer without a sliding window (every preset): a row at position p sees p + 1 keys. A latent
 * cache (kv_latent) holds one row of head_dim per key and KV head, read for both products, and no values.
 * elem_bytes: the size of one element of q, k, v and out; cache_elem_bytes: of the caches (1 for fp8, so an
 * fp8 decode's read bandwidth is counted in the bytes it actually reads). Returns 0, or -1 when out of memory. */
int bench_count_work(const uattn_plan *plan, const uattn_step *step, int32_t num_blocks, const bench_preset *p,
                     int32_t elem_bytes, int32_t cache_elem_bytes, bench_work *out);

#endif
