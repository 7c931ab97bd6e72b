/* What the files of uattn_forward share: the view of the caches, a worker's workspace, the context of one
 * tile, and the calls from one file to the next. Each file needs only those before it: validate.c checks a
 * call's input; cache.c writes this step's keys and values and knows the caches' layouts; workspace.c sizes
 * and carves a worker's scratch; parts.c computes the parts of a tile's attention through the kernels;
 * units.c hands the step out to the workers in work units and merges their results; forward.c is the public
 * call. Only the forward's files include this header. */
#ifndef UATTN_FORWARD_INTERNAL_H
#define UATTN_FORWARD_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "attention/kernel_choice.h"
#include "common/internal.h"
#include "kernels.h"
#include "plan/schedule.h"

#define UATTN_MAX_HEAD_DIM 4096 /* uattn_validate_layer's bound, which sizes the per-row buffers on the stack */

/* ---- validate.c: a call's input --------------------------------------------------------------------- */

uattn_status uattn_validate_layer(const uattn_layer *L);
uattn_status uattn_validate_tensors(const uattn_plan_info *in, const uattn_plan_config *pc, const uattn_layer *L,
                                    const uattn_tensors *t);

/* The dtype out is written in: the layer's, or fp32 for partial results (uattn_tensors.out_f32). */
static inline uattn_dtype out_dtype(const uattn_layer *L, const uattn_tensors *t) {
  return t->out_f32 ? UATTN_F32 : L->dtype;
}

/* ---- cache.c: the caches' layouts, this step's keys and values into them ------------------------------ */

/* The caches. A kv_latent layer's value cache is its key cache (v == k, v_dim == head_dim): its values are the
 * first dims of the key rows. */
typedef struct cache_view {
  char *k, *v;
  uattn_dtype dtype;
  uattn_kv_layout layout;
  int32_t block_size, kv_heads, head_dim;
  int32_t v_dim; /* elements of a value cache row */
} cache_view;

/* NHD and HND: the element offset of (slot, kv head)'s vector of `dim` elements (c->head_dim in the key cache,
 * c->v_dim in the value cache). */
static inline size_t cache_offset_dim(const cache_view *c, int64_t slot, int32_t head, int32_t dim) {
  if (c->layout == UATTN_LAYOUT_NHD) return ((size_t)slot * c->kv_heads + head) * dim;
  const int64_t block = slot / c->block_size, off = slot % c->block_size;
  return (((size_t)block * c->kv_heads + head) * c->block_size + off) * dim;
}

/* The same in the key cache, and in the value cache where its rows are as long (not padded: head_dims). */
static inline size_t cache_offset(const cache_view *c, int64_t slot, int32_t head) {
  return cache_offset_dim(c, slot, head, c->head_dim);
}

/* TILED (uattn.h): the element where a head's share of a tile of a block starts, in a cache of rows of `dim`
 * elements; within it, key i's dim d among the keys (dim pairs of 16 keys) and among the values (key pairs of
 * D dims). */
static inline size_t tiled_share_dim(const cache_view *c, int64_t block, int32_t tile, int32_t head, int32_t dim) {
  const size_t tiles = (size_t)(c->block_size / UATTN_TILED_KEYS);
  return (((size_t)block * tiles + (size_t)tile) * c->kv_heads + head) * UATTN_TILED_KEYS * (size_t)dim;
}
static inline size_t tiled_share(const cache_view *c, int64_t block, int32_t tile, int32_t head) {
  return tiled_share_dim(c, block, tile, head, c->head_dim);
}
static inline size_t tiled_key(int32_t i, int32_t d) {
  return ((size_t)(d / 2) * UATTN_TILED_KEYS + (size_t)i) * 2 + d % 2;
}
static inline size_t tiled_value(int32_t i, int32_t d, int32_t D) {
  return ((size_t)(i / 2) * D + (size_t)d) * 2 + i % 2;
}

void uattn_stage_block(const cache_view *c, int32_t block, int32_t first, int32_t count, int32_t h0, int32_t heads,
                       int32_t width, char *k_out, char *v_out);
bool uattn_reads_step_keys(const uattn_plan_info *in, const uattn_layer *L, int32_t r);
size_t uattn_step_kv_bytes(const uattn_plan_info *in, const uattn_layer *L);
void uattn_write_cache(const uattn_plan_info *in, const uattn_layer *L, const uattn_tensors *t, const cache_view *c,
                       char *step_kv);

/* fp8 caches (uattn.h: UATTN_FP8_E4M3, UATTN_FP8_E5M2) hold fp8(k / k_scale) and fp8(v / v_scale), and the
 * attention reads fp8 * k_scale and fp8 * v_scale, by folding the scales rather than applying them per key
 * (the kernels, whose loads widen the raw fp8 values exactly, stay as they are):
 *  - keys: every part (causal, shared, chunked shared, unique, split-K ranges, cross attention's encoder
 *    keys) gets the score scale scale * k_scale instead of scale, on its queries or, for the sets that take
 *    unscaled queries, on its scores, so its scores are scale * <q, fp8 * k_scale> up to one rounding;
 *  - values: sum_j p_j (v_j * v_scale) = v_scale * sum_j p_j v_j, so the unnormalized output of each part is
 *    multiplied by v_scale where a row's parts are merged into out (units.c: fold_v_scale), which is linear
 *    in them; m, l and so lse are untouched.
 * The score scale of every part: on other caches the layer's scale (bits unchanged). */
static inline float cache_score_scale(const uattn_layer *L) {
  return uattn_dtype_is_fp8(L->cache_dtype) ? L->scale * L->k_scale : L->scale;
}

/* ---- workspace.c: a worker's scratch ------------------------------------------------------------------ */

/* One worker's scratch: a query tile, key/value panels and the partial states of the tile's rows (D: the kernels'
 * head dim, head_dims.kernel). */
typedef struct workspace {
  const uattn_kernels *kern;
  uattn_kernel_use use;                  /* how the forward uses kern on this layer (kernel_choice.c) */
  int64_t calls[UATTN_NUM_PARTS];        /* kernel calls per part, for uattn_last_forward_report */
  int64_t decode_calls[UATTN_NUM_PARTS]; /* of those, the decode kernel's */
  size_t panel_floats;                   /* of each of keys and values, in the kernel set's layout */
  size_t decode_floats;                  /* the decode kernel's scratch (0: the set's decode kernel does not run) */
  int32_t tile;                          /* query rows per tile (the causal width) */
  int32_t slots;            /* rows of q, states and visible: the tile's, or an all-heads unit's rows of every head */
  int32_t panel;            /* keys per panel: max(block_size, tile) */
  int32_t group;            /* query heads per KV head */
  float *decode_scratch;    /* [decode_floats], first: the kernel wants it 32-byte aligned */
  size_t stage_floats;      /* TILED caches: of stage (0 otherwise) */
  char *stage;              /* [2][rows][D] elements of the cache dtype: keys, then values, staged (cache.c) */
  float *q;                 /* [slots, group, D] the queries as the attend takes them (uattn_kernel_caps.unscaled_q) */
  float *q_decode;          /* the same as the decode kernels take them: q, or where the set's two kernels take
                             * them apart (uattn_kernel_caps.decode_unscaled_q) a copy of its own */
  float *keys, *values;     /* [panel, D] */
  float *scores;            /* [panel] */
  float *state_o;           /* [4 parts][slots, group, D]: causal, shared, unique, chunk scratch */
  float *state_m, *state_l; /* [4 parts][slots, group] */
  int32_t *visible;         /* [slots]: keys of the current panel each row sees */
  /* context parallelism only (cp_floats > 0), else NULL: */
  size_t cp_floats;
  float *gather;       /* [2][panel, D] elements of the layer's dtype: the rank's keys and values of the step */
  int32_t *query_pos;  /* [slots]: the rows' query positions as the kernels get them (units.c: begin_tile) */
  int32_t *piece_from; /* [slots]: the rows' visible counts of a whole block, while it is cut in pieces */
} workspace;

/* The workspace's accumulators of partial states: one per part of the attention (uattn_part) and the scratch
 * of a shared chunk. */
enum { ACC_CAUSAL, ACC_SHARED, ACC_UNIQUE, ACC_CHUNK, NUM_ACCS };

/* Index of (accumulator, slot, head in group) in the state arrays. */
static inline size_t state_index(const workspace *w, int acc, int32_t slot, int32_t head_in_group) {
  return ((size_t)acc * w->slots + slot) * w->group + head_in_group;
}

static inline uattn_state acc_state(const workspace *w, int acc, int32_t slot, int32_t head_in_group, int32_t D) {
  const size_t idx = state_index(w, acc, slot, head_in_group);
  uattn_state s = {w->state_m[idx], w->state_l[idx], w->state_o + idx * D};
  return s;
}

static inline void store_state(const workspace *w, int acc, int32_t slot, int32_t head_in_group, const uattn_state *s) {
  const size_t idx = state_index(w, acc, slot, head_in_group);
  w->state_m[idx] = s->m;
  w->state_l[idx] = s->l;
}

int32_t uattn_all_heads_max_rows(const uattn_kernels *set, const uattn_layer *L);
void uattn_workspace_shape(workspace *w, const uattn_plan_info *in, const uattn_layer *L,
                           const uattn_kernel_choice *choice, bool cp);
size_t uattn_workspace_bytes(const workspace *w, int32_t D);
void uattn_workspace_carve(workspace *w, void *memory, int32_t D);

/* ---- parts.c: the parts of a tile's attention ---------------------------------------------------------- */

/* A tile: rows of one request (or of a prefix run of them) on one KV head, or an all-heads unit's rows on
 * `heads` KV heads; the parts read it and write its partial states in the workspace. */
typedef struct step_ctx {
  const uattn_schedule *sched;
  const uattn_plan_info *in;
  const uattn_layer *L;
  const uattn_tensors *t;
  cache_view cache;
  workspace *w;
  int32_t kv_head, req, row0, rows; /* the tile: rows [row0, row0 + rows) of request req */
  int32_t slot;                     /* the workspace slot of row0 (parts.c: tile_slot) */
  int32_t qs, qe, num_computed;     /* the request's rows and cached keys (the rank's, local) */
  int32_t key_lo, key_hi;           /* context blocks starting in [key_lo, key_hi): all, or one split */
  int32_t heads; /* an all-heads unit's KV heads from kv_head, which its decode calls take together */
  int32_t dim;   /* the kernels' head dim (head_dims.kernel): of the queries, panels, states and staged rows */
  const char *step_k, *step_v; /* this step's keys and values as the causal part reads them (cache.c: step_kv) */
  uattn_dtype step_dtype;      /* theirs: the cache dtype (step_kv), or the layer's (k and v themselves) */
  const uattn_plan_config *cp; /* context parallelism: the plan's config (cp_size > 1), else NULL */
  bool pieces;                 /* ALiBi under context parallelism: kernel calls on runs of keys */
} step_ctx;

void uattn_causal_part(const step_ctx *c);
void uattn_shared_part(const step_ctx *c);
void uattn_shared_part_prefix_run(const step_ctx *c, int32_t first, int32_t end);
void uattn_unique_part(const step_ctx *c);
void uattn_shared_part_all_heads(const step_ctx *c);
void uattn_unique_part_all_heads(const step_ctx *c);
void uattn_cross_part(const step_ctx *c);

/* ---- units.c: the step in work units ----------------------------------------------------------------- */

/* Runs a checked step (L tuned, kernels chosen) on rt's workers, at most max_workers of them: the cache
 * write, the attention and the merge of split requests. Fills report's counters, workspace and workers. */
uattn_status uattn_forward_run(const uattn_schedule *sched, const uattn_layer *L, const uattn_tensors *t,
                               uattn_runtime *rt, const uattn_kernel_choice *choice, int32_t max_workers,
                               uattn_kernel_report *report);

#endif
