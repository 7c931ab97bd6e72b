/*
 * uattn — unified-batch paged attention for CPUs.
 *
 * One inference step's attention for a batch that mixes prefills, chunked prefills, decodes and
 * speculative-decode verification, over a paged KV cache. This header is the whole public API.
 *
 * Conventions
 *  - Every function returns a uattn_status. On an error, uattn_last_error() gives a message for this
 *    thread, and nothing the call was given to write (plan, caches, outputs) has been changed.
 *  - Counts and indices are int32_t, slots int64_t (vLLM's types). Arrays are row-major and dense unless a
 *    stride is given; strides are in elements.
 *  - A plan is used by one thread at a time; distinct plans may be used from distinct threads.
 */
#ifndef UATTN_H
#define UATTN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define UATTN_VERSION_MAJOR 0
#define UATTN_VERSION_MINOR 1
#define UATTN_VERSION_PATCH 0

#if defined(_WIN32)
#define UATTN_API
#else
#define UATTN_API __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------------------------------ */
/* Status and errors                                                                                */
/* ------------------------------------------------------------------------------------------------ */

typedef enum uattn_status {
  UATTN_OK = 0,
  UATTN_ERR_INVALID_ARGUMENT = 1, /* a null pointer, a negative or zero count where none can be */
  UATTN_ERR_OUT_OF_RANGE = 2,     /* an index past its array: block id, position past a table row */
  UATTN_ERR_INCONSISTENT = 3,     /* inputs that contradict each other, e.g. a broken block table */
  UATTN_ERR_CAPACITY = 4,         /* more than the limits the object was created with */
  UATTN_ERR_OVERFLOW = 5,         /* a count or product that does not fit its integer type */
  UATTN_ERR_TOO_LARGE = 6,        /* a tensor above a caller-set byte limit: refused, not attempted */
  UATTN_ERR_NO_MEMORY = 7,
  UATTN_ERR_UNSUPPORTED = 8,
} uattn_status;

/* The message of the last failed call on this thread ("" if none). Valid until this thread's next call. */
UATTN_API const char *uattn_last_error(void);
/* A constant name for a status, e.g. "UATTN_ERR_OUT_OF_RANGE". */
UATTN_API const char *uattn_status_name(uattn_status status);
/* "MAJOR.MINOR.PATCH" of the library actually linked. */
UATTN_API const char *uattn_version(void);

/* Optional allocator for every buffer a plan owns. Both or neither may be given. alloc returns memory
 * aligned to at least 64 bytes or NULL. */
typedef struct uattn_allocator {
  void *(*alloc)(void *user, size_t bytes);
  void (*free)(void *user, void *ptr);
  void *user;
} uattn_allocator;

/* ------------------------------------------------------------------------------------------------ */
/* Bucketing: padding a step to static shapes (the seed's buckets, for engines that need them)      */
/* ------------------------------------------------------------------------------------------------ */

/* A batch shape. query_len: query tokens; shared_blocks: distinct shared context blocks; unique_blocks:
 * the seed's unique dimension (largest unique block id + 1); logits: sampled positions. */
typedef struct uattn_bucket {
  int32_t query_len;
  int32_t shared_blocks;
  int32_t unique_blocks;
  int32_t logits;
} uattn_bucket;

/* A custom policy: given the batch's exact shape and whether it holds prompts (needs the causal part),
 * write the padded shape (each dimension >= the batch's) to *out. Return UATTN_OK or an error status. */
typedef uattn_status (*uattn_bucket_fn)(void *user, bool contains_prompts, const uattn_bucket *exact,
                                        uattn_bucket *out);
/* Data-parallel padding added to each padded dimension (the seed's get_dp_padding_fn); >= 0. */
typedef int32_t (*uattn_dp_padding_fn)(void *user, int32_t padded_size);

typedef enum uattn_bucketing_mode {
  UATTN_BUCKETING_NONE = 0,   /* padded shape = exact shape */
  UATTN_BUCKETING_SEED = 1,   /* the seed's exponential ranges and filters */
  UATTN_BUCKETING_CUSTOM = 2, /* call uattn_bucketing.fn */
} uattn_bucketing_mode;

typedef struct uattn_bucketing {
  uattn_bucketing_mode mode;
  uattn_bucket_fn fn; /* CUSTOM only */
  void *fn_user;
  uattn_dp_padding_fn dp_padding; /* optional, any mode */
  void *dp_padding_user;
} uattn_bucketing;

/* A range built the seed's way from (min, max, round_up): 0 is included and min becomes 1 when min is 0;
 * ten points min*(max/min)^(i/9), each rounded up to round_up (the last one is max), deduplicated, sorted.
 * Writes up to cap values to out and their count to *count. */
UATTN_API uattn_status uattn_bucket_range(int32_t min, int32_t max, int32_t round_up, int32_t *out,
                                          int32_t cap, int32_t *count);

/* ------------------------------------------------------------------------------------------------ */
/* The unified-batch planner (the seed's create_unified_batch)                                      */
/* ------------------------------------------------------------------------------------------------ */

typedef struct uattn_plan uattn_plan;

typedef struct uattn_plan_config {
  int32_t block_size;             /* tokens per KV block, > 0 */
  int32_t num_blocks;             /* blocks in the KV cache; block ids are in [0, num_blocks) */
  int32_t max_num_seqs;           /* requests per step */
  int32_t max_num_batched_tokens; /* query tokens per step */
  int32_t max_model_len;          /* positions per request */
  int32_t chunk_size;             /* shared blocks per chunk of chunked shared attention; 0 = whole */
  uattn_bucketing bucketing;
  /* Materializing the seed-format shared bias above this many bytes is refused (UATTN_ERR_TOO_LARGE).
   * 0 means the default, 256 MiB. */
  size_t shared_bias_byte_limit;
  const uattn_allocator *allocator; /* NULL: malloc-based */
} uattn_plan_config;

/* A config with the given cache geometry and limits and defaults for the rest (no bucketing). */
UATTN_API uattn_plan_config uattn_plan_config_default(int32_t block_size, int32_t num_blocks,
                                                      int32_t max_num_seqs, int32_t max_num_batched_tokens,
                                                      int32_t max_model_len);

/* One step's scheduler state. Request r owns block_table[r * block_table_stride + i], i < stride. */
typedef struct uattn_step {
  int32_t num_reqs;
  const int32_t *num_computed;  /* [num_reqs] tokens already in the cache */
  const int32_t *num_scheduled; /* [num_reqs] new tokens this step (replaced for spec-decode requests) */
  const int32_t *num_prompt;    /* [num_reqs] prompt length */
  const int32_t *block_table;   /* [num_reqs, block_table_stride] */
  int32_t block_table_stride;
  /* Optional: every request's token ids by position, [num_reqs, token_ids_stride]; this step's ids are
   * gathered from it. */
  const int32_t *token_ids;
  int32_t token_ids_stride;
  /* Optional spec-decode drafts, CSR: request r's drafts are draft_tokens[draft_offsets[r] ..
   * draft_offsets[r+1]). A request with at least one entry is a spec-decode request and its num_scheduled
   * becomes (entries != -1) + 1: -1 entries are placeholders and do not count (as in the seed). */
  const int32_t *draft_tokens;
  const int32_t *draft_offsets; /* [num_reqs + 1] or NULL */
  /* Async scheduling (the seed's rule): when exactly one request samples nothing (a prompt that is still
   * partial), its last token is sampled anyway and the request is reported in invalid_req_indices. */
  bool async_scheduling;
} uattn_step;

UATTN_API uattn_status uattn_plan_create(const uattn_plan_config *config, uattn_plan **out);
UATTN_API void uattn_plan_destroy(uattn_plan *plan);

/* Plans one step. The plan keeps its buffers between steps: once it has seen its largest batch, this call
 * allocates nothing. On an error the plan still holds the previous step. */
UATTN_API uattn_status uattn_plan_step(uattn_plan *plan, const uattn_step *step);

/* A shared context block and the run of query tokens of one request that read it. A token t of the run
 * sees usage = clamp(token_context_lens[t] - block_start, 0, block_size) keys of the block: per token, so
 * the tokens of a multi-token decode stay causal. */
typedef struct uattn_shared_span {
  int32_t shared_index; /* index into shared_blocks */
  int32_t req;
  int32_t block_start;  /* position of the block's first key in the request */
  int32_t token_begin;  /* first query row of the run */
  int32_t token_end;    /* one past the last query row */
} uattn_shared_span;

/* A context block read by exactly one query token. */
typedef struct uattn_unique_block {
  int32_t block;       /* block id */
  int32_t token;       /* the query row that reads it */
  int32_t block_start; /* position of the block's first key in the request */
  int32_t usage;       /* keys of the block the token sees, 1..block_size */
} uattn_unique_block;

/* Everything planned for the step. Pointers stay valid until the plan's next step or destruction. Arrays
 * of length num_tokens are indexed by query row. */
typedef struct uattn_plan_info {
  int32_t block_size;
  int32_t num_reqs;
  int32_t num_tokens;
  bool contains_prompts;

  /* per request */
  const int32_t *num_scheduled;   /* [num_reqs] after the spec-decode rule */
  const int32_t *query_start_loc; /* [num_reqs + 1] */
  const int32_t *seq_lens;        /* [num_reqs] num_computed + num_scheduled */
  const bool *is_prompt;          /* [num_reqs] seq_len <= num_prompt */
  const int32_t *num_output_tokens; /* [num_reqs] sampled positions of each request */

  /* per query row */
  const int32_t *token_groups;    /* request of the row */
  const int32_t *token_offsets;   /* row - query_start_loc[request] */
  const int32_t *token_positions; /* absolute position */
  const int32_t *token_ids;       /* NULL when the step gave none */
  const int64_t *slot_mapping;    /* cache slot this row's K/V is written to */
  /* keys of the row read from the cache: min(position + 1, cached) where cached is num_computed for a
   * prompt (its new keys come from the causal part) and seq_len otherwise (its keys are in the cache) */
  const int32_t *token_context_lens;
  /* The causal part: a row of a prompt request reads this step's keys of its request up to and including
   * its own row; a row of any other request reads none (all its keys are in the cache). */

  /* sampling */
  int32_t num_logits;
  const int32_t *logits_indices;      /* [num_logits] query rows to sample */
  const int32_t *logits_groups;       /* [num_logits] their requests */
  const int32_t *new_token_positions; /* [num_logits] */
  int32_t num_invalid_reqs;
  const int32_t *invalid_req_indices; /* [num_invalid_reqs] */

  /* context split */
  int32_t num_shared_blocks;
  const int32_t *shared_blocks; /* [num_shared_blocks] sorted block ids read by more than one token */
  int32_t num_shared_spans;
  const uattn_shared_span *shared_spans; /* sorted by (shared_index, req) */
  int32_t num_unique_blocks;
  const uattn_unique_block *unique_blocks; /* sorted by (token, block_start) */

  /* bucketing */
  uattn_bucket exact;  /* the batch's own shape */
  uattn_bucket padded; /* the shape after bucketing and data-parallel padding */
  bool bucket_fallback; /* no bucket fitted: padded to the exact shape */
} uattn_plan_info;

UATTN_API uattn_status uattn_plan_get_info(const uattn_plan *plan, uattn_plan_info *info);

/* Counters over the plan's life. */
typedef struct uattn_plan_stats {
  int64_t steps;
  int64_t bucket_fallbacks; /* steps that fit no bucket */
  int64_t allocations;      /* buffer (re)allocations, creation included */
  size_t bytes_reserved;    /* bytes the plan holds */
} uattn_plan_stats;

UATTN_API uattn_status uattn_plan_get_stats(const uattn_plan *plan, uattn_plan_stats *stats);

/* The seed's bucket list for this plan's config (UATTN_BUCKETING_SEED), sorted. Writes up to cap entries
 * and the total to *count; causal[i] says whether bucket i is for batches with prompts. */
UATTN_API uattn_status uattn_plan_buckets(const uattn_plan *plan, uattn_bucket *buckets, bool *causal,
                                          int32_t cap, int32_t *count);

/* Seed-format tensors, padded to the plan's padded bucket with the seed's pad values (-1 for ids and
 * block mappings, -inf for biases; 0.0 means visible). Built on request by uattn_plan_materialize. */
typedef enum uattn_seed_tensor {
  UATTN_SEED_CAUSAL_BIAS = 1 << 0,  /* float [tq, tq] */
  UATTN_SEED_SHARED_BIAS = 1 << 1,  /* float [tq, ts, bs] */
  UATTN_SEED_SHARED_USAGE = 1 << 2, /* int32 [tq, ts], PR 784's dense usage table, 0 = masked */
  UATTN_SEED_UNIQUE_BIAS = 1 << 3,  /* float [tu, bs] and int32 unique block mapping [tu] */
  UATTN_SEED_PADDED_IDS = 1 << 4,   /* int64 slot mapping [tq], int32 token ids/positions [tq], logits [tl] */
} uattn_seed_tensor;

typedef struct uattn_seed_tensors {
  uattn_bucket shape;          /* the padded bucket: tq, ts, tu, tl */
  const float *causal_bias;    /* [tq, tq] */
  const float *shared_bias;    /* [tq, ts, bs] */
  const int32_t *shared_usage; /* [tq, ts] */
  const float *unique_bias;    /* [tu, bs] */
  const int32_t *unique_block_mapping; /* [tu] the query row reading block id i, -1 if none */
  const int64_t *slot_mapping;         /* [tq] */
  const int32_t *token_ids;            /* [tq] (-1 padding; all -1 when the step gave no ids) */
  const int32_t *token_positions;      /* [tq] */
  const int32_t *logits_indices;       /* [tl] */
} uattn_seed_tensors;

/* Builds the requested tensors (an OR of uattn_seed_tensor) for the current step. Semantics follow uattn,
 * not the seed's two defects: decode rows get nothing from the causal bias (their keys are in the cache)
 * and usages are per token. A shared bias above the plan's byte limit is refused. */
UATTN_API uattn_status uattn_plan_materialize(uattn_plan *plan, unsigned what, uattn_seed_tensors *out);

/* ------------------------------------------------------------------------------------------------ */
/* vLLM attention-backend batch utilities                                                           */
/* ------------------------------------------------------------------------------------------------ */
/* BEGIN batch utilities */
/* END batch utilities */

#ifdef __cplusplus
}
#endif

#endif /* UATTN_H */
