/* The caches as the forward writes and reads them: this step's keys and values into their slots in the
 * cache dtype (fp8 quantized by division, uattn.h), in any of the three layouts, and a TILED cache's blocks
 * gathered into rows for the kernels that read rows. Kept apart from the attention so that one file knows
 * how a key lies in each layout (with the offsets of forward_internal.h). */
#include <string.h>

#include "attention/forward_internal.h"
#include "convert.h"

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
 * Specialized for each element size (uattn_gather_tiled below). */
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

void uattn_gather_tiled(const cache_view *c, int32_t block, int32_t first, int32_t count, int32_t h0, int32_t heads,
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

/* Whether the causal part reads this step's keys of request r (parts.c: causal part; units.c: run_rows): a
 * prompt's, or a
 * bidirectional self-attention's. */
bool uattn_reads_step_keys(const uattn_plan_info *in, const uattn_layer *L, int32_t r) {
  return L->attn_type != UATTN_ATTENTION_ENCODER_DECODER &&
         (L->attn_type != UATTN_ATTENTION_DECODER || in->is_prompt[r]);
}

/* Every key and value is read as the cache holds it, this step's own included (uattn.h, uattn_forward), so
 * a key has one value whichever row reads it in whichever step. The causal part reads this step's keys from
 * a copy of k and v in the cache dtype (step_kv): the bytes uattn_write_cache stores, made by the same conversion
 * whether or not the token has a slot; where the cache dtype holds every input value exactly (equal dtypes,
 * an f32 cache) it reads k and v themselves, which is the same.
 *
 * Bytes of step_kv: this step's k and v in the cache dtype, [2][T][Hkv][D], where the cache dtype rounds some
 * input values (not equal dtypes, not an f32 cache) and a causal part reads them; else 0. */
size_t uattn_step_kv_bytes(const uattn_plan_info *in, const uattn_layer *L) {
  if (L->cache_dtype == L->dtype || L->cache_dtype == UATTN_F32) return 0;
  bool causal = false;
  for (int32_t r = 0; r < in->num_reqs && !causal; r++) causal = uattn_reads_step_keys(in, L, r);
  return causal ? 2 * (size_t)in->num_tokens * L->num_kv_heads * L->head_dim * uattn_dtype_size(L->cache_dtype) : 0;
}

/* This step's k and v into the caches at their slots and, where step_kv is not NULL, every row into it (the
 * same bytes, [2][T][Hkv][D]), a slot or not. */
void uattn_write_cache(const uattn_plan_info *in, const uattn_layer *L, const uattn_tensors *t, const cache_view *c,
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
