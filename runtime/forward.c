/* uattn_forward: the cache update and the attention of one planned step, in portable C.
 *
 * The seed's decomposition (unified.py), computed per (request, KV head, query tile) over only the pairs
 * that are visible, with masks derived from positions and per-row usages rather than bias tensors:
 *  - causal: a prompt's rows against this step's keys of the same request, read from k/v;
 *  - shared: context blocks read by several rows (processed whole, or chunk_size blocks at a time and
 *    merged with an online softmax as in PR 784);
 *  - unique: context blocks read by one row, reduced per row;
 * then the seed's merge with its fmin/feps guards (and per-head sinks in the denominator). The two seed
 * defects are fixed by the plan: a decode row's keys all come from the cache, usages are per row.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "planner.h"
#include "portable.h"

#define UATTN_DEFAULT_CAUSAL_WIDTH 512

uattn_layer uattn_layer_default(int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, uattn_dtype dtype) {
  uattn_layer l;
  memset(&l, 0, sizeof l);
  l.num_q_heads = num_q_heads;
  l.num_kv_heads = num_kv_heads;
  l.head_dim = head_dim;
  l.scale = head_dim > 0 ? 1.0f / sqrtf((float)head_dim) : 1.0f;
  l.dtype = dtype;
  l.cache_dtype = dtype;
  l.kv_layout = UATTN_LAYOUT_NHD;
  l.attn_type = UATTN_ATTENTION_DECODER;
  return l;
}

/* ---- validation ------------------------------------------------------------------------------------ */

static bool valid_dtype(uattn_dtype t) { return t == UATTN_F32 || t == UATTN_BF16 || t == UATTN_F16; }

static uattn_status validate_layer(const uattn_layer *L) {
  if (L->num_q_heads <= 0 || L->num_kv_heads <= 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "layer: num_q_heads (%d) and num_kv_heads (%d) must be > 0",
                      L->num_q_heads, L->num_kv_heads);
  if (L->num_q_heads % L->num_kv_heads != 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                      "layer: num_q_heads (%d) must be a multiple of num_kv_heads (%d) for grouped-query attention",
                      L->num_q_heads, L->num_kv_heads);
  if (L->head_dim <= 0 || L->head_dim > 4096)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "layer: head_dim = %d must be in 1..4096", L->head_dim);
  if (!valid_dtype(L->dtype) || !valid_dtype(L->cache_dtype))
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "layer: dtype %d / cache_dtype %d is not a uattn_dtype",
                      (int)L->dtype, (int)L->cache_dtype);
  if (L->kv_layout != UATTN_LAYOUT_NHD && L->kv_layout != UATTN_LAYOUT_HND)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "layer: kv_layout %d is not a uattn_kv_layout", (int)L->kv_layout);
  if (!isfinite(L->scale))
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "layer: scale must be finite");
  if (!(L->soft_cap >= 0.0f) || !isfinite(L->soft_cap))
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "layer: soft_cap must be >= 0 (0 = none)");
  if (L->sliding_window < 0 || L->causal_width < 0 || L->chunk_size < 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                      "layer: sliding_window (%d), causal_width (%d) and chunk_size (%d) must be >= 0",
                      L->sliding_window, L->causal_width, L->chunk_size);
  switch (L->attn_type) {
    case UATTN_ATTENTION_DECODER: break;
    case UATTN_ATTENTION_ENCODER:
    case UATTN_ATTENTION_ENCODER_ONLY:
    case UATTN_ATTENTION_ENCODER_DECODER:
      if (L->sliding_window > 0)
        return uattn_fail(UATTN_ERR_UNSUPPORTED, "layer: a sliding window applies to decoder attention only");
      if (L->attn_type == UATTN_ATTENTION_ENCODER_DECODER && L->alibi_slopes)
        return uattn_fail(UATTN_ERR_UNSUPPORTED, "layer: ALiBi has no meaning for cross attention");
      break;
    default:
      return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "layer: attn_type %d is not a uattn_attention_type",
                        (int)L->attn_type);
  }
  return UATTN_OK;
}

static uattn_status check_block(int32_t id, int32_t num_blocks, const char *what) {
  if (id < 0 || id >= num_blocks)
    return uattn_fail(UATTN_ERR_OUT_OF_RANGE,
                      "%s: block %d is outside the caches (tensors.num_blocks = %d): the cache is too small for "
                      "the plan",
                      what, id, num_blocks);
  return UATTN_OK;
}

static uattn_status validate_tensors(const uattn_plan_info *in, const uattn_plan_config *pc, const uattn_layer *L,
                                     const uattn_tensors *t) {
  const bool cross = L->attn_type == UATTN_ATTENTION_ENCODER_DECODER;
  if (t->block_size != pc->block_size)
    return uattn_fail(UATTN_ERR_INCONSISTENT,
                      "tensors.block_size = %d, but the plan was built for block size %d: plan with the caches' "
                      "block size",
                      t->block_size, pc->block_size);
  if (t->num_blocks <= 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "tensors.num_blocks = %d must be > 0", t->num_blocks);
  UATTN_CHECK_PTR(t->key_cache, "tensors.key_cache");
  UATTN_CHECK_PTR(t->value_cache, "tensors.value_cache");
  if (in->num_tokens == 0) return UATTN_OK;
  UATTN_CHECK_PTR(t->q, "tensors.q");
  UATTN_CHECK_PTR(t->out, "tensors.out");
  if (!cross) {
    UATTN_CHECK_PTR(t->k, "tensors.k");
    UATTN_CHECK_PTR(t->v, "tensors.v");
  }
  /* every block the step writes or reads must be inside these caches */
  uattn_status st;
  const int64_t slots = (int64_t)t->num_blocks * t->block_size;
  if (!cross)
    for (int32_t i = 0; i < in->num_tokens; i++)
      if (in->slot_mapping[i] >= slots)
        return uattn_fail(UATTN_ERR_OUT_OF_RANGE,
                          "slot %lld of row %d is outside the caches (%d blocks of %d): the cache is too small",
                          (long long)in->slot_mapping[i], i, t->num_blocks, t->block_size);
  for (int32_t i = 0; i < in->num_shared_blocks; i++)
    if ((st = check_block(in->shared_blocks[i], t->num_blocks, "shared context"))) return st;
  for (int32_t i = 0; i < in->num_unique_blocks; i++)
    if ((st = check_block(in->unique_blocks[i].block, t->num_blocks, "unique context"))) return st;
  if (cross) {
    const uattn_cross *c = t->cross;
    UATTN_CHECK_PTR(c, "tensors.cross (encoder-decoder attention)");
    UATTN_CHECK_PTR(c->encoder_lens, "tensors.cross->encoder_lens");
    UATTN_CHECK_PTR(c->block_table, "tensors.cross->block_table");
    for (int32_t r = 0; r < in->num_reqs; r++) {
      const int32_t len = c->encoder_lens[r];
      if (len < 0)
        return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "tensors.cross->encoder_lens[%d] = %d must be >= 0", r, len);
      const int32_t nb = uattn_ceil_div_i32(len, t->block_size);
      if (nb > c->block_table_stride)
        return uattn_fail(UATTN_ERR_OUT_OF_RANGE,
                          "cross attention: request %d has %d encoder keys, past its block-table row (stride %d)", r,
                          len, c->block_table_stride);
      for (int32_t b = 0; b < nb; b++)
        if ((st = check_block(c->block_table[(int64_t)r * c->block_table_stride + b], t->num_blocks,
                              "cross block table")))
          return st;
    }
  }
  return UATTN_OK;
}

/* ---- caches ---------------------------------------------------------------------------------------- */

typedef struct cache_view {
  char *k, *v;
  uattn_dtype dtype;
  uattn_kv_layout layout;
  int32_t block_size, kv_heads, head_dim;
} cache_view;

/* Element offset of (slot, kv head)'s head_dim vector. */
static size_t cache_offset(const cache_view *c, int64_t slot, int32_t head) {
  if (c->layout == UATTN_LAYOUT_NHD) return ((size_t)slot * c->kv_heads + head) * c->head_dim;
  const int64_t block = slot / c->block_size, off = slot % c->block_size;
  return (((size_t)block * c->kv_heads + head) * c->block_size + off) * c->head_dim;
}

static void write_cache(const uattn_plan_info *in, const uattn_layer *L, const uattn_tensors *t,
                        const cache_view *c) {
  const size_t in_size = uattn_dtype_size(L->dtype), c_size = uattn_dtype_size(c->dtype);
  const int32_t D = L->head_dim, H = L->num_kv_heads;
  for (int32_t row = 0; row < in->num_tokens; row++) {
    const int64_t slot = in->slot_mapping[row];
    if (slot < 0) continue;
    for (int32_t h = 0; h < H; h++) {
      const size_t src = ((size_t)row * H + h) * D * in_size, dst = cache_offset(c, slot, h) * c_size;
      uattn_convert(L->dtype, (const char *)t->k + src, c->dtype, c->k + dst, (size_t)D);
      uattn_convert(L->dtype, (const char *)t->v + src, c->dtype, c->v + dst, (size_t)D);
    }
  }
}

/* ---- workspace --------------------------------------------------------------------------------------- */

typedef struct workspace {
  int32_t tile;      /* query rows per tile (the causal width) */
  int32_t panel;     /* keys per panel: max(block_size, tile) */
  int32_t group;     /* query heads per KV head */
  float *q;          /* [tile, group, D] scaled queries */
  float *keys, *values; /* [panel, D] */
  float *scores;     /* [panel] */
  float *state_o;    /* [4 parts][tile, group, D]: causal, shared, unique, chunk scratch */
  float *state_ml;   /* [4 parts][tile, group, 2] */
  int32_t *span_begin, *span_order; /* spans grouped by request: [num_reqs + 1], [num_spans] */
  int32_t *unique_begin;            /* unique blocks by row: [num_tokens + 1] */
  void *memory;
} workspace;

enum { PART_CAUSAL, PART_SHARED, PART_UNIQUE, PART_CHUNK, NUM_PARTS };

static uattn_status workspace_create(workspace *w, const uattn_plan_info *in, const uattn_layer *L) {
  const int32_t D = L->head_dim;
  w->tile = L->causal_width > 0 ? L->causal_width : UATTN_DEFAULT_CAUSAL_WIDTH;
  if (w->tile > in->num_tokens && in->num_tokens > 0) w->tile = in->num_tokens;
  w->panel = w->tile > in->block_size ? w->tile : in->block_size;
  w->group = L->num_q_heads / L->num_kv_heads;
  const size_t tg = (size_t)w->tile * w->group;
  const size_t floats = tg * D + 2 * (size_t)w->panel * D + w->panel + NUM_PARTS * tg * D + NUM_PARTS * tg * 2;
  const size_t ints = (size_t)in->num_reqs + 1 + (size_t)in->num_shared_spans + (size_t)in->num_tokens + 1;
  w->memory = malloc(floats * sizeof(float) + ints * sizeof(int32_t));
  if (!w->memory) return uattn_fail(UATTN_ERR_NO_MEMORY, "out of memory for the forward's workspace");
  float *f = w->memory;
  w->q = f, f += tg * D;
  w->keys = f, f += (size_t)w->panel * D;
  w->values = f, f += (size_t)w->panel * D;
  w->scores = f, f += w->panel;
  w->state_o = f, f += NUM_PARTS * tg * D;
  w->state_ml = f, f += NUM_PARTS * tg * 2;
  int32_t *i = (int32_t *)f;
  w->span_begin = i, i += in->num_reqs + 1;
  w->span_order = i, i += in->num_shared_spans;
  w->unique_begin = i;

  /* spans by request (counting sort keeps each request's spans in shared-block order) */
  memset(w->span_begin, 0, sizeof(int32_t) * ((size_t)in->num_reqs + 1));
  for (int32_t k = 0; k < in->num_shared_spans; k++) w->span_begin[in->shared_spans[k].req + 1]++;
  for (int32_t r = 0; r < in->num_reqs; r++) w->span_begin[r + 1] += w->span_begin[r];
  int32_t *cursor = w->unique_begin; /* borrowed before it is filled: it has num_tokens + 1 >= num_reqs slots */
  for (int32_t r = 0; r < in->num_reqs; r++) cursor[r] = w->span_begin[r];
  for (int32_t k = 0; k < in->num_shared_spans; k++) w->span_order[cursor[in->shared_spans[k].req]++] = k;
  /* unique blocks are sorted by row */
  for (int32_t row = 0, k = 0; row <= in->num_tokens; row++) {
    while (k < in->num_unique_blocks && in->unique_blocks[k].token < row) k++;
    w->unique_begin[row] = k;
  }
  return UATTN_OK;
}

static uattn_state part_state(const workspace *w, int part, int32_t row_in_tile, int32_t head_in_group,
                              int32_t D) {
  const size_t idx = ((size_t)part * w->tile + row_in_tile) * w->group + head_in_group;
  uattn_state s = {w->state_ml[2 * idx], w->state_ml[2 * idx + 1], w->state_o + idx * D};
  return s;
}

static void store_state(const workspace *w, int part, int32_t row_in_tile, int32_t head_in_group,
                        const uattn_state *s) {
  const size_t idx = ((size_t)part * w->tile + row_in_tile) * w->group + head_in_group;
  w->state_ml[2 * idx] = s->m;
  w->state_ml[2 * idx + 1] = s->l;
}

static void reset_part(workspace *w, int part, int32_t rows, int32_t D) {
  for (int32_t i = 0; i < rows; i++)
    for (int32_t h = 0; h < w->group; h++) {
      uattn_state s = part_state(w, part, i, h, D);
      uattn_state_reset(&s, D);
      store_state(w, part, i, h, &s);
    }
}

/* ---- the parts -------------------------------------------------------------------------------------- */

typedef struct step_ctx {
  const uattn_plan_info *in;
  const uattn_layer *L;
  const uattn_tensors *t;
  cache_view cache;
  workspace *w;
  int32_t kv_head, req, row0, rows; /* the tile: rows [row0, row0 + rows) of request req */
  int32_t qs, qe, num_computed;     /* the request's rows and cached keys */
} step_ctx;

static uattn_score_rule rule_for(const step_ctx *c, int32_t head_in_group) {
  const int32_t h = c->kv_head * c->w->group + head_in_group;
  uattn_score_rule r = {c->L->soft_cap, c->L->alibi_slopes ? c->L->alibi_slopes[h] : 0.0f,
                        c->L->attn_type == UATTN_ATTENTION_DECODER ? c->L->sliding_window : 0};
  return r;
}

/* Widens `count` keys and values of a cache block for the tile's KV head into the panels. */
static void load_block(const step_ctx *c, int32_t block, int32_t count) {
  const size_t esz = uattn_dtype_size(c->cache.dtype);
  const int32_t D = c->L->head_dim;
  for (int32_t i = 0; i < count; i++) {
    const size_t off = cache_offset(&c->cache, (int64_t)block * c->cache.block_size + i, c->kv_head) * esz;
    uattn_widen(c->cache.dtype, c->cache.k + off, c->w->keys + (size_t)i * D, (size_t)D);
    uattn_widen(c->cache.dtype, c->cache.v + off, c->w->values + (size_t)i * D, (size_t)D);
  }
}

/* Attends every row of the tile in [row_lo, row_hi) to the panel's first keys, each row seeing
 * usage(row) of them, into `part`. */
static void attend_rows(const step_ctx *c, int part, int32_t row_lo, int32_t row_hi, int32_t block_start,
                        int32_t (*usage)(const step_ctx *, int32_t row, int32_t block_start)) {
  const int32_t D = c->L->head_dim;
  if (row_lo < c->row0) row_lo = c->row0;
  if (row_hi > c->row0 + c->rows) row_hi = c->row0 + c->rows;
  for (int32_t row = row_lo; row < row_hi; row++) {
    const int32_t u = usage(c, row, block_start);
    if (u <= 0) continue;
    for (int32_t h = 0; h < c->w->group; h++) {
      uattn_state s = part_state(c->w, part, row - c->row0, h, D);
      const uattn_score_rule rule = rule_for(c, h);
      uattn_attend_panel(c->w->q + ((size_t)(row - c->row0) * c->w->group + h) * D, c->w->keys, c->w->values, D,
                         0, u, block_start, c->in->token_positions[row], &rule, c->w->scores, &s);
      store_state(c->w, part, row - c->row0, h, &s);
    }
  }
}

/* Keys of a context block a row sees: decoder rows by their own context length (per-row usage);
 * bidirectional rows see every cached key. */
static int32_t context_usage(const step_ctx *c, int32_t row, int32_t block_start) {
  const int32_t len = c->L->attn_type == UATTN_ATTENTION_DECODER ? c->in->token_context_lens[row] : c->num_computed;
  const int32_t u = len - block_start;
  return u < 0 ? 0 : (u > c->in->block_size ? c->in->block_size : u);
}

static void causal_part(const step_ctx *c) {
  const uattn_layer *L = c->L;
  const bool decoder = L->attn_type == UATTN_ATTENTION_DECODER;
  if (decoder && !c->in->is_prompt[c->req]) return; /* a decode row's keys are all in the cache */
  const int32_t D = L->head_dim, Hkv = L->num_kv_heads;
  const size_t esz = uattn_dtype_size(L->dtype);
  /* keys: this step's rows of the request; a decoder tile needs those up to its last row */
  const int32_t key_end = decoder ? c->row0 + c->rows : c->qe;
  for (int32_t k0 = c->qs; k0 < key_end; k0 += c->w->panel) {
    const int32_t n = key_end - k0 < c->w->panel ? key_end - k0 : c->w->panel;
    for (int32_t i = 0; i < n; i++) {
      const size_t off = ((size_t)(k0 + i) * Hkv + c->kv_head) * D * esz;
      uattn_widen(L->dtype, (const char *)c->t->k + off, c->w->keys + (size_t)i * D, (size_t)D);
      uattn_widen(L->dtype, (const char *)c->t->v + off, c->w->values + (size_t)i * D, (size_t)D);
    }
    for (int32_t row = c->row0; row < c->row0 + c->rows; row++) {
      const int32_t hi = decoder ? (row + 1 - k0 < n ? row + 1 - k0 : n) : n;
      if (hi <= 0) continue;
      for (int32_t h = 0; h < c->w->group; h++) {
        uattn_state s = part_state(c->w, PART_CAUSAL, row - c->row0, h, D);
        const uattn_score_rule rule = rule_for(c, h);
        uattn_attend_panel(c->w->q + ((size_t)(row - c->row0) * c->w->group + h) * D, c->w->keys, c->w->values, D,
                           0, hi, c->num_computed + (k0 - c->qs), c->in->token_positions[row], &rule, c->w->scores,
                           &s);
        store_state(c->w, PART_CAUSAL, row - c->row0, h, &s);
      }
    }
  }
}

/* Folds the chunk scratch into the shared part and clears it (PR 784's online merge across chunks). */
static void merge_chunk(const step_ctx *c) {
  const int32_t D = c->L->head_dim;
  for (int32_t i = 0; i < c->rows; i++)
    for (int32_t h = 0; h < c->w->group; h++) {
      uattn_state a = part_state(c->w, PART_SHARED, i, h, D), b = part_state(c->w, PART_CHUNK, i, h, D);
      uattn_state_merge(&a, &b, D);
      store_state(c->w, PART_SHARED, i, h, &a);
      uattn_state_reset(&b, D);
      store_state(c->w, PART_CHUNK, i, h, &b);
    }
}

static void shared_part(const step_ctx *c) {
  const uattn_plan_info *in = c->in;
  const int32_t chunk = c->L->chunk_size;
  const int part = chunk > 0 ? PART_CHUNK : PART_SHARED;
  int32_t current_chunk = -1;
  for (int32_t k = c->w->span_begin[c->req]; k < c->w->span_begin[c->req + 1]; k++) {
    const uattn_shared_span *sp = &in->shared_spans[c->w->span_order[k]];
    if (sp->token_end <= c->row0 || sp->token_begin >= c->row0 + c->rows) continue;
    if (chunk > 0 && sp->shared_index / chunk != current_chunk) {
      if (current_chunk >= 0) merge_chunk(c);
      current_chunk = sp->shared_index / chunk;
    }
    load_block(c, in->shared_blocks[sp->shared_index], in->block_size);
    attend_rows(c, part, sp->token_begin, sp->token_end, sp->block_start, context_usage);
  }
  if (current_chunk >= 0) merge_chunk(c);
}

static void unique_part(const step_ctx *c) {
  const uattn_plan_info *in = c->in;
  for (int32_t row = c->row0; row < c->row0 + c->rows; row++)
    for (int32_t k = c->w->unique_begin[row]; k < c->w->unique_begin[row + 1]; k++) {
      const uattn_unique_block *u = &in->unique_blocks[k];
      load_block(c, u->block, in->block_size);
      attend_rows(c, PART_UNIQUE, row, row + 1, u->block_start, context_usage);
    }
}

static int32_t cross_usage(const step_ctx *c, int32_t row, int32_t block_start) {
  (void)row;
  const int32_t u = c->t->cross->encoder_lens[c->req] - block_start;
  return u > c->in->block_size ? c->in->block_size : u;
}

/* Cross attention: every encoder key, through the cross block table, into the shared part. */
static void cross_part(const step_ctx *c) {
  const uattn_cross *x = c->t->cross;
  const int32_t bs = c->in->block_size, len = x->encoder_lens[c->req];
  for (int32_t b = 0; b * bs < len; b++) {
    const int32_t block = x->block_table[(int64_t)c->req * x->block_table_stride + b];
    load_block(c, block, len - b * bs < bs ? len - b * bs : bs);
    attend_rows(c, PART_SHARED, c->row0, c->row0 + c->rows, b * bs, cross_usage);
  }
}

/* Merges the tile's three parts into out and lse. */
static void merge_tile(const step_ctx *c) {
  const uattn_layer *L = c->L;
  const int32_t D = L->head_dim, Hq = L->num_q_heads;
  const size_t osz = uattn_dtype_size(L->dtype);
  float row_out[4096]; /* head_dim <= 4096 (validated) */
  for (int32_t i = 0; i < c->rows; i++)
    for (int32_t g = 0; g < c->w->group; g++) {
      const int32_t h = c->kv_head * c->w->group + g, row = c->row0 + i;
      const uattn_state parts[3] = {part_state(c->w, PART_CAUSAL, i, g, D), part_state(c->w, PART_SHARED, i, g, D),
                                    part_state(c->w, PART_UNIQUE, i, g, D)};
      const float lse = uattn_seed_merge(parts, 3, L->sinks ? L->sinks[h] : -INFINITY, D, row_out);
      uattn_narrow(L->dtype, row_out, (char *)c->t->out + ((size_t)row * Hq + h) * D * osz, (size_t)D);
      if (c->t->lse) c->t->lse[(size_t)row * Hq + h] = lse;
    }
}

/* ---- the call ---------------------------------------------------------------------------------------- */

uattn_status uattn_forward(const uattn_plan *plan, const uattn_layer *L, const uattn_tensors *t) {
  uattn_clear_error();
  UATTN_CHECK_PTR(plan, "plan");
  UATTN_CHECK_PTR(L, "layer");
  UATTN_CHECK_PTR(t, "tensors");
  uattn_status st;
  if ((st = validate_layer(L))) return st;
  const uattn_plan_info *in = &plan->info;
  if ((st = validate_tensors(in, &plan->config, L, t))) return st;
  if (in->num_tokens == 0) return UATTN_OK;
  workspace w;
  if ((st = workspace_create(&w, in, L))) return st;

  const cache_view cache = {t->key_cache, t->value_cache, L->cache_dtype, L->kv_layout,
                            t->block_size, L->num_kv_heads, L->head_dim};
  const bool cross = L->attn_type == UATTN_ATTENTION_ENCODER_DECODER;
  if (!cross) write_cache(in, L, t, &cache);

  const int32_t D = L->head_dim, Hq = L->num_q_heads;
  const size_t qsz = uattn_dtype_size(L->dtype);
  for (int32_t r = 0; r < in->num_reqs; r++) {
    const int32_t qs = in->query_start_loc[r], qe = in->query_start_loc[r + 1];
    for (int32_t g = 0; g < L->num_kv_heads; g++)
      for (int32_t row0 = qs; row0 < qe; row0 += w.tile) {
        step_ctx c = {in, L, t, cache, &w, g, r, row0, qe - row0 < w.tile ? qe - row0 : w.tile,
                      qs, qe, in->token_positions[qs]};
        for (int32_t i = 0; i < c.rows; i++)
          for (int32_t h = 0; h < w.group; h++) {
            float *q = w.q + ((size_t)i * w.group + h) * D;
            uattn_widen(L->dtype, (const char *)t->q + (((size_t)(row0 + i) * Hq) + g * w.group + h) * D * qsz, q,
                        (size_t)D);
            for (int32_t d = 0; d < D; d++) q[d] *= L->scale; /* the seed scales the query */
          }
        for (int part = 0; part < NUM_PARTS; part++) reset_part(&w, part, c.rows, D);
        if (cross) {
          cross_part(&c);
        } else {
          causal_part(&c);
          shared_part(&c);
          unique_part(&c);
        }
        merge_tile(&c);
      }
  }
  free(w.memory);
  return UATTN_OK;
}
