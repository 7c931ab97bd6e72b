/* uattn_forward (self and cross attention), its kernels' description and report, and the merges of partial
 * states, under bad input through the suite's table runner (misuse.h). */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "common/attention_case.h"
#include "misuse.h"

/* ---- attention ---------------------------------------------------------------------------------------- */

/* fp32 inputs over bf16 caches: the cache update converts, so each cache store is a 2-byte one (defect 4). */
static const attention_case forward_case = {
    "misuse", BATCH_MIXED, 16, 4, 2, 32, UATTN_F32, UATTN_BF16, UATTN_LAYOUT_NHD, UATTN_ATTENTION_DECODER,
    0,        0,           0,  0, 0, 0,  19};
static attention_run forward_run;
static float forward_sinks[4], forward_slopes[4];
#define SLACK 64 /* room past each buffer for a pointer moved one byte on */

typedef struct forward_args {
  const uattn_plan *plan;
  uattn_layer layer;
  uattn_tensors tensors;
  uattn_runtime *rt;
  const uattn_layer *layer_ptr;
  const uattn_tensors *tensors_ptr;
  uattn_cross cross;
  void *owned[4]; /* the heap buffers, as allocated (a row may move the pointers) */
  int32_t encoder_lens[RB_MAX_REQS + 1], cross_table[RB_MAX_REQS * 4 + 1];
  struct {
    char none;
  } w;
} forward_args;

static void *heap_copy(const void *src, size_t bytes) {
  void *p = calloc(bytes + SLACK, 1);
  memcpy(p, src, bytes);
  return p;
}

static void forward_init(void *p) {
  forward_args *a = p;
  const attention_run *run = &forward_run;
  a->plan = run->plan;
  a->layer = run->layer;
  a->layer.sinks = forward_sinks;
  a->layer.alibi_slopes = forward_slopes;
  a->rt = rt;
  a->tensors = (uattn_tensors){.q = run->q,
                               .k = run->k,
                               .v = run->v,
                               .key_cache = heap_copy(run->key_cache0, run->cache_bytes),
                               .value_cache = heap_copy(run->value_cache0, run->cache_bytes),
                               .num_blocks = run->num_blocks,
                               .block_size = run->c.block_size,
                               .out = calloc(run->out_bytes + SLACK, 1),
                               .lse = calloc((size_t)run->info.num_tokens * run->c.num_q_heads + SLACK, sizeof(float)),
                               .cross = &a->cross};
  a->cross = (uattn_cross){a->encoder_lens, a->cross_table, 4};
  a->owned[0] = a->tensors.key_cache, a->owned[1] = a->tensors.value_cache;
  a->owned[2] = a->tensors.out, a->owned[3] = a->tensors.lse;
  a->layer_ptr = &a->layer;
  a->tensors_ptr = &a->tensors;
}
static uattn_status forward_call(void *p) {
  forward_args *a = p;
  return uattn_forward(a->plan, a->layer_ptr, a->tensors_ptr, a->rt);
}
static int forward_more(void *p, region *r) {
  forward_args *a = p;
  const attention_run *run = &forward_run;
  r[0] = (region){a->owned[0], run->cache_bytes + SLACK, true};
  r[1] = (region){a->owned[1], run->cache_bytes + SLACK, true};
  r[2] = (region){a->owned[2], run->out_bytes + SLACK, false};
  r[3] = (region){a->owned[3], ((size_t)run->info.num_tokens * run->c.num_q_heads + SLACK) * sizeof(float), false};
  return 4;
}
static void forward_fini(void *p, uattn_status st) {
  (void)st;
  forward_args *a = p;
  for (int i = 0; i < 4; i++) free(a->owned[i]);
}

/* (after the suite's own setup, before its teardown) */
static void forward_setup(void) { attention_run_build(&forward_run, &forward_case); }
static void forward_teardown(void) { attention_run_free(&forward_run); }

static const api_fn forward_fn = API_FN(forward, forward_args, .more = forward_more, .fini = forward_fini);

/* A defect once found: a bf16 key cache one byte off its 2-byte alignment reached a misaligned store in
 * the cache update (kernels/convert.c) instead of a status. */
Test(api_misuse, forward_refuses_a_misaligned_bf16_key_cache, .init = forward_setup, .fini = forward_teardown) {
  static const misuse cases[] = {MISALIGNED(forward_args, tensors.key_cache, "tensors.key_cache")};
  RUN(forward_fn, cases);
}

Test(api_misuse, uattn_forward, .init = forward_setup, .fini = forward_teardown) {
  typedef forward_args T;
  /* a cache of INT32_MAX blocks of INT32_MAX heads: its byte size overflows size_t */
  static const misuse overflow = {"cache bytes overflow size_t",
                                  {{offsetof(T, tensors.num_blocks), EDIT_I32, INT32_MAX},
                                   {offsetof(T, layer.num_kv_heads), EDIT_I32, INT32_MAX},
                                   {offsetof(T, layer.num_q_heads), EDIT_I32, INT32_MAX}},
                                  UATTN_ERR_OVERFLOW,
                                  "overflow"};
  /* TILED stores dims in pairs (head_dim 31 fits the buffers made for 32: the refusal is the layout's) */
  static const misuse tiled_odd_dim = {
      "TILED with an odd head_dim",
      {{offsetof(T, layer.kv_layout), EDIT_I32, UATTN_LAYOUT_TILED}, {offsetof(T, layer.head_dim), EDIT_I32, 31}},
      UATTN_ERR_INVALID_ARGUMENT,
      "head_dim"};
  static const misuse cases[] = {
      NULL_ARG(T, plan, "plan"),
      NULL_ARG(T, layer_ptr, "layer"),
      NULL_ARG(T, tensors_ptr, "tensors"),
      POINTER_ARG(T, tensors.q, "tensors.q"),
      POINTER_ARG(T, tensors.k, "tensors.k"),
      POINTER_ARG(T, tensors.v, "tensors.v"),
      POINTER_ARG(T, tensors.key_cache, "tensors.key_cache"),
      POINTER_ARG(T, tensors.value_cache, "tensors.value_cache"),
      POINTER_ARG(T, tensors.out, "tensors.out"),
      MISALIGNED(T, tensors.lse, "tensors.lse"),
      MISALIGNED(T, layer.sinks, "layer.sinks"),
      MISALIGNED(T, layer.alibi_slopes, "layer.alibi_slopes"),
      COUNT(T, tensors.num_blocks, REFUSED, UATTN_OK, "num_blocks"),
      COUNT(T, tensors.block_size, REFUSED, REFUSED, "block_size"),
      COUNT(T, layer.num_q_heads, REFUSED, REFUSED, "num_q_heads"),
      COUNT(T, layer.num_kv_heads, REFUSED, REFUSED, "num_kv_heads"),
      COUNT(T, layer.head_dim, REFUSED, REFUSED, "head_dim"),
      SET(T, layer.sliding_window, -1, REFUSED, "sliding_window"),
      SET(T, layer.causal_width, -1, REFUSED, "causal_width"),
      SET(T, layer.chunk_size, -1, REFUSED, "chunk_size"),
      ENUM(T, layer.dtype, "dtype"),
      ENUM(T, layer.cache_dtype, "cache_dtype"),
      ENUM(T, layer.kv_layout, "kv_layout"),
      SET(T, layer.kv_layout, 3, REFUSED, "kv_layout"), /* one past the last layout */
      SET(T, layer.kv_layout, UATTN_LAYOUT_TILED, UATTN_OK, "kv_layout"),
      tiled_odd_dim,
      ENUM(T, layer.attn_type, "attn_type"),
      overflow,
  };
  RUN(forward_fn, cases);
}

/* Cross attention's own arrays (the layer made an encoder-decoder one, every request with 4 encoder keys). */
static void cross_forward_init(void *p) {
  forward_args *a = p;
  forward_init(a);
  a->layer.attn_type = UATTN_ATTENTION_ENCODER_DECODER;
  a->layer.alibi_slopes = NULL;
  for (int i = 0; i < RB_MAX_REQS; i++) a->encoder_lens[i] = 4;
}
#define cross_forward_call forward_call

Test(api_misuse, uattn_forward_cross, .init = forward_setup, .fini = forward_teardown) {
  typedef forward_args T;
  static const api_fn fn = API_FN(cross_forward, T, .more = forward_more, .fini = forward_fini);
  static const misuse cases[] = {
      NULL_ARG(T, tensors.cross, "tensors.cross"),
      POINTER_ARG(T, cross.encoder_lens, "encoder_lens"),
      POINTER_ARG(T, cross.block_table, "block_table"),
      LENGTH(T, cross.block_table_stride, REFUSED, "stride"),
  };
  RUN(fn, cases);
}

typedef struct describe_kernels_args {
  uattn_layer layer;
  const uattn_layer *layer_ptr;
  int32_t block_size;
  uattn_kernel_report *out;
  struct {
    uattn_kernel_report out;
  } w;
} describe_kernels_args;
static void describe_kernels_init(void *p) {
  describe_kernels_args *a = p;
  a->layer = uattn_layer_default(4, 2, 32, UATTN_BF16);
  a->layer.sinks = forward_sinks;
  a->layer_ptr = &a->layer;
  a->block_size = 16;
  a->out = &a->w.out;
}
static uattn_status describe_kernels_call(void *p) {
  describe_kernels_args *a = p;
  return uattn_describe_kernels(a->layer_ptr, a->block_size, a->out);
}

Test(api_misuse, uattn_describe_kernels) {
  typedef describe_kernels_args T;
  static const api_fn fn = API_FN(describe_kernels, T);
  static const misuse cases[] = {
      NULL_ARG(T, layer_ptr, "layer"),
      NULL_ARG(T, out, "out"),
      SET(T, block_size, -1, REFUSED, "block_size"),
      SET(T, block_size, 0, REFUSED, "block_size"),
      SET(T, block_size, INT32_MAX, UATTN_OK, "block_size"),
      COUNT(T, layer.head_dim, REFUSED, REFUSED, "head_dim"),
      COUNT(T, layer.num_q_heads, REFUSED, REFUSED, "num_q_heads"),
      ENUM(T, layer.cache_dtype, "cache_dtype"),
      ENUM(T, layer.kv_layout, "kv_layout"),
      SET(T, layer.kv_layout, 3, REFUSED, "kv_layout"),
      SET(T, layer.kv_layout, UATTN_LAYOUT_TILED, UATTN_OK, "kv_layout"),
      MISALIGNED(T, layer.sinks, "layer.sinks"), /* judged as the forward judges the layer */
  };
  RUN(fn, cases);
}

typedef struct last_forward_report_args {
  uattn_kernel_report *out;
  struct {
    uattn_kernel_report out;
  } w;
} last_forward_report_args;
static void last_forward_report_init(void *p) {
  last_forward_report_args *a = p;
  a->out = &a->w.out;
}
static uattn_status last_forward_report_call(void *p) {
  return uattn_last_forward_report(((last_forward_report_args *)p)->out);
}

Test(api_misuse, uattn_last_forward_report) {
  typedef last_forward_report_args T;
  static const api_fn fn = API_FN(last_forward_report, T);
  /* a thread that ran no forward has no report */
  static const misuse cases[] = {NULL_ARG(T, out, "out"), {"no forward yet", {{0}}, REFUSED, "no uattn_forward"}};
  RUN(fn, cases);
}

/* ---- merges ------------------------------------------------------------------------------------------- */

/* two parts of 2 rows, 2 heads, head_dim 4 */
#define MERGE_VALUES (2 * 2 * 4)
typedef struct merge_args {
  int32_t num_parts, rows, heads, head_dim;
  const float *outs_arr[2], *lses_arr[2], *sums_arr[2];
  const float *const *outs, *const *lses, *const *sums;
  float part_out[2][MERGE_VALUES + 1], part_lse[2][2 * 2 + 1], part_sum[2][2 * 2 + 1];
  float *out, *lse;
  struct {
    float out[MERGE_VALUES + 1], lse[2 * 2 + 1];
  } w;
} merge_args;
static void merge_init(void *p) {
  merge_args *a = p;
  *a = (merge_args){2, 2, 2, 4};
  for (int i = 0; i < 2; i++) {
    for (int x = 0; x < MERGE_VALUES; x++) a->part_out[i][x] = (float)(x + i);
    for (int x = 0; x < 4; x++) a->part_lse[i][x] = (float)i, a->part_sum[i][x] = 1.0f;
    a->outs_arr[i] = a->part_out[i], a->lses_arr[i] = a->part_lse[i], a->sums_arr[i] = a->part_sum[i];
  }
  a->outs = a->outs_arr, a->lses = a->lses_arr, a->sums = a->sums_arr;
  a->out = a->w.out, a->lse = a->w.lse;
}
#define merge_states_init merge_init
#define merge_partials_init merge_init
static uattn_status merge_states_call(void *p) {
  merge_args *a = p;
  return uattn_merge_states(a->num_parts, a->outs, a->lses, a->rows, a->heads, a->head_dim, a->out, a->lse);
}
/* the partials' maxes are the states' lses */
static uattn_status merge_partials_call(void *p) {
  merge_args *a = p;
  return uattn_merge_partials(a->num_parts, a->outs, a->lses, a->sums, a->rows, a->heads, a->head_dim, a->out);
}

/* rows * heads * head_dim floats overflow size_t */
#define MERGE_OVERFLOW                                                                                                 \
  {                                                                                                                    \
    "rows * heads * head_dim overflows size_t",                                                                        \
        {{offsetof(merge_args, rows), EDIT_I32, INT32_MAX},                                                            \
         {offsetof(merge_args, heads), EDIT_I32, INT32_MAX},                                                           \
         {offsetof(merge_args, head_dim), EDIT_I32, 4096}},                                                            \
        UATTN_ERR_OVERFLOW, "overflow"                                                                                 \
  }

Test(api_misuse, uattn_merge_states_and_partials) {
  typedef merge_args T;
  static const api_fn states = API_FN(merge_states, T), partials = API_FN(merge_partials, T);
  static const misuse common[] = {
      POINTER_ARG(T, outs, "outs"),
      POINTER_ARG(T, out, "out"),
      NULL_ARG(T, outs_arr[1], "1"),
      NULL_ARG(T, lses_arr[1], "1"),
      MISALIGNED(T, outs_arr[1], "outs[1]"),
      MISALIGNED(T, lses_arr[0], "[0]"),
      LENGTH(T, num_parts, REFUSED, "num_parts"),
      LENGTH(T, rows, UATTN_OK, "rows"),
      LENGTH(T, heads, REFUSED, "heads"),
      COUNT(T, head_dim, REFUSED, REFUSED, "head_dim"),
      MERGE_OVERFLOW,
  };
  static const misuse states_only[] = {POINTER_ARG(T, lses, "lses"), MISALIGNED(T, lse, "lse")};
  static const misuse partials_only[] = {NULL_ARG(T, lses, "maxes"), NULL_ARG(T, sums, "sums"),
                                         NULL_ARG(T, sums_arr[1], "1"), MISALIGNED(T, sums_arr[1], "sums[1]"),
                                         SET(T, num_parts, INT32_MAX, REFUSED, "num_parts")};
  RUN(states, common);
  RUN(states, states_only);
  RUN(partials, common);
  RUN(partials, partials_only);
}
