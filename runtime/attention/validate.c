/* The checks of a forward call's input, before anything is written: the layer (its shapes, dtypes, scales
 * and features), and the tensors against the plan (their sizes, buffers, and every cache block the step
 * writes or reads). A refused call leaves the caches, out and lse untouched, and its message says what to
 * change. */
#include <math.h>

#include "attention/forward_internal.h"

uattn_status uattn_validate_layer(const uattn_layer *L) {
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
  if (L->head_dim_v < 0 || L->head_dim_v > UATTN_MAX_HEAD_DIM)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "layer: head_dim_v = %d must be in 0..%d (0: head_dim)",
                      L->head_dim_v, UATTN_MAX_HEAD_DIM);
  if (L->kv_latent && (L->head_dim_v <= 0 || L->head_dim_v > L->head_dim))
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                      "layer: kv_latent reads each value as the first head_dim_v dims of its key, so head_dim_v (%d) "
                      "must be in 1..head_dim (%d)",
                      L->head_dim_v, L->head_dim);
  if (L->kv_latent && L->kv_layout == UATTN_LAYOUT_TILED)
    return uattn_fail(UATTN_ERR_UNSUPPORTED,
                      "layer: a kv_latent cache holds keys alone, which a TILED cache does not lay out as values: use "
                      "NHD or HND");
  if (L->kv_latent && uattn_dtype_is_fp8(L->cache_dtype) && L->v_scale != L->k_scale)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                      "layer: kv_latent's values are its keys' bytes, read with k_scale, so v_scale (%g) must equal "
                      "k_scale (%g)",
                      (double)L->v_scale, (double)L->k_scale);
  if (!uattn_dtype_valid(L->dtype) || !uattn_dtype_valid(L->cache_dtype))
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "layer: dtype %d / cache_dtype %d is not a uattn_dtype",
                      (int)L->dtype, (int)L->cache_dtype);
  if (uattn_dtype_is_fp8(L->dtype))
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                      "layer: dtype %s is for KV caches only (cache_dtype): q, k, v and out are f32, bf16 or f16",
                      uattn_dtype_name(L->dtype));
  /* scale * k_scale is the cache parts' score scale (forward_internal.h: cache_score_scale), so it must be
   * finite too */
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

uattn_status uattn_validate_tensors(const uattn_plan_info *in, const uattn_plan_config *pc, const uattn_layer *L,
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
  const head_dims dims = layer_dims(L);
  if (!size_fits(uattn_dtype_size(L->cache_dtype), t->num_blocks, t->block_size, L->num_kv_heads, dims.kernel))
    return uattn_fail(UATTN_ERR_OVERFLOW,
                      "tensors: a cache of num_blocks %d x block_size %d x num_kv_heads %d x %d-dim rows "
                      "overflows a size_t",
                      t->num_blocks, t->block_size, L->num_kv_heads, dims.kernel);
  if (!size_fits(sizeof(float), in->num_tokens, L->num_q_heads, dims.kernel, 1))
    return uattn_fail(UATTN_ERR_OVERFLOW,
                      "tensors: q and out of num_tokens %d x num_q_heads %d x %d dims overflow a size_t",
                      in->num_tokens, L->num_q_heads, dims.kernel);
  /* a latent's values are its keys: a value cache or v given with one is a mix-up the call must not guess at */
  if (L->kv_latent && (t->value_cache || (t->v && !cross)))
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                      "tensors: a kv_latent layer's values are the first head_dim_v dims of its keys, so "
                      "tensors.value_cache and tensors.v must be NULL");
  uattn_status st;
  if ((st = check_buffer(t->key_cache, L->cache_dtype, "tensors.key_cache")) ||
      (!L->kv_latent && (st = check_buffer(t->value_cache, L->cache_dtype, "tensors.value_cache"))))
    return st;
  if (in->num_tokens == 0) return UATTN_OK;
  if ((st = check_buffer(t->q, L->dtype, "tensors.q")) || (st = check_buffer(t->out, out_dtype(L, t), "tensors.out")))
    return st;
  if (!cross && ((st = check_buffer(t->k, L->dtype, "tensors.k")) ||
                 (!L->kv_latent && (st = check_buffer(t->v, L->dtype, "tensors.v")))))
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
