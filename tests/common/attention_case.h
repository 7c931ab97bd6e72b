/* Building attention test cases: a batch of a given kind, random tensors, a plan, and the comparison of
 * uattn_forward with the dense double-precision oracle (support/dense_oracle.h). Shared by the attention
 * suites. */
#ifndef UATTN_TEST_ATTENTION_CASE_H
#define UATTN_TEST_ATTENTION_CASE_H

#include "common/random_batch.h"
#include "support/dense_oracle.h"
#include "common/support.h"

typedef enum batch_kind {
  BATCH_DECODE,         /* one token per request over a cached context */
  BATCH_PREFILL,        /* whole prompts, nothing cached */
  BATCH_PREFIX_PREFILL, /* prompts after a prefix-cache hit */
  BATCH_CHUNKED_LONG,   /* one prompt chunk over a long cached context */
  BATCH_MIXED,          /* prompts, chunks and decodes together */
  BATCH_SPEC_DECODE,    /* verification of 1..7 drafts, with -1 placeholders */
  BATCH_SHARED_PREFIX,  /* many requests on one cached prefix, prompts and decodes */
  BATCH_EMPTY,          /* no request */
} batch_kind;

typedef struct attention_case {
  const char *name;
  batch_kind kind;
  int32_t block_size, num_q_heads, num_kv_heads, head_dim;
  uattn_dtype dtype, cache_dtype;
  uattn_kv_layout layout;
  uattn_attention_type attn_type;
  float soft_cap;
  int32_t sliding_window;
  bool sinks, alibi;
  int32_t chunk_size, causal_width;
  uint64_t seed;
  int32_t split_min_keys, split_keys; /* plan tunables; 0 = defaults */
  float k_scale, v_scale;             /* the layer's, for fp8 caches; 0 = the default, 1 */
  bool blocks_in_order;               /* block ids in the order they are handed out (a request's blocks
                                       * follow each other in the cache), not shuffled */
  int32_t head_dim_v;                 /* the layer's (multi-head latent attention); 0 = head_dim */
  bool kv_latent;                     /* the layer's: values are the keys' first head_dim_v dims, no v and no
                                       * value cache; an fp8 v_scale left 0 takes k_scale */
} attention_case;

/* Everything one case builds; kept so a test can run uattn_forward again with other settings. */
typedef struct attention_run {
  attention_case c;
  rb_batch batch;
  uattn_plan *plan;
  uattn_plan_info info;
  uattn_layer layer;
  int32_t num_blocks;
  int32_t head_dim_v; /* the value dim: the case's head_dim_v, or head_dim */
  /* cache_bytes: the key cache's; value_cache_bytes and v_bytes 0 for a kv_latent layer (no value cache, no v) */
  size_t cache_bytes, value_cache_bytes, q_bytes, kv_bytes, v_bytes, out_bytes;
  void *q, *k, *v, *key_cache0, *value_cache0; /* caches before the step; v and value_cache0 NULL when latent */
  float sinks[64], slopes[64];
  int32_t encoder_lens[RB_MAX_REQS], cross_table[RB_MAX_REQS * 64];
  uattn_cross cross;
} attention_run;

/* Builds the batch, the plan and random inputs. */
void attention_run_build(attention_run *run, const attention_case *c);
void attention_run_free(attention_run *run);
/* Fills every cache entry no query of the step can see (slots past a request's end, before its window,
 * blocks no table holds) with NaN keys and NaN / -inf values (a kv_latent layer: its keys, whose first dims
 * are its values, NaN and -inf): only what the step may read can matter, and a kernel that multiplies a
 * masked value by its zero weight (0 x NaN) or scores a masked key shows. */
void attention_run_poison_unseen(attention_run *run);
/* Tensors over fresh copies of the caches and a fresh output (caller frees with attention_tensors_free). */
uattn_tensors attention_tensors(const attention_run *run);
void attention_tensors_free(uattn_tensors *t);
/* Makes t's output fp32 (uattn_tensors.out_f32): a fresh zeroed [T, Hq, Dv] float buffer in place of out. */
void attention_tensors_out_f32(const attention_run *run, uattn_tensors *t);

/* Runs uattn_forward on fresh tensors on rt (NULL: the calling thread); the caller frees the result. */
uattn_tensors attention_run_forward(const attention_run *run, uattn_runtime *rt);

/* Runs uattn_forward and the oracle and checks outputs, lse and both caches, with the tolerance of the
 * case's dtypes. Fails the calling test on any mismatch. */
void attention_run_check(attention_run *run);
/* max |out - oracle| of one forward of the run on the calling thread, and in *scale max |oracle|: for a
 * bound of the caller's own (the avx512bf16 level's P in bf16 needs more than attention_tolerance). */
double attention_run_error(attention_run *run, double *scale);
/* The run's step as the dense oracle takes it (effective: the requests' token counts, drafts counted). */
oracle_step attention_oracle_step(const attention_run *run, int32_t effective[RB_MAX_REQS]);

/* Max |x - ref| / max(|ref|) style tolerance for a dtype pair (see attention_case.c for why). */
double attention_tolerance(uattn_dtype dtype, uattn_dtype cache_dtype);

/* The precision contract of a kernel set against the dense fp64 oracle, the one statement of it that every test
 * running more than one set uses: a layer's output may be off by rel * max |out| + abs * max |v|, where max |v|
 * bounds the values the step reads (attention_case.c says why each term is what it is). */
typedef struct precision_contract {
  double rel, abs;
} precision_contract;
precision_contract attention_contract(const char *kernel_set, uattn_dtype dtype, uattn_dtype cache_dtype,
                                      bool probs_fp32);
/* The contract of whatever set uattn_forward runs the run's layer on now (uattn_describe_kernels). */
precision_contract attention_run_contract(const attention_run *run);
/* The bound the contract gives the run's output, whose largest magnitude is max_out. */
double attention_run_bound(const attention_run *run, double max_out);

/* Holds a forward of the run with out_f32 (wide) to one without (narrow): each dtype output (bf16 or f16) is the
 * fp32 one rounded once, the lse and the caches the same. Returns how many fp32 outputs are not dtype values (0:
 * the fp32 output was rounded already). */
size_t attention_check_out_f32(const attention_run *run, const uattn_tensors *narrow, const uattn_tensors *wide);

/* Forces level `isa` (UATTN_ISA) for a test of one level of the ladder and says what it runs (label first). Returns
 * false where that is not the level itself: a level this CPU lacks, without its twin, runs a set below it, which
 * that set's own level's test covers. */
bool attention_force_level(const char *isa, const char *label);

/* UATTN_ISA back to what it was before a test forced levels (forced: its value then, NULL for unset). */
void attention_restore_isa(const char *forced);

#endif
