/* uattn_forward: the cache update and the attention of one planned step, in portable C.
 *
 * The seed's decomposition (unified.py), computed per (work item, KV head, query tile) over only the pairs
 * that are visible, with masks derived from positions and per-row usages rather than bias tensors:
 *  - causal: a prompt's rows against this step's keys of the same request, as the cache holds them;
 *  - shared: context blocks read by several rows (processed whole, or chunk_size blocks at a time and
 *    merged with an online softmax as in PR 784);
 *  - unique: context blocks read by one row, reduced per row;
 * then the seed's merge with its fmin/feps guards (and per-head sinks in the denominator). The two seed
 * defects are fixed by the plan: a decode row's keys all come from the cache, usages are per row.
 *
 * Every key and value is read as the cache holds it, this step's own included (uattn.h, uattn_forward), so
 * a key has one value whichever row reads it in whichever step. The causal part reads this step's keys from
 * a copy of k and v in the cache dtype (step_kv): the bytes write_cache stores, made by the same conversion
 * whether or not the token has a slot; where the cache dtype holds every input value exactly (equal dtypes,
 * an f32 cache) it reads k and v themselves, which is the same.
 *
 * fp8 caches (uattn.h: UATTN_FP8_E4M3, UATTN_FP8_E5M2) hold fp8(k / k_scale) and fp8(v / v_scale), and the
 * attention reads fp8 * k_scale and fp8 * v_scale, by folding the scales rather than applying them per key
 * (the kernels, whose loads widen the raw fp8 values exactly, stay as they are):
 *  - keys: every part (causal, shared, chunked shared, unique, split-K ranges, cross attention's encoder
 *    keys) gets the score scale scale * k_scale instead of scale, on its queries or, for the sets that take
 *    unscaled queries, on its scores, so its scores are scale * <q, fp8 * k_scale> up to one rounding;
 *  - values: sum_j p_j (v_j * v_scale) = v_scale * sum_j p_j v_j, so the unnormalized output of each part is
 *    multiplied by v_scale where a row's parts are merged into out (merge_tile, and merge_splits_job for
 *    split-K), which is linear in them; m, l and so lse are untouched.
 *
 * Context parallelism (uattn.h: uattn_plan_config.cp_size > 1): the rank's cache holds its share of every
 * request at local positions, the plan's context lengths and block starts count local keys, and this step's
 * keys the rank holds are gathered as the causal part reads them (consecutive local positions, so it stays one
 * panel at a time). The kernels place key i at key_pos0 + i; a row's causal and window bounds are monotone
 * in the local position, so they are given in local terms: visible counts of local keys, and for a window
 * each row's query position moved to where the kernel's window test (key > query - window) cuts the local
 * keys where the global one does (begin_tile). ALiBi needs the true distance between a key and the query,
 * which local positions do not give: with ALiBi every kernel call takes only a run of keys at consecutive
 * global positions (at most cp_interleave of them), at its global position, with the global query
 * positions (pieces; the decode kernel and all-heads units are not used then). Sinks are rank 0's.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "attention/merge.h"
#include "attention/kernel_choice.h"
#include "plan/schedule.h"
#include "kernels.h"
#include "threads/pool.h"
#include "tuning/tuning.h"

#define UATTN_SEED_CAUSAL_WIDTH 512 /* the seed's query rows per causal slice */
#define UATTN_MAX_NODES 16          /* NUMA nodes the work handout distinguishes; more share queues */
#define UATTN_MAX_HEAD_DIM 4096     /* validate_layer's bound, which sizes the per-row buffers on the stack */

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
  l.k_scale = l.v_scale = 1.0f;
  return l;
}

/* ---- validation ------------------------------------------------------------------------------------ */

static uattn_status validate_layer(const uattn_layer *L) {
  if (L->num_q_heads <= 0 || L->num_kv_heads <= 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "layer: num_q_heads (%d) and num_kv_heads (%d) must be > 0",
                      L->num_q_heads, L->num_kv_heads);
  if (L->num_q_heads % L->num_kv_heads != 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                      "layer: num_q_heads (%d) must be a multiple of num_kv_heads (%d) for grouped-query attention",
                      L->num_q_heads, L->num_kv_heads);
  if (L->head_dim <= 0 || L->head_dim > UATTN_MAX_HEAD_DIM)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "layer: head_dim = %d must be in 1..%d", L->head_dim,
                      UATTN_MAX_HEAD_DIM);
  if (!uattn_dtype_valid(L->dtype) || !uattn_dtype_valid(L->cache_dtype))
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "layer: dtype %d / cache_dtype %d is not a uattn_dtype",
                      (int)L->dtype, (int)L->cache_dtype);
  if (uattn_dtype_is_fp8(L->dtype))
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                      "layer: dtype %s is for KV caches only (cache_dtype): q, k, v and out are f32, bf16 or f16",
                      uattn_dtype_name(L->dtype));
  /* scale * k_scale is the cache parts' score scale (the fp8 folding below), so it must be finite too */
  if (uattn_dtype_is_fp8(L->cache_dtype) &&
      (!isfinite(L->k_scale) || !(L->k_scale > 0.0f) || !isfinite(L->scale * L->k_scale)))
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                      "layer: k_scale = %g must be finite and > 0 for an %s cache (and scale * k_scale finite)",
                      (double)L->k_scale, uattn_dtype_name(L->cache_dtype));
  if (uattn_dtype_is_fp8(L->cache_dtype) && (!isfinite(L->v_scale) || !(L->v_scale > 0.0f)))
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "layer: v_scale = %g must be finite and > 0 for an %s cache",
                      (double)L->v_scale, uattn_dtype_name(L->cache_dtype));
  if (L->kv_layout != UATTN_LAYOUT_NHD && L->kv_layout != UATTN_LAYOUT_HND && L->kv_layout != UATTN_LAYOUT_TILED)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "layer: kv_layout %d is not a uattn_kv_layout", (int)L->kv_layout);
  if (L->kv_layout == UATTN_LAYOUT_TILED && L->head_dim % 2)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                      "layer: a TILED cache stores dims in pairs, so head_dim must be even, not %d: use NHD or HND",
                      L->head_dim);
  if (!isfinite(L->scale)) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "layer: scale must be finite");
  if (!(L->soft_cap >= 0.0f) || !isfinite(L->soft_cap))
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "layer: soft_cap must be >= 0 (0 = none)");
  UATTN_CHECK_ALIGNED(L->sinks, "layer.sinks");
  UATTN_CHECK_ALIGNED(L->alibi_slopes, "layer.alibi_slopes");
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

/* Whether count x a x b x c elements of elem_bytes fit a size_t: the kernels index every tensor in size_t
 * bytes, and no caller can hold a buffer larger than that. */
static bool size_fits(size_t elem_bytes, int64_t count, int64_t a, int64_t b, int64_t c) {
  size_t bytes = elem_bytes;
  const int64_t dims[] = {count, a, b, c};
  for (int i = 0; i < 4; i++)
    if (__builtin_mul_overflow(bytes, (size_t)dims[i], &bytes)) return false;
  return true;
}

/* A void buffer of dtype: not NULL and aligned to its element size (the kernels load and store whole
 * elements; uattn.h, uattn_tensors). */
static uattn_status check_buffer(const void *p, uattn_dtype dtype, const char *what) {
  UATTN_CHECK_PTR(p, what);
  UATTN_CHECK_ALIGNMENT(p, uattn_dtype_size(dtype), what);
  return UATTN_OK;
}

/* The dtype out is written in: the layer's, or fp32 for partial results (uattn_tensors.out_f32). */
static uattn_dtype out_dtype(const uattn_layer *L, const uattn_tensors *t) { return t->out_f32 ? UATTN_F32 : L->dtype; }

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
  if (L->kv_layout == UATTN_LAYOUT_TILED && t->block_size % UATTN_TILED_KEYS)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                      "tensors.block_size = %d: a TILED cache holds blocks of whole %d-key tiles, so the block size "
                      "must be a multiple of %d: use NHD or HND",
                      t->block_size, UATTN_TILED_KEYS, UATTN_TILED_KEYS);
  if (!size_fits(uattn_dtype_size(L->cache_dtype), t->num_blocks, t->block_size, L->num_kv_heads, L->head_dim))
    return uattn_fail(UATTN_ERR_OVERFLOW,
                      "tensors: a cache of num_blocks %d x block_size %d x num_kv_heads %d x head_dim %d elements "
                      "overflows a size_t",
                      t->num_blocks, t->block_size, L->num_kv_heads, L->head_dim);
  if (!size_fits(sizeof(float), in->num_tokens, L->num_q_heads, L->head_dim, 1))
    return uattn_fail(UATTN_ERR_OVERFLOW,
                      "tensors: q and out of num_tokens %d x num_q_heads %d x head_dim %d elements overflow a size_t",
                      in->num_tokens, L->num_q_heads, L->head_dim);
  uattn_status st;
  if ((st = check_buffer(t->key_cache, L->cache_dtype, "tensors.key_cache")) ||
      (st = check_buffer(t->value_cache, L->cache_dtype, "tensors.value_cache")))
    return st;
  if (in->num_tokens == 0) return UATTN_OK;
  if ((st = check_buffer(t->q, L->dtype, "tensors.q")) || (st = check_buffer(t->out, out_dtype(L, t), "tensors.out")))
    return st;
  if (!cross && ((st = check_buffer(t->k, L->dtype, "tensors.k")) || (st = check_buffer(t->v, L->dtype, "tensors.v"))))
    return st;
  UATTN_CHECK_ALIGNED(t->lse, "tensors.lse");
  /* every block the step writes or reads must be inside these caches */
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
      /* the rank's share under context parallelism */
      const int32_t nb = uattn_ceil_div_i32(uattn_cp_local_len(pc, len), t->block_size);
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

/* NHD and HND: the element offset of (slot, kv head)'s head_dim vector. */
static size_t cache_offset(const cache_view *c, int64_t slot, int32_t head) {
  if (c->layout == UATTN_LAYOUT_NHD) return ((size_t)slot * c->kv_heads + head) * c->head_dim;
  const int64_t block = slot / c->block_size, off = slot % c->block_size;
  return (((size_t)block * c->kv_heads + head) * c->block_size + off) * c->head_dim;
}

/* TILED (uattn.h): the element where a head's share of a tile of a block starts, in either cache; within
 * it, key i's dim d among the keys (dim pairs of 16 keys) and among the values (key pairs of head_dim dims). */
static size_t tiled_share(const cache_view *c, int64_t block, int32_t tile, int32_t head) {
  const size_t tiles = (size_t)(c->block_size / UATTN_TILED_KEYS);
  return (((size_t)block * tiles + (size_t)tile) * c->kv_heads + head) * UATTN_TILED_KEYS * (size_t)c->head_dim;
}
static size_t tiled_key(int32_t i, int32_t d) { return ((size_t)(d / 2) * UATTN_TILED_KEYS + (size_t)i) * 2 + d % 2; }
static size_t tiled_value(int32_t i, int32_t d, int32_t D) { return ((size_t)(i / 2) * D + (size_t)d) * 2 + i % 2; }

/* One key's and one value's head_dim elements (kx, vx, in the cache dtype) to (slot, head) of the caches. */
static void store_vectors(const cache_view *c, int64_t slot, int32_t head, const char *kx, const char *vx) {
  const size_t esz = uattn_dtype_size(c->dtype), D = (size_t)c->head_dim;
  if (c->layout != UATTN_LAYOUT_TILED) {
    const size_t dst = cache_offset(c, slot, head) * esz;
    memcpy(c->k + dst, kx, D * esz), memcpy(c->v + dst, vx, D * esz);
    return;
  }
  const int32_t j = (int32_t)(slot % c->block_size), i = j % UATTN_TILED_KEYS;
  const size_t share = tiled_share(c, slot / c->block_size, j / UATTN_TILED_KEYS, head) * esz;
  for (int32_t d = 0; d < c->head_dim; d++) {
    memcpy(c->k + share + tiled_key(i, d) * esz, kx + (size_t)d * esz, esz);
    memcpy(c->v + share + tiled_value(i, d, c->head_dim) * esz, vx + (size_t)d * esz, esz);
  }
}

/* TILED: keys [first, first + count) of a block for heads [h0, h0 + heads), gathered into rows as an NHD
 * cache of `heads` heads holds them (k_out, v_out: [count][heads][head_dim] elements of esz bytes), for the
 * kernels that read rows: the panel loads, and the decode kernels of the sets without decode_tiled.
 * Specialized for each element size (gather_tiled below). */
static inline __attribute__((always_inline)) void gather_tiled_esz(const size_t esz, const cache_view *c, int32_t block,
                                                                   int32_t first, int32_t count, int32_t h0,
                                                                   int32_t heads, char *k_out, char *v_out) {
  const int32_t D = c->head_dim;
  for (int32_t x = 0; x < count; x++) {
    const int32_t j = first + x, i = j % UATTN_TILED_KEYS;
    for (int32_t g = 0; g < heads; g++) {
      const size_t share = tiled_share(c, block, j / UATTN_TILED_KEYS, h0 + g) * esz;
      char *kr = k_out + ((size_t)x * heads + g) * D * esz, *vr = v_out + ((size_t)x * heads + g) * D * esz;
      const char *kp = c->k + share + tiled_key(i, 0) * esz, *vp = c->v + share + tiled_value(i, 0, D) * esz;
      for (int32_t p = 0; p < D / 2; p++) /* a dim pair at a time: one load and store */
        memcpy(kr + 2 * (size_t)p * esz, kp + 2 * (size_t)p * UATTN_TILED_KEYS * esz, 2 * esz);
      for (int32_t d = 0; d < D; d++) memcpy(vr + (size_t)d * esz, vp + 2 * (size_t)d * esz, esz);
    }
  }
}

static void gather_tiled(const cache_view *c, int32_t block, int32_t first, int32_t count, int32_t h0, int32_t heads,
                         char *k_out, char *v_out) {
  switch (uattn_dtype_size(c->dtype)) {
  case 1: gather_tiled_esz(1, c, block, first, count, h0, heads, k_out, v_out); break;
  case 2: gather_tiled_esz(2, c, block, first, count, h0, heads, k_out, v_out); break;
  default: gather_tiled_esz(4, c, block, first, count, h0, heads, k_out, v_out); break;
  }
}

/* One head's vector into an fp8 cache: fp8(x / scale), x widened to fp32 and divided in fp32 (uattn.h). A
 * division, not a multiplication by 1 / scale, which would round twice. */
static void quantize(uattn_dtype from, const void *src, uattn_dtype to, uint8_t *dst, int32_t D, float scale) {
  float x[UATTN_MAX_HEAD_DIM];
  uattn_widen(from, src, x, (size_t)D);
  for (int32_t d = 0; d < D; d++) dst[d] = uattn_f32_to_fp8(to, x[d] / scale);
}

/* One head's key or value of this step (src, the layer's dtype) in the cache dtype, into dst. */
static void to_cache_dtype(const uattn_layer *L, const void *src, uattn_dtype to, char *dst, float fp8_scale) {
  if (uattn_dtype_is_fp8(to))
    quantize(L->dtype, src, to, (uint8_t *)dst, L->head_dim, fp8_scale);
  else
    uattn_convert(L->dtype, src, to, dst, (size_t)L->head_dim);
}

/* Whether the causal part reads this step's keys of request r (causal_part, run_rows): a prompt's, or a
 * bidirectional self-attention's. */
static bool reads_step_keys(const uattn_plan_info *in, const uattn_layer *L, int32_t r) {
  return L->attn_type != UATTN_ATTENTION_ENCODER_DECODER &&
         (L->attn_type != UATTN_ATTENTION_DECODER || in->is_prompt[r]);
}

/* Bytes of step_kv (the header comment): this step's k and v in the cache dtype, [2][T][Hkv][D], where the
 * cache dtype rounds some input values (not equal dtypes, not an f32 cache) and a causal part reads them;
 * else 0. */
static size_t step_kv_bytes(const uattn_plan_info *in, const uattn_layer *L) {
  if (L->cache_dtype == L->dtype || L->cache_dtype == UATTN_F32) return 0;
  bool causal = false;
  for (int32_t r = 0; r < in->num_reqs && !causal; r++) causal = reads_step_keys(in, L, r);
  return causal ? 2 * (size_t)in->num_tokens * L->num_kv_heads * L->head_dim * uattn_dtype_size(L->cache_dtype) : 0;
}

/* This step's k and v into the caches at their slots and, where step_kv is not NULL, every row into it (the
 * same bytes, [2][T][Hkv][D]), a slot or not. */
static void write_cache(const uattn_plan_info *in, const uattn_layer *L, const uattn_tensors *t, const cache_view *c,
                        char *step_kv) {
  const size_t in_size = uattn_dtype_size(L->dtype), cache_size = uattn_dtype_size(c->dtype);
  const int32_t D = L->head_dim, H = L->num_kv_heads;
  const size_t half = (size_t)in->num_tokens * H * D * cache_size; /* step_kv's keys, then its values */
  _Alignas(16) char kbuf[UATTN_MAX_HEAD_DIM * 4], vbuf[UATTN_MAX_HEAD_DIM * 4];
  for (int32_t row = 0; row < in->num_tokens; row++) {
    const int64_t slot = in->slot_mapping[row];
    if (slot < 0 && !step_kv) continue;
    for (int32_t h = 0; h < H; h++) {
      const size_t src = ((size_t)row * H + h) * D * in_size;
      char *kx = step_kv ? step_kv + ((size_t)row * H + h) * D * cache_size : kbuf, *vx = step_kv ? kx + half : vbuf;
      to_cache_dtype(L, (const char *)t->k + src, c->dtype, kx, L->k_scale);
      to_cache_dtype(L, (const char *)t->v + src, c->dtype, vx, L->v_scale);
      if (slot >= 0) store_vectors(c, slot, h, kx, vx);
    }
  }
}

/* The fp8 folding (the header comment): the score scale of every part, and the v_scale of their outputs; on
 * other caches the layer's scale, and no factor at all (bits unchanged). */
static float cache_score_scale(const uattn_layer *L) {
  return uattn_dtype_is_fp8(L->cache_dtype) ? L->scale * L->k_scale : L->scale;
}

/* Whether a part saw a key: else it is as reset_acc left it (m -inf, l 0; o 0, or not reset at all in a tile
 * that never runs the part), and the merge leaves it out (seen_parts). */
static bool part_seen(const uattn_state *s) { return s->l != 0.0f || s->m != -INFINITY; }

/* The parts' unnormalized outputs, times v_scale on an fp8 cache (those that saw a key: the others' o is not
 * read). */
static void fold_v_scale(const uattn_layer *L, uattn_state *parts, int32_t n) {
  if (!uattn_dtype_is_fp8(L->cache_dtype)) return;
  const float vs = L->v_scale;
  for (int32_t k = 0; k < n; k++) {
    if (!part_seen(&parts[k])) continue;
    float *o = parts[k].o; /* the test above once, so that the loop vectorizes */
    for (int32_t d = 0; d < L->head_dim; d++) o[d] *= vs;
  }
}

/* ---- the decode kernel ------------------------------------------------------------------------------ */

/* Rows of a request an all-heads unit takes (run_all_heads): as many as the decode kernel's jobs hold. */
static int32_t all_heads_max_rows(const uattn_layer *L) {
  return UATTN_DECODE_MAX_VECTORS / (L->num_q_heads / L->num_kv_heads);
}

/* Whether short cache-only requests run as all-heads units (run_all_heads): on a cache of several KV heads
 * (an NHD one, where one head's keys are a few lines of every row; a TILED one, whose tiles hold every head
 * in turn; an HND one, whose block holds each head's rows in turn: decode_hnd_heads), with the decode kernel,
 * and without the chunked merge of shared blocks (chunk_size, which the panel path keeps). */
static bool all_heads_layout(const uattn_layer *L, const uattn_kernels *k, int32_t block_size) {
  return L->num_kv_heads > 1 && all_heads_max_rows(L) > 0 && L->chunk_size == 0 &&
         uattn_decode_fits(k, block_size, L->head_dim, L->num_q_heads / L->num_kv_heads);
}

/* Whether the decode kernel reads a TILED cache as it lies (kernels.h: decode_tiled); else its blocks are
 * gathered into rows first (gather_tiled). */
static bool decodes_tiled(const uattn_layer *L, const uattn_kernels *k, int32_t block_size) {
  return L->kv_layout == UATTN_LAYOUT_TILED &&
         uattn_decode_tiled_fits(k, block_size, L->head_dim, L->num_q_heads / L->num_kv_heads, L->cache_dtype,
                                 L->probs_fp32);
}

/* ---- workspace ------------------------------------------------------------------------------------- */

/* One worker's scratch: a query tile, key/value panels and the partial states of the tile's rows. */
typedef struct workspace {
  const uattn_kernels *kern;
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
  char *stage;              /* [2][rows][D] elements of the cache dtype: keys, then values, gathered (gather_tiled) */
  float *q;                 /* [slots, group, D] scaled queries */
  float *keys, *values;     /* [panel, D] */
  float *scores;            /* [panel] */
  float *state_o;           /* [4 parts][slots, group, D]: causal, shared, unique, chunk scratch */
  float *state_m, *state_l; /* [4 parts][slots, group] */
  int32_t *visible;         /* [slots]: keys of the current panel each row sees */
  /* context parallelism only (cp_floats > 0), else NULL: */
  size_t cp_floats;
  float *gather;       /* [2][panel, D] elements of the layer's dtype: the rank's keys and values of the step */
  int32_t *query_pos;  /* [slots]: the rows' query positions as the kernels get them (begin_tile) */
  int32_t *piece_from; /* [slots]: the rows' visible counts of a whole block, while it is cut in pieces */
} workspace;

/* The workspace's accumulators of partial states: one per part of the attention (uattn_part) and the scratch
 * of a shared chunk. */
enum { ACC_CAUSAL, ACC_SHARED, ACC_UNIQUE, ACC_CHUNK, NUM_ACCS };

/* The kernel entry (uattn_part) that attends into an accumulator. */
static uattn_part kernel_part(int acc) {
  return acc == ACC_CAUSAL ? UATTN_PART_CAUSAL : acc == ACC_UNIQUE ? UATTN_PART_UNIQUE : UATTN_PART_SHARED;
}

/* Query rows per tile where the layer leaves causal_width at 0: the seed's 512 on 8 KV heads or more, 64 a
 * KV head below (Falcon-7B's one: 64; Qwen2-7B's four: 256). A prompt is a unit a (tile, KV head), so 512
 * rows made a 512-token chunk one unit on a model with one KV head, one worker's work; 64 x Hkv makes it 8
 * units whatever the heads, and a tile's queries and states (5 x rows x group x head_dim floats, 9 MB for
 * Falcon's 512 rows) stay nearer the core's L2. uattn-bench --scenario prefill, 3 rounds alternated, the
 * tile set through a tuning file, 2-vCPU Zen 4 (AVX2 kernels), against 512: Llama-3-70B TP8 and Falcon-7B
 * chunked-prefill 512/8k 0.83-1.00x on one thread, 0.40-0.58x on two; prefill 2048 0.88-1.01x and
 * 0.81-1.04x (64 and 128 alike); Qwen2-7B at 256 0.83-1.10x and 0.56-1.02x. On 8 KV heads (Llama-3-8B,
 * Gemma-2-9B) 128 and 256 were level with 512 within the noise (0.79-1.10x), so 512 stays there. */
static int32_t default_query_tile(const uattn_layer *L) {
  const int32_t tile = 64 * L->num_kv_heads;
  return tile < UATTN_SEED_CAUSAL_WIDTH ? tile : UATTN_SEED_CAUSAL_WIDTH;
}

static void workspace_shape(workspace *w, const uattn_plan_info *in, const uattn_layer *L, const uattn_kernels *k,
                            bool cp) {
  w->kern = k;
  w->tile = L->causal_width > 0 ? L->causal_width : default_query_tile(L);
  if (w->tile > in->num_tokens && in->num_tokens > 0) w->tile = in->num_tokens;
  w->slots = w->tile;
  if (all_heads_layout(L, k, in->block_size) && L->num_kv_heads * all_heads_max_rows(L) > w->slots)
    w->slots = L->num_kv_heads * all_heads_max_rows(L);
  w->panel = w->tile > in->block_size ? w->tile : in->block_size;
  w->group = L->num_q_heads / L->num_kv_heads;
  w->panel_floats = k->panel_floats(w->panel, L->head_dim);
  w->decode_floats = 0;
  if (uattn_decode_fits(k, in->block_size, L->head_dim, w->group)) {
    const bool all = all_heads_layout(L, k, in->block_size);
    w->decode_floats = uattn_decode_scratch_floats(all ? L->num_kv_heads : 1,
                                                   all ? all_heads_max_rows(L) * w->group : w->group, L->head_dim);
    w->decode_floats = (w->decode_floats + 15) & ~(size_t)15; /* what follows stays on 64-byte lines */
  }
  w->cp_floats = cp ? 2 * (size_t)w->panel * L->head_dim + 2 * (size_t)w->slots : 0;
  /* TILED: a block of one head for the panel loads; of every head for a decode kernel that reads rows */
  w->stage_floats = 0;
  if (L->kv_layout == UATTN_LAYOUT_TILED) {
    const bool all_rows = all_heads_layout(L, k, in->block_size) && !decodes_tiled(L, k, in->block_size);
    const size_t bytes =
        2 * (size_t)in->block_size * (all_rows ? L->num_kv_heads : 1) * L->head_dim * uattn_dtype_size(L->cache_dtype);
    w->stage_floats = ((bytes + 3) / 4 + 15) & ~(size_t)15;
  }
}

static size_t workspace_bytes(const workspace *w, int32_t D) {
  const size_t tg = (size_t)w->slots * w->group;
  return sizeof(float) * (w->decode_floats + w->stage_floats + tg * D + 2 * w->panel_floats + w->panel +
                          NUM_ACCS * tg * D + NUM_ACCS * tg * 2 + w->cp_floats) +
         sizeof(int32_t) * (size_t)w->slots;
}

static void workspace_carve(workspace *w, void *memory, int32_t D) {
  const size_t tg = (size_t)w->slots * w->group;
  float *f = memory;
  w->decode_scratch = f, f += w->decode_floats;
  w->stage = w->stage_floats ? (char *)f : NULL, f += w->stage_floats;
  w->q = f, f += tg * D;
  w->keys = f, f += w->panel_floats;
  w->values = f, f += w->panel_floats;
  w->scores = f, f += w->panel;
  w->state_o = f, f += NUM_ACCS * tg * D;
  w->state_m = f, f += NUM_ACCS * tg;
  w->state_l = f, f += NUM_ACCS * tg;
  w->gather = w->cp_floats ? f : NULL, f += w->cp_floats ? 2 * (size_t)w->panel * D : 0;
  w->query_pos = w->cp_floats ? (int32_t *)f : NULL, f += w->cp_floats ? w->slots : 0;
  w->piece_from = w->cp_floats ? (int32_t *)f : NULL, f += w->cp_floats ? w->slots : 0;
  w->visible = (int32_t *)f;
}

/* Index of (accumulator, slot, head in group) in the state arrays. */
static size_t state_index(const workspace *w, int acc, int32_t slot, int32_t head_in_group) {
  return ((size_t)acc * w->slots + slot) * w->group + head_in_group;
}

static uattn_state acc_state(const workspace *w, int acc, int32_t slot, int32_t head_in_group, int32_t D) {
  const size_t idx = state_index(w, acc, slot, head_in_group);
  uattn_state s = {w->state_m[idx], w->state_l[idx], w->state_o + idx * D};
  return s;
}

static void store_state(const workspace *w, int acc, int32_t slot, int32_t head_in_group, const uattn_state *s) {
  const size_t idx = state_index(w, acc, slot, head_in_group);
  w->state_m[idx] = s->m;
  w->state_l[idx] = s->l;
}

/* Clears an accumulator's states for rows [slot, slot + rows): m and l always, o unless the tile never runs
 * the part (outputs false). A part's first kernel call multiplies o by e^(-inf) = 0, so o must start at 0
 * where it runs; where it does not, m and l alone keep it out of every merge (part_seen). */
static void reset_acc(workspace *w, int acc, int32_t slot, int32_t rows, int32_t D, bool outputs) {
  for (int32_t i = slot; i < slot + rows; i++)
    for (int32_t h = 0; h < w->group; h++) {
      const size_t idx = state_index(w, acc, i, h);
      w->state_m[idx] = -INFINITY, w->state_l[idx] = 0.0f;
      if (outputs) memset(w->state_o + idx * D, 0, sizeof(float) * (size_t)D);
    }
}

/* ---- the parts -------------------------------------------------------------------------------------- */

/* The parts stay functions of their own (never inlined into the unit loop), so a profile without debug
 * information still says which part the time went to (perf/record/record.sh). */
#define PART_FN static __attribute__((noinline))

typedef struct step_ctx {
  const uattn_schedule *sched;
  const uattn_plan_info *in;
  const uattn_layer *L;
  const uattn_tensors *t;
  cache_view cache;
  workspace *w;
  int32_t kv_head, req, row0, rows; /* the tile: rows [row0, row0 + rows) of request req */
  int32_t slot;                     /* the workspace slot of row0 (see tile_slot) */
  int32_t qs, qe, num_computed;     /* the request's rows and cached keys (the rank's, local) */
  int32_t key_lo, key_hi;           /* context blocks starting in [key_lo, key_hi): all, or one split */
  int32_t heads;               /* an all-heads unit's KV heads from kv_head, which its decode calls take together */
  const char *step_k, *step_v; /* this step's keys and values as the causal part reads them (header comment) */
  uattn_dtype step_dtype;      /* theirs: the cache dtype (step_kv), or the layer's (k and v themselves) */
  const uattn_plan_config *cp; /* context parallelism: the plan's config (cp_size > 1), else NULL */
  bool pieces;                 /* ALiBi under context parallelism: kernel calls on runs of keys */
} step_ctx;

/* Where a row of the tile keeps its query, states and visible count in the workspace: the tile's rows in
 * order, from slot 0 or, in an all-heads unit, from KV head g's slot g * rows. */
static int32_t tile_slot(const step_ctx *c, int32_t row) { return row - c->row0 + c->slot; }

/* The kernel job of rows [row_lo, row_hi) of the tile against num_keys keys at key_pos0, into `acc`. */
static uattn_panel_job panel_job(const step_ctx *c, int acc, int32_t row_lo, int32_t row_hi, int32_t num_keys,
                                 int32_t key_pos0) {
  const workspace *w = c->w;
  const int32_t D = c->L->head_dim, first = tile_slot(c, row_lo);
  const size_t idx = state_index(w, acc, first, 0);
  const uattn_panel_job job = {
      .rows = row_hi - row_lo,
      .group = w->group,
      .head_dim = D,
      .q = w->q + (size_t)first * w->group * D,
      .query_pos = c->cp && !c->pieces ? w->query_pos + first : c->in->token_positions + row_lo,
      .visible = w->visible + first,
      .num_keys = num_keys,
      .key_pos0 = key_pos0,
      .keys = w->keys,
      .values = w->values,
      .soft_cap = c->L->soft_cap,
      .window = c->L->attn_type == UATTN_ATTENTION_DECODER ? c->L->sliding_window : 0,
      .alibi = c->L->alibi_slopes ? c->L->alibi_slopes + c->kv_head * w->group : NULL,
      .m = w->state_m + idx,
      .l = w->state_l + idx,
      .o = w->state_o + idx * D,
      .scores = w->scores,
      .scale = cache_score_scale(c->L), /* fp8: the folded k_scale, in every part */
      .probs_fp32 = c->L->probs_fp32,
  };
  return job;
}

/* A kernel call over rows [row_lo, row_hi) of the tile (their visible counts already in w->visible) and the
 * panel now loaded, into `acc`. */
static void attend_panel(const step_ctx *c, int acc, int32_t row_lo, int32_t row_hi, int32_t num_keys,
                         int32_t key_pos0) {
  const uattn_panel_job job = panel_job(c, acc, row_lo, row_hi, num_keys, key_pos0);
  const uattn_part kp = kernel_part(acc);
  c->w->calls[kp]++;
  c->w->kern->attend[kp](&job, c->w->panel);
}

/* NHD and HND: where a cache block's keys for the tile's KV head start (bytes into each cache) and the
 * elements from one key to the next: a whole row of heads in NHD, one head in HND. */
static size_t block_source(const step_ctx *c, int32_t block, size_t *stride) {
  *stride =
      c->cache.layout == UATTN_LAYOUT_NHD ? (size_t)c->cache.kv_heads * c->cache.head_dim : (size_t)c->cache.head_dim;
  return cache_offset(&c->cache, (int64_t)block * c->cache.block_size, c->kv_head) * uattn_dtype_size(c->cache.dtype);
}

/* TILED: where a cache block's first tile holds the tile's KV head (bytes into each cache), and the elements
 * from one tile's share of that head to the next tile's. */
static size_t tiled_source(const step_ctx *c, int32_t block, size_t *tile_stride) {
  *tile_stride = (size_t)c->cache.kv_heads * UATTN_TILED_KEYS * c->cache.head_dim;
  return tiled_share(&c->cache, block, 0, c->kv_head) * uattn_dtype_size(c->cache.dtype);
}

/* Widens `count` keys and values of a cache block, from its key `first` on, for the tile's KV head into the
 * panels: on TILED, from the block as it lies where the set can (kernels.h: load_tiled), else gathered into
 * rows. */
static void load_block(const step_ctx *c, int32_t block, int32_t first, int32_t count) {
  if (c->cache.layout == UATTN_LAYOUT_TILED && uattn_load_tiled_fits(c->w->kern, c->cache.dtype)) {
    size_t stride;
    const size_t off = tiled_source(c, block, &stride);
    c->w->kern->load_tiled(c->cache.dtype, c->cache.k + off, c->cache.v + off, stride, first, count, c->cache.head_dim,
                           c->w->panel, c->w->keys, c->w->values);
    return;
  }
  if (c->cache.layout == UATTN_LAYOUT_TILED) {
    const size_t half = (size_t)c->in->block_size * c->cache.head_dim * uattn_dtype_size(c->cache.dtype);
    gather_tiled(&c->cache, block, first, count, c->kv_head, 1, c->w->stage, c->w->stage + half);
    c->w->kern->load(c->cache.dtype, c->w->stage, c->w->stage + half, (size_t)c->cache.head_dim, count,
                     c->cache.head_dim, c->w->panel, c->w->keys, c->w->values);
    return;
  }
  size_t stride;
  const size_t off = block_source(c, block, &stride) + (size_t)first * stride * uattn_dtype_size(c->cache.dtype);
  c->w->kern->load(c->cache.dtype, c->cache.k + off, c->cache.v + off, stride, count, c->cache.head_dim, c->w->panel,
                   c->w->keys, c->w->values);
}

/* ALiBi under context parallelism (the header comment): the first `count` keys of a block, cut into runs of
 * consecutive global positions, each loaded and attended at its global position, every row seeing of a run
 * what it sees of the block (its visible count of the block, kept in piece_from). */
static void attend_block_pieces(const step_ctx *c, int acc, int32_t row_lo, int32_t row_hi, int32_t block,
                                int32_t block_start, int32_t count) {
  const int32_t I = c->cp->cp_interleave;
  int32_t seen = 0; /* keys of the block any of the rows sees */
  for (int32_t row = row_lo; row < row_hi; row++) {
    const int32_t x = tile_slot(c, row);
    c->w->piece_from[x] = c->w->visible[x];
    if (c->w->visible[x] > seen) seen = c->w->visible[x];
  }
  if (seen > count) seen = count;
  for (int32_t a = 0, b; a < seen; a = b) {
    b = a + I - (block_start + a) % I;
    if (b > seen) b = seen;
    for (int32_t row = row_lo; row < row_hi; row++) {
      const int32_t x = tile_slot(c, row), v = c->w->piece_from[x] - a;
      c->w->visible[x] = v < 0 ? 0 : (v > b - a ? b - a : v);
    }
    load_block(c, block, a, b - a);
    attend_panel(c, acc, row_lo, row_hi, b - a, uattn_cp_global_pos(c->cp, block_start + a));
  }
}

/* Attends the tile's rows in [row_lo, row_hi) (their visible counts already in w->visible) to the first
 * `count` keys of a cache block, into `acc`. */
static void attend_block(const step_ctx *c, int acc, int32_t row_lo, int32_t row_hi, int32_t block, int32_t block_start,
                         int32_t count) {
  if (c->pieces) {
    attend_block_pieces(c, acc, row_lo, row_hi, block, block_start, count);
    return;
  }
  load_block(c, block, 0, count);
  attend_panel(c, acc, row_lo, row_hi, c->in->block_size, block_start);
}

/* Attends the tile's rows in [row_lo, row_hi) to the first `count` keys of a cache block, each row seeing
 * usage(row) of them, into `acc`. */
static void attend_rows(const step_ctx *c, int acc, int32_t row_lo, int32_t row_hi, int32_t block, int32_t block_start,
                        int32_t count, int32_t (*usage)(const step_ctx *, int32_t row, int32_t block_start)) {
  if (row_lo < c->row0) row_lo = c->row0;
  if (row_hi > c->row0 + c->rows) row_hi = c->row0 + c->rows;
  if (row_lo >= row_hi) return;
  for (int32_t row = row_lo; row < row_hi; row++) c->w->visible[tile_slot(c, row)] = usage(c, row, block_start);
  attend_block(c, acc, row_lo, row_hi, block, block_start, count);
}

/* Keys of a context block a row sees: decoder rows by their own context length (per-row usage);
 * bidirectional rows see every cached key. */
static int32_t context_usage(const step_ctx *c, int32_t row, int32_t block_start) {
  const int32_t len = c->L->attn_type == UATTN_ATTENTION_DECODER ? c->in->token_context_lens[row] : c->num_computed;
  const int32_t u = len - block_start;
  return u < 0 ? 0 : (u > c->in->block_size ? c->in->block_size : u);
}

/* The causal part under context parallelism, over this step's keys of the request in rows [qs, key_end)
 * of k/v: those the rank holds, gathered a panel at a time (in pieces also cut where their positions jump)
 * and placed at their local positions (in pieces their global ones). */
static void causal_part_cp(const step_ctx *c, int32_t key_end) {
  const uattn_layer *L = c->L;
  const bool decoder = L->attn_type == UATTN_ATTENTION_DECODER;
  const int32_t D = L->head_dim, Hkv = L->num_kv_heads, nc = c->in->token_positions[c->qs];
  const size_t esz = uattn_dtype_size(c->step_dtype), row_bytes = (size_t)D * esz;
  char *gk = (char *)c->w->gather, *gv = gk + (size_t)c->w->panel * row_bytes;
  int32_t local = c->num_computed; /* the local position of the next key the rank holds */
  for (int32_t k = c->qs; k < key_end;) {
    int32_t n = 0, pos0 = 0;
    for (; k < key_end && n < c->w->panel; k++) {
      const int32_t pos = nc + (k - c->qs);
      if (!uattn_cp_owns(c->cp, pos)) {
        if (c->pieces && n > 0) break;
        continue;
      }
      if (n == 0) pos0 = pos;
      const size_t off = ((size_t)k * Hkv + c->kv_head) * row_bytes;
      memcpy(gk + (size_t)n * row_bytes, c->step_k + off, row_bytes);
      memcpy(gv + (size_t)n * row_bytes, c->step_v + off, row_bytes);
      n++;
    }
    if (n == 0) continue;
    c->w->kern->load(c->step_dtype, gk, gv, (size_t)D, n, D, c->w->panel, c->w->keys, c->w->values);
    const int32_t key_pos0 = c->pieces ? pos0 : local;
    for (int32_t row = c->row0; row < c->row0 + c->rows; row++) {
      const int32_t pos = c->in->token_positions[row];
      /* a decoder row sees the keys at or before its position */
      const int32_t hi = !decoder ? n : c->pieces ? pos + 1 - key_pos0 : uattn_cp_local_len(c->cp, pos + 1) - local;
      c->w->visible[tile_slot(c, row)] = hi < 0 ? 0 : (hi > n ? n : hi);
    }
    attend_panel(c, ACC_CAUSAL, c->row0, c->row0 + c->rows, n, key_pos0);
    local += n;
  }
}

PART_FN void causal_part(const step_ctx *c) {
  const uattn_layer *L = c->L;
  const bool decoder = L->attn_type == UATTN_ATTENTION_DECODER;
  if (!reads_step_keys(c->in, L, c->req)) return; /* a decode row's keys are all in the cache */
  const int32_t D = L->head_dim, Hkv = L->num_kv_heads;
  const size_t esz = uattn_dtype_size(c->step_dtype);
  /* keys: this step's rows of the request; a decoder tile needs those up to its last row */
  const int32_t key_end = decoder ? c->row0 + c->rows : c->qe;
  if (c->cp) {
    causal_part_cp(c, key_end);
    return;
  }
  for (int32_t k0 = c->qs; k0 < key_end; k0 += c->w->panel) {
    const int32_t n = key_end - k0 < c->w->panel ? key_end - k0 : c->w->panel;
    const size_t off = ((size_t)k0 * Hkv + c->kv_head) * D * esz;
    c->w->kern->load(c->step_dtype, c->step_k + off, c->step_v + off, (size_t)Hkv * D, n, D, c->w->panel, c->w->keys,
                     c->w->values);
    for (int32_t row = c->row0; row < c->row0 + c->rows; row++) {
      const int32_t hi = decoder ? row + 1 - k0 : n; /* a decoder row sees this step's keys up to its own */
      c->w->visible[tile_slot(c, row)] = hi < 0 ? 0 : (hi > n ? n : hi);
    }
    attend_panel(c, ACC_CAUSAL, c->row0, c->row0 + c->rows, n, c->num_computed + (k0 - c->qs));
  }
}

/* Folds the chunk scratch into the shared part and clears it (PR 784's online merge across chunks). */
static void merge_chunk(const step_ctx *c) {
  const int32_t D = c->L->head_dim;
  for (int32_t i = 0; i < c->rows; i++)
    for (int32_t h = 0; h < c->w->group; h++) {
      const int32_t x = c->slot + i;
      uattn_state a = acc_state(c->w, ACC_SHARED, x, h, D), b = acc_state(c->w, ACC_CHUNK, x, h, D);
      uattn_state_merge(&a, &b, D);
      store_state(c->w, ACC_SHARED, x, h, &a);
      uattn_state_reset(&b, D);
      store_state(c->w, ACC_CHUNK, x, h, &b);
    }
}

PART_FN void shared_part(const step_ctx *c) {
  const uattn_plan_info *in = c->in;
  const int32_t chunk = c->L->chunk_size;
  const int acc = chunk > 0 ? ACC_CHUNK : ACC_SHARED;
  int32_t current_chunk = -1;
  const int32_t *order = c->sched->spans_by_req;
  for (int32_t k = c->sched->span_req_begin[c->req]; k < c->sched->span_req_begin[c->req + 1]; k++) {
    const uattn_shared_span *sp = &in->shared_spans[order[k]];
    if (sp->token_end <= c->row0 || sp->token_begin >= c->row0 + c->rows) continue;
    if (sp->block_start < c->key_lo || sp->block_start >= c->key_hi) continue;
    if (chunk > 0 && sp->shared_index / chunk != current_chunk) {
      if (current_chunk >= 0) merge_chunk(c);
      current_chunk = sp->shared_index / chunk;
    }
    attend_rows(c, acc, sp->token_begin, sp->token_end, in->shared_blocks[sp->shared_index], sp->block_start,
                in->block_size, context_usage);
  }
  if (current_chunk >= 0) merge_chunk(c);
}

/* The shared part of a prefix run (requests [first, end), consecutive, all reading the cache only):
 * their span lists merged by shared block, so each block is loaded once for every row of the tile that
 * reads it. A row that does not read the block sees none of it (visible 0). */
PART_FN void shared_part_prefix_run(const step_ctx *c, int32_t first, int32_t end) {
  const uattn_plan_info *in = c->in;
  const int32_t chunk = c->L->chunk_size, *order = c->sched->spans_by_req, *begin = c->sched->span_req_begin;
  const int acc = chunk > 0 ? ACC_CHUNK : ACC_SHARED;
  int32_t cursor[UATTN_PREFIX_RUN_MAX_ROWS]; /* each request's next span (a run has at most that many) */
  for (int32_t r = first; r < end; r++) cursor[r - first] = begin[r];
  int32_t current_chunk = -1;
  for (;;) {
    int32_t next = INT32_MAX; /* the lowest shared block any request has left */
    for (int32_t r = first; r < end; r++)
      if (cursor[r - first] < begin[r + 1] && in->shared_spans[order[cursor[r - first]]].shared_index < next)
        next = in->shared_spans[order[cursor[r - first]]].shared_index;
    if (next == INT32_MAX) break;
    int32_t lo = INT32_MAX, hi = INT32_MIN, block_start = 0; /* the tile's rows that read it */
    for (int32_t r = first; r < end; r++) {
      if (cursor[r - first] >= begin[r + 1]) continue;
      const uattn_shared_span *sp = &in->shared_spans[order[cursor[r - first]]];
      if (sp->shared_index != next) continue;
      cursor[r - first]++;
      const int32_t a = sp->token_begin > c->row0 ? sp->token_begin : c->row0;
      const int32_t b = sp->token_end < c->row0 + c->rows ? sp->token_end : c->row0 + c->rows;
      if (a >= b) continue;
      if (lo == INT32_MAX)
        for (int32_t i = 0; i < c->rows; i++) c->w->visible[c->slot + i] = 0;
      block_start = sp->block_start; /* the same in every request that holds the block */
      for (int32_t row = a; row < b; row++) c->w->visible[tile_slot(c, row)] = context_usage(c, row, block_start);
      if (a < lo) lo = a;
      if (b > hi) hi = b;
    }
    if (lo >= hi) continue;
    if (chunk > 0 && next / chunk != current_chunk) {
      if (current_chunk >= 0) merge_chunk(c);
      current_chunk = next / chunk;
    }
    attend_block(c, acc, lo, hi, in->shared_blocks[next], block_start, in->block_size);
  }
  if (current_chunk >= 0) merge_chunk(c);
}

/* A decode row's unique block straight from the cache, when the kernel set can (kernels.h: decode) and the
 * keys of a block are at consecutive positions (not in pieces). */
static bool decodes_from_cache(const step_ctx *c) {
  return !c->pieces && uattn_decode_fits(c->w->kern, c->in->block_size, c->L->head_dim, c->w->group);
}

/* The most cache blocks one decode call takes (joins_decode_call): as many as UATTN_DECODE_MAX_KEYS keys of
 * UATTN_DECODE_TILE-key blocks, the smallest a list takes; runs of smaller NHD blocks stop there. */
enum { MAX_DECODE_BLOCKS = UATTN_DECODE_MAX_KEYS / UATTN_DECODE_TILE };

/* An HND block, or a run of `count` of them (unique_run, shared_run), for the `heads` KV heads of an all-heads
 * unit (job: as for one call of every head): one decode call a head, head after head, over the head's piece of
 * each block, each told the next head's rows, the last the next block's first; on a single block the unit
 * reads it in address order as NHD's all-heads calls do, and a verification's shared blocks go through the
 * decode kernel as its unique ones do. Units of one head read one piece of every block (32 KB, then 256 KB
 * on, at Llama-3-8B's bf16) and took shared blocks through panels. Against them on the 2-vCPU Zen 5
 * (uattn-bench, HND, Llama-3-8B and Qwen2-7B, three rounds alternated, 1 / 2 threads): spec decode 32x2
 * 2.1-2.2x / 1.9-2.6x (Qwen2-7B 1.5-1.7x / 1.6-1.9x), 16x4 1.5-1.9x / 1.4-1.8x, decode-heavy 1.04-1.16x /
 * 1.11-1.54x, decode-long 1.00-1.15x on two threads (fp8 E4M3 1.09-1.32x) and 0.87-1.29x on one (five more
 * rounds, pinned: medians 1.06-1.14x); decode-short level. One call for every head (head stride a block's
 * rows) measured 0.68-0.90x: every head's rows fall in the same L1 sets. */
static void decode_hnd_heads(const step_ctx *c, const uattn_panel_job *job, int32_t heads, size_t head_vectors,
                             const int32_t *blocks, int32_t count, int32_t next_block) {
  const size_t esz = uattn_dtype_size(c->cache.dtype);
  const void *k[MAX_DECODE_BLOCKS], *v[MAX_DECODE_BLOCKS];
  const uattn_decode_src src = uattn_decode_blocks(k, v, count, c->in->block_size, (size_t)c->cache.head_dim, 0);
  for (int32_t g = 0; g < heads; g++) {
    uattn_panel_job h = uattn_decode_head_job(job, g, head_vectors);
    for (int32_t b = 0; b < count; b++) {
      const size_t at = cache_offset(&c->cache, (int64_t)blocks[b] * c->cache.block_size, c->kv_head + g) * esz;
      k[b] = c->cache.k + at, v[b] = c->cache.v + at;
    }
    if (g + 1 < heads || next_block >= 0) { /* the next head's rows, or the next block's first head's */
      const int64_t slot = (int64_t)(g + 1 < heads ? blocks[0] : next_block) * c->cache.block_size;
      const size_t to = cache_offset(&c->cache, slot, g + 1 < heads ? c->kv_head + g + 1 : c->kv_head) * esz;
      h.next_k = c->cache.k + to, h.next_v = c->cache.v + to;
    }
    c->w->kern->decode(&h, 1, head_vectors, c->cache.dtype, &src, c->w->decode_scratch);
  }
}

/* The decode kernel on rows [row_lo, row_hi) of the tile (their visible counts already in w->visible) and
 * the first n keys of `count` cache blocks at consecutive positions from block_start (unique_run, shared_run:
 * several on NHD and HND, one on TILED), into `acc`, for `heads` KV heads from the tile's (an all-heads unit's heads:
 * their slots `rows` apart, their keys a head dim apart in each NHD row; HND: decode_hnd_heads). */
static void decode_from_cache(const step_ctx *c, int acc, int32_t row_lo, int32_t row_hi, const int32_t *blocks,
                              int32_t count, int32_t block_start, int32_t n, int32_t heads, int32_t next_block) {
  uattn_panel_job job = panel_job(c, acc, row_lo, row_hi, n, block_start);
  const size_t head_vectors = (size_t)c->rows * c->w->group, D = (size_t)c->cache.head_dim;
  const int32_t block = blocks[0];
  c->w->calls[kernel_part(acc)] += heads;
  c->w->decode_calls[kernel_part(acc)] += heads;
  if (c->cache.layout == UATTN_LAYOUT_HND) {
    decode_hnd_heads(c, &job, heads, head_vectors, blocks, count, next_block);
  } else if (c->cache.layout != UATTN_LAYOUT_TILED) {
    size_t stride = 0;
    const void *k[MAX_DECODE_BLOCKS], *v[MAX_DECODE_BLOCKS];
    for (int32_t b = 0; b < count; b++) {
      const size_t at = block_source(c, blocks[b], &stride);
      k[b] = c->cache.k + at, v[b] = c->cache.v + at;
    }
    if (next_block >= 0) {
      const size_t next = block_source(c, next_block, &stride);
      job.next_k = c->cache.k + next, job.next_v = c->cache.v + next;
    }
    const uattn_decode_src src = uattn_decode_blocks(k, v, count, c->in->block_size, stride, D);
    c->w->kern->decode(&job, heads, head_vectors, c->cache.dtype, &src, c->w->decode_scratch);
  } else if (decodes_tiled(c->L, c->w->kern, c->in->block_size)) {
    size_t stride;
    const size_t off = tiled_source(c, block, &stride);
    if (next_block >= 0) {
      const size_t next = tiled_source(c, next_block, &stride);
      job.next_k = c->cache.k + next, job.next_v = c->cache.v + next;
    }
    c->w->kern->decode_tiled(&job, heads, head_vectors, c->cache.dtype, c->cache.k + off, c->cache.v + off, stride,
                             UATTN_TILED_KEYS * D, c->w->decode_scratch);
  } else { /* the block's rows gathered as an NHD cache of these heads holds them */
    const size_t half = (size_t)n * heads * D * uattn_dtype_size(c->cache.dtype);
    gather_tiled(&c->cache, block, 0, n, c->kv_head, heads, c->w->stage, c->w->stage + half);
    const void *k = c->w->stage, *v = c->w->stage + half;
    const uattn_decode_src src = uattn_decode_one_block(&k, &v, (size_t)heads * D, D);
    c->w->kern->decode(&job, heads, head_vectors, c->cache.dtype, &src, c->w->decode_scratch);
  }
}

/* The cache block of the row's unique block after k where the unit reads it, else -1: a decode kernel asks
 * for its first keys as it ends (uattn_panel_job.next_k). */
static int32_t next_unique_block(const step_ctx *c, int32_t row, int32_t k) {
  if (k + 1 >= c->sched->unique_row_begin[row + 1]) return -1;
  const uattn_unique_block *u = &c->in->unique_blocks[k + 1];
  return u->block_start >= c->key_lo && u->block_start < c->key_hi ? u->block : -1;
}

/* Whether a decode call that takes m blocks, from position first_start in cache block first, takes cache block
 * `block` at block_start too (unique_run, shared_run): the next position, within the unit's keys, the
 * kernel's UATTN_DECODE_MAX_KEYS and MAX_DECODE_BLOCKS, on a cache whose rows the decode kernel reads from a
 * list of blocks (NHD, HND; uattn_decode_list_fits), or, at other block sizes, the next block of an NHD cache
 * (a run of adjacent blocks is one stretch of rows: uattn_decode_blocks). */
static bool joins_decode_call(const step_ctx *c, int32_t first_start, int32_t first, int32_t m, int32_t block_start,
                              int32_t block) {
  const int32_t bs = c->in->block_size;
  const bool list = c->cache.layout != UATTN_LAYOUT_TILED && uattn_decode_list_fits(bs);
  const bool run = c->cache.layout == UATTN_LAYOUT_NHD && block == first + m;
  return (list || run) && m < MAX_DECODE_BLOCKS && (m + 1) * bs <= UATTN_DECODE_MAX_KEYS &&
         block_start == first_start + m * bs && block_start < c->key_hi;
}

/* How many of the row's unique blocks from its k-th one decode call takes (joins_decode_call): those the row
 * sees whole but for the last, wherever they lie in the cache (at block sizes that take no list, adjacent NHD
 * blocks), up to UATTN_DECODE_MAX_KEYS keys. The decode
 * kernel's fixed cost a call (the query vectors and outputs put into its order and back, each vector's
 * softmax steps) is then paid once for them: on 16-key blocks it was a third of a call (uattn-bench
 * --block-size 16), and the kernel asks for the next block's rows as it nears them. Which blocks go together
 * depends on the block table alone, so the answer does not depend on the threads. Their cache blocks into ids
 * (MAX_DECODE_BLOCKS). */
static int32_t unique_run(const step_ctx *c, int32_t row, int32_t k, int32_t *ids) {
  const uattn_unique_block *u = c->in->unique_blocks;
  const int32_t bs = c->in->block_size, end = c->sched->unique_row_begin[row + 1];
  int32_t m = 1;
  ids[0] = u[k].block;
  while (k + m < end && joins_decode_call(c, u[k].block_start, u[k].block, m, u[k + m].block_start, u[k + m].block) &&
         context_usage(c, row, u[k + m].block_start - bs) == bs)
    ids[m] = u[k + m].block, m++;
  return m;
}

/* The keys a row sees of a run of `blocks` blocks from block_start (unique_run): the whole of all but the last. */
static int32_t run_usage(const step_ctx *c, int32_t row, int32_t block_start, int32_t blocks) {
  const int32_t bs = c->in->block_size;
  return (blocks - 1) * bs + context_usage(c, row, block_start + (blocks - 1) * bs);
}

/* The decode kernel on the row's unique blocks from its k-th, a run of them (unique_run) in one call; returns
 * how many it took. */
static int32_t decode_unique_run(const step_ctx *c, int32_t row, int32_t k) {
  const uattn_unique_block *u = &c->in->unique_blocks[k];
  int32_t ids[MAX_DECODE_BLOCKS];
  const int32_t blocks = unique_run(c, row, k, ids);
  c->w->visible[tile_slot(c, row)] = run_usage(c, row, u->block_start, blocks);
  decode_from_cache(c, ACC_UNIQUE, row, row + 1, ids, blocks, u->block_start, blocks * c->in->block_size, 1,
                    next_unique_block(c, row, k + blocks - 1));
  return blocks;
}

PART_FN void unique_part(const step_ctx *c) {
  const uattn_plan_info *in = c->in;
  const bool direct = decodes_from_cache(c);
  for (int32_t row = c->row0; row < c->row0 + c->rows; row++)
    for (int32_t k = c->sched->unique_row_begin[row]; k < c->sched->unique_row_begin[row + 1]; k++) {
      const uattn_unique_block *u = &in->unique_blocks[k];
      if (u->block_start < c->key_lo || u->block_start >= c->key_hi) continue;
      if (direct) {
        k += decode_unique_run(c, row, k) - 1;
        continue;
      }
      attend_rows(c, ACC_UNIQUE, row, row + 1, u->block, u->block_start, in->block_size, context_usage);
    }
}

/* Rows [row_lo, row_hi) of an all-heads unit (c: its first KV head's tile) against a cache block, or a run of
 * `blocks` of them (unique_run, shared_run), into `acc`: one decode call for the unit's heads, which reads the blocks'
 * rows in the cache's order. */
static void all_heads_block(const step_ctx *c, int acc, int32_t row_lo, int32_t row_hi, const int32_t *ids,
                            int32_t block_start, int32_t blocks, int32_t next_block) {
  if (row_lo < c->row0) row_lo = c->row0;
  if (row_hi > c->row0 + c->rows) row_hi = c->row0 + c->rows;
  int32_t keys = 0; /* the most any of the rows sees */
  for (int32_t row = row_lo; row < row_hi; row++) {
    const int32_t u = run_usage(c, row, block_start, blocks);
    c->w->visible[tile_slot(c, row)] = u; /* head 0's slots: every head's rows see the same keys */
    if (u > keys) keys = u;
  }
  if (keys > 0) decode_from_cache(c, acc, row_lo, row_hi, ids, blocks, block_start, keys, c->heads, next_block);
}

/* unique_run for the request's shared spans from its k-th (spans_by_req order, up to end): spans of the same
 * rows at the next positions, which the tile's rows see whole but for the last; their cache blocks into ids. */
static int32_t shared_run(const step_ctx *c, int32_t k, int32_t end, int32_t *ids) {
  const uattn_shared_span *spans = c->in->shared_spans;
  const int32_t *order = c->sched->spans_by_req, *blocks = c->in->shared_blocks, bs = c->in->block_size;
  const uattn_shared_span *a = &spans[order[k]];
  const int32_t row_lo = a->token_begin > c->row0 ? a->token_begin : c->row0,
                row_hi = a->token_end < c->row0 + c->rows ? a->token_end : c->row0 + c->rows;
  int32_t m = 1;
  ids[0] = blocks[a->shared_index];
  for (; k + m < end; m++) {
    const uattn_shared_span *b = &spans[order[k + m]];
    if (b->token_begin != a->token_begin || b->token_end != a->token_end ||
        !joins_decode_call(c, a->block_start, ids[0], m, b->block_start, blocks[b->shared_index]))
      break;
    bool whole = true;
    for (int32_t row = row_lo; row < row_hi && whole; row++) whole = context_usage(c, row, b->block_start - bs) == bs;
    if (!whole) break;
    ids[m] = blocks[b->shared_index];
  }
  return m;
}

/* The shared and unique parts of an all-heads unit (c: its first KV head's tile). */
PART_FN void shared_part_all_heads(const step_ctx *c) {
  const uattn_plan_info *in = c->in;
  const int32_t *order = c->sched->spans_by_req, end = c->sched->span_req_begin[c->req + 1];
  for (int32_t k = c->sched->span_req_begin[c->req]; k < end; k++) {
    const uattn_shared_span *sp = &in->shared_spans[order[k]];
    if (sp->block_start < c->key_lo || sp->block_start >= c->key_hi) continue;
    int32_t ids[MAX_DECODE_BLOCKS];
    const int32_t blocks = shared_run(c, k, end, ids);
    const uattn_shared_span *next = k + blocks < end ? &in->shared_spans[order[k + blocks]] : NULL;
    const bool ahead = next && next->block_start >= c->key_lo && next->block_start < c->key_hi;
    all_heads_block(c, ACC_SHARED, sp->token_begin, sp->token_end, ids, sp->block_start, blocks,
                    ahead ? in->shared_blocks[next->shared_index] : -1);
    k += blocks - 1;
  }
}

PART_FN void unique_part_all_heads(const step_ctx *c) {
  const uattn_plan_info *in = c->in;
  for (int32_t row = c->row0; row < c->row0 + c->rows; row++)
    for (int32_t k = c->sched->unique_row_begin[row]; k < c->sched->unique_row_begin[row + 1]; k++) {
      const uattn_unique_block *u = &in->unique_blocks[k];
      if (u->block_start < c->key_lo || u->block_start >= c->key_hi) continue;
      int32_t ids[MAX_DECODE_BLOCKS];
      const int32_t blocks = unique_run(c, row, k, ids);
      all_heads_block(c, ACC_UNIQUE, row, row + 1, ids, u->block_start, blocks,
                      next_unique_block(c, row, k + blocks - 1));
      k += blocks - 1;
    }
}

/* The encoder keys of the tile's request in the caches: all of them, or with context parallelism the
 * rank's share (uattn.h: encoder_lens are global, the cross block table the rank's own). */
static int32_t encoder_keys(const step_ctx *c) {
  const int32_t len = c->t->cross->encoder_lens[c->req];
  return c->cp ? uattn_cp_local_len(c->cp, len) : len;
}

static int32_t cross_usage(const step_ctx *c, int32_t row, int32_t block_start) {
  (void)row;
  const int32_t u = encoder_keys(c) - block_start;
  return u > c->in->block_size ? c->in->block_size : u;
}

/* Cross attention: every encoder key, through the cross block table, into the shared part. */
PART_FN void cross_part(const step_ctx *c) {
  const uattn_cross *x = c->t->cross;
  const int32_t bs = c->in->block_size, len = encoder_keys(c);
  for (int32_t b = 0; b * bs < len; b++) {
    const int32_t block = x->block_table[(int64_t)c->req * x->block_table_stride + b];
    attend_rows(c, ACC_SHARED, c->row0, c->row0 + c->rows, block, b * bs, len - b * bs < bs ? len - b * bs : bs,
                cross_usage);
  }
}

/* Moves the parts that saw a key to the front and returns their count. A part that saw none is as reset_acc
 * left it (m -inf, l 0, o 0): the seed's merge adds 0 to every sum for it, so leaving it out changes no bit,
 * and it skips an expf of -FLT_MAX - M, libm's slow underflow path. In a prefill only the causal part sees
 * keys: the merge's time per row drops to a third. */
static int32_t seen_parts(uattn_state *parts, int32_t n) {
  int32_t k = 0;
  for (int32_t i = 0; i < n; i++)
    if (part_seen(&parts[i])) parts[k++] = parts[i];
  return k;
}

/* Rows ahead of the one converted whose query or output vectors are asked for (prefetch_vectors). */
#define ROWS_AHEAD 8

/* Asks for a row's `bytes` of query (rw 0) or output (rw 1) vectors from p on, whole lines. A tile reads the
 * vectors of one KV head's group in every row: a few lines of every Hq * D elements, far apart, which the
 * hardware prefetchers do not follow, and cold at the tile's start. Asked for ROWS_AHEAD rows before their
 * turn, their misses overlap (prefill 2048 on one Zen 4 core, perf record: the two conversions 2.5% of the
 * kernel's samples before, 1.0% after). */
#define prefetch_vectors(p, bytes, rw)                                                                                 \
  do {                                                                                                                 \
    const char *at_ = (const char *)(p);                                                                               \
    for (size_t b_ = 0; b_ < (bytes); b_ += 64) __builtin_prefetch(at_ + b_, rw, 3);                                   \
  } while (0)

/* Merges the tile's three parts into out and lse. */
PART_FN void merge_tile(const step_ctx *c) {
  const uattn_layer *L = c->L;
  const int32_t D = L->head_dim, Hq = L->num_q_heads;
  const uattn_dtype odt = out_dtype(L, c->t);
  const size_t osz = uattn_dtype_size(odt);
  float row_out[UATTN_MAX_HEAD_DIM];
  for (int32_t i = 0; i < c->rows; i++) {
    if (i + ROWS_AHEAD < c->rows)
      prefetch_vectors(
          (char *)c->t->out + ((size_t)(c->row0 + i + ROWS_AHEAD) * Hq + (size_t)c->kv_head * c->w->group) * D * osz,
          (size_t)c->w->group * D * osz, 1);
    for (int32_t g = 0; g < c->w->group; g++) {
      const int32_t h = c->kv_head * c->w->group + g, row = c->row0 + i, x = c->slot + i;
      uattn_state parts[3] = {acc_state(c->w, ACC_CAUSAL, x, g, D), acc_state(c->w, ACC_SHARED, x, g, D),
                              acc_state(c->w, ACC_UNIQUE, x, g, D)};
      fold_v_scale(L, parts, 3); /* the tile is done with them: scaled in place */
      const float lse = uattn_seed_merge(parts, seen_parts(parts, 3), L->sinks ? L->sinks[h] : -INFINITY, D, row_out);
      uattn_narrow(odt, row_out, (char *)c->t->out + ((size_t)row * Hq + h) * D * osz, (size_t)D);
      if (c->t->lse) c->t->lse[(size_t)row * Hq + h] = lse;
    }
  }
}

/* ---- the call ---------------------------------------------------------------------------------------- */

/* One forward call, shared by its workers. Work units are (item, piece, KV head) triples, handed out
 * largest item first (an item is a request, or a prefix run of decodes: plan/schedule.h); an item's pieces
 * are its splits (a long decode's key ranges) or its row tiles (a prompt of more than one tile, each tile
 * a unit: a prefill on one KV head, an MQA model's or a tensor-parallel rank's, no longer runs on one
 * worker). A unit writes only its own rows and heads, or, for a split, its own slot of partial states,
 * which a second pass merges in split order. Items and splits are the plan's, and each tile computes
 * alone (its states cleared, its rows merged into out at its end) as it did in its item's loop, so the
 * answer does not depend on which worker runs a unit, or on how many workers there are. */
typedef struct forward_job {
  uattn_schedule sched;
  const uattn_layer *L;
  const uattn_tensors *t;
  uattn_runtime *rt;
  cache_view cache;
  workspace shape;
  size_t scratch_bytes; /* a worker's workspace */
  size_t split_floats;  /* one (row, split) slot a KV head: [group][shared, unique][m, l, o[D]] */
  float *splits;        /* all split slots, after worker 0's workspace */
  /* NUMA: KV head g belongs to node g % num_nodes; a worker takes its node's units first, then helps the
   * others, so on a multi-node machine each node mostly reads its own heads. One node: one queue. */
  int32_t num_nodes;
  atomic_int node_next[UATTN_MAX_NODES];
  atomic_int next_unit;
  atomic_int out_of_memory;
  atomic_llong part_calls[UATTN_NUM_PARTS], decode_calls[UATTN_NUM_PARTS];
  int32_t max_workers;  /* workers that take units (a tuning file may ask for fewer than the runtime has) */
  int32_t head_group;   /* KV heads an all-heads unit takes (all_heads_group) */
  int32_t *piece_begin; /* [num_items + 1]: item pos's pieces are [piece_begin[pos], piece_begin[pos + 1]) */
  size_t step_kv_bytes; /* of step_kv (step_kv_bytes), 0 when the causal part reads k and v themselves */
  char *step_kv;        /* in worker 0's scratch: [2][T][Hkv][D] in the cache dtype, or NULL */
} forward_job;

static size_t split_state_floats(int32_t D) { return (size_t)D + 2; }

/* Unit j of node n's queue: the split index and the n-th share of the KV heads. Returns -1 past its end. */
static int32_t node_unit(const forward_job *job, int32_t node, int32_t j) {
  const int32_t Hkv = job->L->num_kv_heads, n = job->num_nodes;
  const int32_t heads = Hkv / n + (node < Hkv % n); /* g = node, node + n, ... */
  if (heads == 0 || j >= job->piece_begin[job->sched.num_items] * heads) return -1;
  return (j / heads) * Hkv + node + (j % heads) * n;
}

/* The partial state of (head, accumulator: 0 shared, 1 unique) in a (row, split) slot. */
static float *split_slot_at(const forward_job *job, int32_t slot, int32_t kv_head, int32_t head, int acc) {
  return job->splits + ((size_t)slot * job->L->num_kv_heads + kv_head) * job->split_floats +
         ((size_t)head * 2 + acc) * split_state_floats(job->L->head_dim);
}

static uattn_state split_state(const forward_job *job, int32_t slot, int32_t kv_head, int32_t head, int acc) {
  float *x = split_slot_at(job, slot, kv_head, head, acc);
  uattn_state s = {x[0], x[1], x + 2};
  return s;
}

static void store_split_state(const forward_job *job, int32_t slot, int32_t kv_head, int32_t head, int acc,
                              const uattn_state *st) {
  float *x = split_slot_at(job, slot, kv_head, head, acc);
  x[0] = st->m;
  x[1] = st->l;
}

/* First pass: every worker gets its scratch before anything is written, so a failure changes nothing.
 * Worker 0's also holds the split slots, which every worker writes, piece_begin and step_kv. Each worker reserves
 * its own (a fresh page is first touched on its NUMA node), in a run of its own only where one must grow
 * (other_scratch_fits): otherwise the caller, worker 0, reserves its own alone, and sleeping workers are not
 * woken for nothing (tens of microseconds a forward on a VM). */
static void reserve_scratch(void *ctx, int32_t worker, int32_t num_workers) {
  (void)num_workers;
  forward_job *job = ctx;
  const size_t slots = (size_t)job->sched.split_slot[job->sched.num_items] * job->L->num_kv_heads;
  const size_t split_bytes = slots * job->split_floats * sizeof(float);
  const size_t begin_bytes = (sizeof(int32_t) * ((size_t)job->sched.num_items + 1) + 63) & ~(size_t)63;
  const size_t bytes = job->scratch_bytes + (worker == 0 ? split_bytes + begin_bytes + job->step_kv_bytes : 0);
  char *p = uattn_worker_scratch(job->rt, worker, bytes);
  if (!p) {
    atomic_store(&job->out_of_memory, 1);
  } else if (worker == 0) {
    job->splits = (float *)(p + job->scratch_bytes);
    job->piece_begin = (int32_t *)(p + job->scratch_bytes + split_bytes);
    job->step_kv = job->step_kv_bytes ? p + job->scratch_bytes + split_bytes + begin_bytes : NULL;
  }
}

/* Whether every worker but the caller already has its scratch (reserve_scratch would not grow it). */
static bool other_scratch_fits(const forward_job *job) {
  for (int32_t w = 1; w < uattn_runtime_workers(job->rt); w++)
    if (!uattn_worker_scratch_fits(job->rt, w, job->scratch_bytes)) return false;
  return true;
}

/* The tile's queries in its slots, times cache_score_scale's scale (every part's). */
static void widen_queries(const forward_job *job, const step_ctx *c) {
  const uattn_layer *L = job->L;
  const float scale = cache_score_scale(L);
  workspace *w = c->w;
  const int32_t D = L->head_dim, Hq = L->num_q_heads;
  const size_t qsz = uattn_dtype_size(L->dtype), group_bytes = (size_t)w->group * D * qsz;
  for (int32_t i = 0; i < c->rows; i++) {
    if (i + ROWS_AHEAD < c->rows)
      prefetch_vectors(
          (const char *)job->t->q + ((size_t)(c->row0 + i + ROWS_AHEAD) * Hq + (size_t)c->kv_head * w->group) * D * qsz,
          group_bytes, 0);
    for (int32_t h = 0; h < w->group; h++) {
      float *q = w->q + ((size_t)(c->slot + i) * w->group + h) * D;
      const size_t at = ((size_t)(c->row0 + i) * Hq + (size_t)c->kv_head * w->group + h) * D * qsz;
      uattn_widen(L->dtype, (const char *)job->t->q + at, q, (size_t)D);
      /* the seed scales the query; a bf16 set scales its scores instead (uattn_kernels.unscaled_q) */
      if (!w->kern->unscaled_q)
        for (int32_t d = 0; d < D; d++) q[d] *= scale;
    }
  }
}

/* Under context parallelism outside pieces, the query position the kernels get for a row at global position
 * pos (the header comment): with a window W the kernel sees local keys from query - W + 1 on, which must be
 * the first local key past pos - W; without one (and without ALiBi) the kernels do not read it. */
static int32_t local_query_pos(const step_ctx *c, int32_t pos) {
  const int32_t W = c->L->attn_type == UATTN_ATTENTION_DECODER ? c->L->sliding_window : 0;
  return W > 0 ? uattn_cp_local_len(c->cp, pos - W + 1 > 0 ? pos - W + 1 : 0) + W - 1 : pos;
}

/* The tile's scaled queries in its slots (widen_queries), and its partial states cleared: the outputs of the
 * cache parts only when the tile reads the cache (reads_cache). A prompt with nothing cached
 * runs the causal part alone; clearing the other three parts' outputs (3 MB for a 512-row tile at GQA 4,
 * head dim 128) had been about 0.7% of prefill 2048 on one core. */
static void begin_tile(const forward_job *job, const step_ctx *c, bool reads_cache) {
  widen_queries(job, c);
  if (c->cp && !c->pieces)
    for (int32_t i = 0; i < c->rows; i++)
      c->w->query_pos[c->slot + i] = local_query_pos(c, c->in->token_positions[c->row0 + i]);
  for (int acc = 0; acc < NUM_ACCS; acc++)
    reset_acc(c->w, acc, c->slot, c->rows, job->L->head_dim, acc == ACC_CAUSAL || reads_cache);
}

/* The tile's rows done: merged into out, or, in a split unit, its shared and unique states kept in the
 * split's slots for the merge pass. */
static void end_tile(const forward_job *job, const step_ctx *c, int32_t pos, int32_t split) {
  const uattn_schedule *sched = &job->sched;
  if (sched->split_begin[pos + 1] - sched->split_begin[pos] <= 1) {
    merge_tile(c);
    return;
  }
  const int32_t D = job->L->head_dim;
  const int32_t slot = sched->split_slot[pos] + split * (c->qe - c->qs) + (c->row0 - c->qs); /* of row0 */
  for (int32_t i = 0; i < c->rows; i++)
    for (int32_t h = 0; h < c->w->group; h++)
      for (int acc = 0; acc < 2; acc++) {
        const uattn_state from = acc_state(c->w, acc == 0 ? ACC_SHARED : ACC_UNIQUE, c->slot + i, h, D);
        uattn_state to = split_state(job, slot + i, c->kv_head, h, acc);
        memcpy(to.o, from.o, sizeof(float) * (size_t)D);
        store_split_state(job, slot + i, c->kv_head, h, acc, &from);
      }
}

/* The tile of rows [row0, row0 + rows) of the item's requests [first, end) (rows [qs, qe)) on KV head g; a
 * split unit covers keys [split * split_keys, (split + 1) * split_keys) of its one request's context. */
static step_ctx tile_ctx(const forward_job *job, workspace *w, int32_t pos, int32_t g, int32_t split, int32_t first,
                         int32_t end, int32_t row0, int32_t rows, int32_t slot) {
  const uattn_schedule *sched = &job->sched;
  const uattn_plan_info *in = sched->info;
  step_ctx c = {.sched = sched,
                .in = in,
                .L = job->L,
                .t = job->t,
                .cache = job->cache,
                .w = w,
                .kv_head = g,
                .req = first,
                .row0 = row0,
                .rows = rows,
                .slot = slot,
                .qs = in->query_start_loc[first],
                .qe = in->query_start_loc[end],
                .num_computed = uattn_cp_local_len(sched->config, in->token_positions[in->query_start_loc[first]]),
                .key_lo = 0,
                .key_hi = INT32_MAX,
                .heads = 1,
                .step_k = job->step_kv ? job->step_kv : (const char *)job->t->k,
                .step_v = job->step_kv ? job->step_kv + job->step_kv_bytes / 2 : (const char *)job->t->v,
                .step_dtype = job->step_kv ? job->L->cache_dtype : job->L->dtype,
                .cp = sched->config->cp_size > 1 ? sched->config : NULL};
  c.pieces = c.cp && job->L->alibi_slopes;
  if (sched->split_begin[pos + 1] - sched->split_begin[pos] > 1)
    c.key_lo = split * sched->split_keys, c.key_hi = c.key_lo + sched->split_keys;
  return c;
}

/* Rows of the item's requests [first, end) on KV head g: the tile of rows from qs + tile * w->tile, or with
 * tile -1 every tile in turn. */
static void run_rows(forward_job *job, workspace *w, int32_t pos, int32_t g, int32_t split, int32_t first, int32_t end,
                     int32_t tile) {
  const uattn_plan_info *in = job->sched.info;
  const uattn_layer *L = job->L;
  const int32_t qs = in->query_start_loc[first], qe = in->query_start_loc[end];
  const bool causal = end - first == 1 && reads_step_keys(in, L, first); /* whether causal_part reads keys */
  const int32_t from = tile < 0 ? qs : qs + tile * w->tile, to = tile < 0 ? qe : from + 1;
  for (int32_t row0 = from; row0 < to; row0 += w->tile) {
    const step_ctx c = tile_ctx(job, w, pos, g, split, first, end, row0, qe - row0 < w->tile ? qe - row0 : w->tile, 0);
    begin_tile(job, &c, !causal || c.num_computed > 0);
    if (L->attn_type == UATTN_ATTENTION_ENCODER_DECODER) {
      cross_part(&c);
    } else if (end - first > 1) { /* a prefix run: no causal part */
      shared_part_prefix_run(&c, first, end);
      unique_part(&c);
    } else {
      causal_part(&c); /* split units are decodes: nothing to do here */
      shared_part(&c);
      unique_part(&c);
    }
    end_tile(job, &c, pos, split);
  }
}

/* A decode or a short verification (request r, its rows all reading the cache) on a cache of several heads,
 * the KV heads [g0, g0 + head_group) in one unit (every head, unless the step has few units: all_heads_group),
 * head g's rows from slot g * rows. Each block (on NHD each run of blocks that follow each other in the
 * cache: unique_run, shared_run) goes through one decode call for the unit's heads, which reads it in address
 * order (an NHD row holds every head, where a unit of one head would read 256 bytes of every 2 KB row; a TILED
 * tile every head in turn), or on HND one call a head, head after head (decode_hnd_heads); the decode kernel
 * takes them straight from the cache, without panels. */
static void run_all_heads(forward_job *job, workspace *w, int32_t pos, int32_t split, int32_t r, int32_t g0) {
  const uattn_plan_info *in = job->sched.info;
  const int32_t g1 = g0 + job->head_group, row0 = in->query_start_loc[r], rows = in->query_start_loc[r + 1] - row0;
  for (int32_t g = g0; g < g1; g++) {
    const step_ctx c = tile_ctx(job, w, pos, g, split, r, r + 1, row0, rows, g * rows);
    begin_tile(job, &c, true); /* cache-only rows */
  }
  step_ctx c0 = tile_ctx(job, w, pos, g0, split, r, r + 1, row0, rows, g0 * rows);
  c0.heads = job->head_group;
  shared_part_all_heads(&c0);
  unique_part_all_heads(&c0);
  for (int32_t g = g0; g < g1; g++) {
    const step_ctx c = tile_ctx(job, w, pos, g, split, r, r + 1, row0, rows, g * rows);
    end_tile(job, &c, pos, split);
  }
}

/* Whether an item runs as one all-heads unit (run_all_heads): one request that reads only the cache
 * (a decode, a verification), of at most all_heads_max_rows rows. */
static bool all_heads_item(const forward_job *job, int32_t pos) {
  const uattn_plan_info *in = job->sched.info;
  const uattn_layer *L = job->L;
  const int32_t r = job->sched.item_first[pos], rows = in->query_start_loc[r + 1] - in->query_start_loc[r];
  const bool pieces = job->sched.config->cp_size > 1 && L->alibi_slopes; /* step_ctx.pieces */
  return L->attn_type == UATTN_ATTENTION_DECODER && !pieces && all_heads_layout(L, job->shape.kern, in->block_size) &&
         job->sched.item_reqs[pos] == 1 && !in->is_prompt[r] && rows <= all_heads_max_rows(L) &&
         rows * L->num_kv_heads <= job->shape.slots;
}

/* The row tiles of item pos that are units of their own: a lone request's (a prompt longer than a tile,
 * or any request under a causal width below its rows); 1 for an all-heads item and for a prefix run, whose
 * unit takes its tiles in turn. */
static int32_t item_tiles(const forward_job *job, int32_t pos) {
  if (job->sched.item_reqs[pos] != 1 || all_heads_item(job, pos)) return 1;
  const uattn_plan_info *in = job->sched.info;
  const int32_t r = job->sched.item_first[pos], rows = in->query_start_loc[r + 1] - in->query_start_loc[r];
  return rows > job->shape.tile ? (rows + job->shape.tile - 1) / job->shape.tile : 1;
}

/* Item pos's pieces: its splits times its tiles (both above 1 only where a causal width below a split
 * decode's few rows tiles it). */
static int32_t item_pieces(const forward_job *job, int32_t pos) {
  return (job->sched.split_begin[pos + 1] - job->sched.split_begin[pos]) * item_tiles(job, pos);
}

/* The step's (item, piece) pairs that run as all-heads units (*all), and its other units, one a KV head
 * (*other). */
static void count_units(const forward_job *job, int32_t *all, int32_t *other) {
  *all = *other = 0;
  for (int32_t pos = 0; pos < job->sched.num_items; pos++) {
    if (all_heads_item(job, pos))
      *all += item_pieces(job, pos);
    else
      *other += item_pieces(job, pos) * job->L->num_kv_heads;
  }
}

/* The KV heads an all-heads unit takes: all of them, or where the step's units would be fewer than the
 * workers (one long decode's splits on a many-core machine, a lone decode on two), the largest divisor of
 * the heads that makes enough of them (a lone 4k decode on two workers of a Zen 5 VM, uattn-bench
 * decode-short, NHD, 8 KV heads: 0.87 ms as one unit, 0.63 as four units of two heads, 0.56 as two of
 * four). Each head's arithmetic is the same whichever heads a decode call takes with it, so the answer does
 * not depend on the workers here either. */
static int32_t all_heads_group(const forward_job *job) {
  const int32_t Hkv = job->L->num_kv_heads, want = job->max_workers;
  int32_t all, other;
  count_units(job, &all, &other);
  if (job->max_workers <= 1 || all == 0) return Hkv;
  for (int32_t h = Hkv; h > 1; h--)
    if (Hkv % h == 0 && other + all * (Hkv / h) >= want) return h;
  return 1;
}

/* The units of the attention pass that do work (an all-heads unit's other heads' are empty). */
static int32_t working_units(const forward_job *job) {
  int32_t all, other;
  count_units(job, &all, &other);
  return other + all * (job->L->num_kv_heads / job->head_group);
}

/* Unit u: the item's position (by cost), the KV head, and the split and tile it stands for (tile -1: the
 * item's every tile). An item's last tile, the one that sees the most keys, goes first. */
static void unit_of(const forward_job *job, int32_t u, int32_t *pos, int32_t *kv_head, int32_t *split, int32_t *tile) {
  const int32_t *begin = job->piece_begin, x = u / job->L->num_kv_heads;
  int32_t lo = 0, hi = job->sched.num_items; /* the last pos with begin[pos] <= x */
  while (hi - lo > 1) {
    const int32_t mid = (lo + hi) / 2;
    if (begin[mid] <= x)
      lo = mid;
    else
      hi = mid;
  }
  const int32_t tiles = item_tiles(job, lo), piece = x - begin[lo];
  *pos = lo;
  *kv_head = u % job->L->num_kv_heads;
  *split = piece / tiles;
  *tile = tiles > 1 ? tiles - 1 - piece % tiles : -1;
}

static void run_unit(forward_job *job, workspace *w, int32_t unit) {
  const uattn_schedule *sched = &job->sched;
  int32_t pos, g, split, tile;
  unit_of(job, unit, &pos, &g, &split, &tile);
  const int32_t first = sched->item_first[pos], end = first + sched->item_reqs[pos];
  if (all_heads_item(job, pos)) {
    if (g % job->head_group == 0) run_all_heads(job, w, pos, split, first, g); /* the group's other units: here */
    return;
  }
  if (job->L->attn_type == UATTN_ATTENTION_DECODER) {
    run_rows(job, w, pos, g, split, first, end, tile);
    return;
  }
  /* groups serve decoder self-attention; other types take the group's requests one at a time */
  for (int32_t r = first; r < end; r++) run_rows(job, w, pos, g, split, r, r + 1, tile);
}

static void attention_job(void *ctx, int32_t worker, int32_t num_workers) {
  (void)num_workers;
  forward_job *job = ctx;
  if (worker >= job->max_workers) return;
  workspace w = job->shape;
  workspace_carve(&w, uattn_worker_scratch(job->rt, worker, job->scratch_bytes), job->L->head_dim);
  int32_t nodes;
  const int32_t home = uattn_worker_node(job->rt, worker, &nodes);
  for (int32_t k = 0; k < job->num_nodes; k++) { /* home first, then the others */
    const int32_t node = (home + k) % job->num_nodes;
    for (;;) {
      const int32_t unit = node_unit(job, node, atomic_fetch_add(&job->node_next[node], 1));
      if (unit < 0) break;
      run_unit(job, &w, unit);
    }
  }
  for (int p = 0; p < UATTN_NUM_PARTS; p++) {
    atomic_fetch_add(&job->part_calls[p], w.calls[p]);
    atomic_fetch_add(&job->decode_calls[p], w.decode_calls[p]);
  }
}

/* The merge pass over split requests: each (request, KV head) folds its splits in split order, then the
 * seed's merge writes the rows. */
static void merge_splits_job(void *ctx, int32_t worker, int32_t num_workers) {
  (void)worker, (void)num_workers;
  forward_job *job = ctx;
  const uattn_schedule *sched = &job->sched;
  const uattn_plan_info *in = sched->info;
  const uattn_layer *L = job->L;
  const int32_t D = L->head_dim, Hq = L->num_q_heads, G = job->shape.group;
  static const float zeros[UATTN_MAX_HEAD_DIM];
  float row_out[UATTN_MAX_HEAD_DIM];
  for (;;) {
    const int32_t unit = atomic_fetch_add(&job->next_unit, 1);
    if (unit >= sched->num_items * L->num_kv_heads) break;
    const int32_t pos = unit / L->num_kv_heads, g = unit % L->num_kv_heads;
    const int32_t splits = sched->split_begin[pos + 1] - sched->split_begin[pos];
    if (splits <= 1) continue;
    const int32_t r = sched->item_first[pos], qs = in->query_start_loc[r], slot0 = sched->split_slot[pos];
    const int32_t rows = in->query_start_loc[r + 1] - qs;
    for (int32_t row = qs; row < in->query_start_loc[r + 1]; row++)
      for (int32_t h = 0; h < G; h++) {
        uattn_state parts[3];
        parts[0] = (uattn_state){-INFINITY, 0.0f, (float *)zeros}; /* a decode has no causal part */
        for (int acc = 0; acc < 2; acc++) {
          parts[1 + acc] = split_state(job, slot0 + (row - qs), g, h, acc);
          for (int32_t sp = 1; sp < splits; sp++) {
            const uattn_state b = split_state(job, slot0 + sp * rows + (row - qs), g, h, acc);
            uattn_state_merge(&parts[1 + acc], &b, D);
          }
        }
        fold_v_scale(L, parts + 1, 2); /* split 0's slots, read once: scaled in place */
        const int32_t head = g * G + h;
        const float lse =
            uattn_seed_merge(parts, seen_parts(parts, 3), L->sinks ? L->sinks[head] : -INFINITY, D, row_out);
        const uattn_dtype odt = out_dtype(L, job->t);
        uattn_narrow(odt, row_out, (char *)job->t->out + ((size_t)row * Hq + head) * D * uattn_dtype_size(odt),
                     (size_t)D);
        if (job->t->lse) job->t->lse[(size_t)row * Hq + head] = lse;
      }
  }
}

uattn_status uattn_forward(const uattn_plan *plan, const uattn_layer *L, const uattn_tensors *t, uattn_runtime *rt) {
  uattn_clear_error();
  uattn_schedule sched;
  uattn_status st;
  if ((st = uattn_plan_schedule(plan, &sched))) return st;
  UATTN_CHECK_PTR(L, "layer");
  UATTN_CHECK_PTR(t, "tensors");
  if ((st = validate_layer(L))) return st;
  const uattn_plan_info *in = sched.info;
  if ((st = validate_tensors(in, sched.config, L, t))) return st;
  /* the runtime's tuning file fills what the layer leaves to the defaults (its values were checked when
   * the file was loaded) */
  uattn_layer tuned = *L;
  if (sched.config->cp_rank > 0) tuned.sinks = NULL; /* a sink is counted once over the ranks: by rank 0 */
  const uattn_tuning_entry *tuning = uattn_tuning_find(rt, t->block_size, L->head_dim, L->cache_dtype);
  if (tuning) {
    if (!tuned.causal_width) tuned.causal_width = tuning->query_tile;
    if (!tuned.chunk_size) tuned.chunk_size = tuning->chunk_size;
  }
  L = &tuned;
  const uattn_kernel_choice *choice = uattn_kernel_choice_for(L, t->block_size);
  const uattn_kernels *kernels = choice->set;
  uattn_kernel_report report = choice->report;
  if (in->num_tokens == 0) {
    uattn_kernel_report_keep(&report);
    return UATTN_OK;
  }

  forward_job job = {.sched = sched,
                     .L = L,
                     .t = t,
                     .rt = rt,
                     .cache = {t->key_cache, t->value_cache, L->cache_dtype, L->kv_layout, t->block_size,
                               L->num_kv_heads, L->head_dim}};
  workspace_shape(&job.shape, in, L, kernels, sched.config->cp_size > 1);
  job.scratch_bytes = workspace_bytes(&job.shape, L->head_dim);
  job.split_floats = (size_t)job.shape.group * 2 * split_state_floats(L->head_dim);
  job.step_kv_bytes = step_kv_bytes(in, L);
  job.max_workers = uattn_runtime_workers(rt);
  if (tuning && tuning->num_threads > 0 && tuning->num_threads < job.max_workers) job.max_workers = tuning->num_threads;
  job.head_group = all_heads_group(&job);
  atomic_init(&job.next_unit, 0);
  uattn_worker_node(rt, 0, &job.num_nodes);
  if (job.num_nodes > UATTN_MAX_NODES) job.num_nodes = UATTN_MAX_NODES;
  for (int32_t n = 0; n < UATTN_MAX_NODES; n++) atomic_init(&job.node_next[n], 0);
  for (int p = 0; p < UATTN_NUM_PARTS; p++) atomic_init(&job.part_calls[p], 0), atomic_init(&job.decode_calls[p], 0);
  atomic_init(&job.out_of_memory, 0);
  /* The passes share the workers' scratch (the split slots live in worker 0's): no other engine thread's
   * forward may run on rt between them. */
  const bool held = uattn_runtime_hold(rt);
  if (other_scratch_fits(&job))
    uattn_runtime_run_alone(rt, reserve_scratch, &job); /* worker 0 is this thread */
  else
    uattn_runtime_run(rt, reserve_scratch, &job);
  if (atomic_load(&job.out_of_memory)) {
    uattn_runtime_release(rt, held);
    return uattn_fail(UATTN_ERR_NO_MEMORY, "out of memory for the forward's workspace (%zu bytes a worker)",
                      job.scratch_bytes);
  }

  job.piece_begin[0] = 0;
  for (int32_t pos = 0; pos < sched.num_items; pos++)
    job.piece_begin[pos + 1] = job.piece_begin[pos] + item_pieces(&job, pos);
  /* the cache first: a decode row reads its own new key back from it, the causal part step_kv */
  if (L->attn_type != UATTN_ATTENTION_ENCODER_DECODER) write_cache(in, L, t, &job.cache, job.step_kv);
  if (working_units(&job) <= 1)
    uattn_runtime_run_alone(rt, attention_job, &job);
  else
    uattn_runtime_run(rt, attention_job, &job);
  if (sched.split_slot[sched.num_items] > 0) {
    atomic_store(&job.next_unit, 0);
    uattn_runtime_run(rt, merge_splits_job, &job);
  }
  uattn_runtime_release(rt, held);
  for (int p = 0; p < UATTN_NUM_PARTS; p++) {
    report.part_calls[p] = atomic_load(&job.part_calls[p]);
    report.decode_calls[p] = atomic_load(&job.decode_calls[p]);
  }
  report.workspace_bytes = job.scratch_bytes;
  report.workers = job.max_workers;
  uattn_kernel_report_keep(&report);
  return UATTN_OK;
}

uattn_status uattn_describe_kernels(const uattn_layer *layer, int32_t block_size, uattn_kernel_report *out) {
  uattn_clear_error();
  UATTN_CHECK_PTR(layer, "layer");
  UATTN_CHECK_PTR(out, "out");
  uattn_status st;
  if ((st = validate_layer(layer))) return st;
  if (block_size <= 0) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "block_size = %d must be > 0", block_size);
  *out = uattn_kernel_choice_for(layer, block_size)->report;
  return UATTN_OK;
}
