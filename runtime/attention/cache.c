/* The caches as the forward writes and reads them: this step's keys and values into their slots in the
 * cache dtype (fp8 quantized by division, uattn.h), in any of the three layouts, and blocks staged into rows
 * for the kernels that read rows where the cache does not hold them so (TILED, or values of another length). Kept apart from the attention so that one file knows
 * how a key lies in each layout (with the offsets of forward_internal.h). */
#include <string.h>

#include "attention/forward_internal.h"
#include "convert.h"

/* One key's head_dim elements and one value's v_dim (kx, vx, in the cache dtype; vx NULL for a latent, whose
 * value is its key) to (slot, head) of the caches. */
static void store_vectors(const cache_view *c, int64_t slot, int32_t head, const char *kx, const char *vx) {
  const size_t esz = uattn_dtype_size(c->dtype), D = (size_t)c->head_dim, Dv = (size_t)c->v_dim;
  if (c->layout != UATTN_LAYOUT_TILED) {
    memcpy(c->k + cache_offset(c, slot, head) * esz, kx, D * esz);
    if (vx) memcpy(c->v + cache_offset_dim(c, slot, head, c->v_dim) * esz, vx, Dv * esz);
    return;
  }
  const int64_t block = slot / c->block_size;
  const int32_t j = (int32_t)(slot % c->block_size), i = j % UATTN_TILED_KEYS, tile = j / UATTN_TILED_KEYS;
  const size_t k_share = tiled_share(c, block, tile, head) * esz;
  const size_t v_share = tiled_share_dim(c, block, tile, head, c->v_dim) * esz;
  for (int32_t d = 0; d < c->head_dim; d++) memcpy(c->k + k_share + tiled_key(i, d) * esz, kx + (size_t)d * esz, esz);
  for (int32_t d = 0; d < c->v_dim; d++)
    memcpy(c->v + v_share + tiled_value(i, d, c->v_dim) * esz, vx + (size_t)d * esz, esz);
}

/* Keys [first, first + count) of a block for heads [h0, h0 + heads), as rows of an NHD cache of `heads` heads
 * whose rows are `width` long (k_out, v_out: [count][heads][width] elements of esz bytes), zeros (+0 in every
 * dtype) after each key's and value's own dims: for the kernels that read rows, from a TILED cache (the panel
 * loads, and the decode kernels of the sets without decode_tiled), and from any cache whose value rows are
 * another length than its key rows. Specialized for each element size (uattn_stage_block below). */
static inline __attribute__((always_inline)) void stage_block_esz(const size_t esz, const cache_view *c, int32_t block,
                                                                  int32_t first, int32_t count, int32_t h0,
                                                                  int32_t heads, int32_t width, char *k_out,
                                                                  char *v_out) {
  const int32_t D = c->head_dim, Dv = c->v_dim;
  const bool tiled = c->layout == UATTN_LAYOUT_TILED;
  for (int32_t x = 0; x < count; x++) {
    const int32_t j = first + x, i = j % UATTN_TILED_KEYS;
    const int64_t slot = (int64_t)block * c->block_size + j;
    for (int32_t g = 0; g < heads; g++) {
      char *kr = k_out + ((size_t)x * heads + g) * width * esz, *vr = v_out + ((size_t)x * heads + g) * width * esz;
      if (tiled) {
        const size_t k_share = tiled_share(c, block, j / UATTN_TILED_KEYS, h0 + g) * esz;
        const size_t v_share = tiled_share_dim(c, block, j / UATTN_TILED_KEYS, h0 + g, Dv) * esz;
        const char *kp = c->k + k_share + tiled_key(i, 0) * esz, *vp = c->v + v_share + tiled_value(i, 0, Dv) * esz;
        for (int32_t p = 0; p < D / 2; p++) /* a dim pair at a time: one load and store */
          memcpy(kr + 2 * (size_t)p * esz, kp + 2 * (size_t)p * UATTN_TILED_KEYS * esz, 2 * esz);
        for (int32_t d = 0; d < Dv; d++) memcpy(vr + (size_t)d * esz, vp + 2 * (size_t)d * esz, esz);
      } else {
        memcpy(kr, c->k + cache_offset(c, slot, h0 + g) * esz, (size_t)D * esz);
        memcpy(vr, c->v + cache_offset_dim(c, slot, h0 + g, Dv) * esz, (size_t)Dv * esz);
      }
      if (width > D) memset(kr + (size_t)D * esz, 0, (size_t)(width - D) * esz);
      if (width > Dv) memset(vr + (size_t)Dv * esz, 0, (size_t)(width - Dv) * esz);
    }
  }
}

void uattn_stage_block(const cache_view *c, int32_t block, int32_t first, int32_t count, int32_t h0, int32_t heads,
                       int32_t width, char *k_out, char *v_out) {
  switch (uattn_dtype_size(c->dtype)) {
  case 1: stage_block_esz(1, c, block, first, count, h0, heads, width, k_out, v_out); break;
  case 2: stage_block_esz(2, c, block, first, count, h0, heads, width, k_out, v_out); break;
  default: stage_block_esz(4, c, block, first, count, h0, heads, width, k_out, v_out); break;
  }
}

/* One head's vector into an fp8 cache: fp8(x / scale), x widened to fp32 and divided in fp32 (uattn.h). A
 * division, not a multiplication by 1 / scale, which would round twice. */
static void quantize(uattn_dtype from, const void *src, uattn_dtype to, uint8_t *dst, int32_t D, float scale) {
  float x[UATTN_MAX_HEAD_DIM];
  uattn_widen(from, src, x, (size_t)D);
  for (int32_t d = 0; d < D; d++) dst[d] = uattn_f32_to_fp8(to, x[d] / scale);
}

/* One head's key or value of this step (src, the layer's dtype, D elements) in the cache dtype, into dst. */
static void to_cache_dtype(const uattn_layer *L, const void *src, uattn_dtype to, char *dst, int32_t D,
                           float fp8_scale) {
  if (uattn_dtype_is_fp8(to))
    quantize(L->dtype, src, to, (uint8_t *)dst, D, fp8_scale);
  else
    uattn_convert(L->dtype, src, to, dst, (size_t)D);
}

/* Whether the causal part reads this step's keys of request r (parts.c: causal part; units.c: run_rows): a
 * prompt's, or a bidirectional self-attention's. */
bool uattn_reads_step_keys(const uattn_plan_info *in, const uattn_layer *L, int32_t r) {
  return L->attn_type != UATTN_ATTENTION_ENCODER_DECODER &&
         (L->attn_type != UATTN_ATTENTION_DECODER || in->is_prompt[r]);
}

/* Every key and value is read as the cache holds it, this step's own included (uattn.h, uattn_forward), so
 * a key has one value whichever row reads it in whichever step. The causal part reads this step's keys from
 * a copy of k and v in the cache dtype (step_kv): the bytes uattn_write_cache stores, made by the same conversion
 * whether or not the token has a slot; where the cache dtype holds every input value exactly (equal dtypes,
 * an f32 cache) it reads k and v themselves, which is the same, unless their rows must be staged to the
 * kernels' head dim (head_dims.padded).
 *
 * Bytes of step_kv, where a causal part reads it: this step's keys and values in the cache dtype, [2][T][Hkv][W]
 * for rows of W = the kernels' head dim (zeros after each row's own dims), or the keys alone, [T][Hkv][D], for a
 * latent, whose values are its keys; else 0. */
size_t uattn_step_kv_bytes(const uattn_plan_info *in, const uattn_layer *L) {
  const head_dims dims = layer_dims(L);
  if (!dims.padded && (L->cache_dtype == L->dtype || L->cache_dtype == UATTN_F32)) return 0;
  bool causal = false;
  for (int32_t r = 0; r < in->num_reqs && !causal; r++) causal = uattn_reads_step_keys(in, L, r);
  const size_t halves = L->kv_latent ? 1 : 2;
  return causal ? halves * (size_t)in->num_tokens * L->num_kv_heads * dims.kernel * uattn_dtype_size(L->cache_dtype)
                : 0;
}

/* This step's k and v into the caches at their slots (a latent's keys alone) and, where step_kv is not NULL,
 * every row into it (the same bytes, rows of the kernels' head dim), a slot or not. */
void uattn_write_cache(const uattn_plan_info *in, const uattn_layer *L, const uattn_tensors *t, const cache_view *c,
                       char *step_kv) {
  const head_dims dims = layer_dims(L);
  const size_t in_size = uattn_dtype_size(L->dtype), cache_size = uattn_dtype_size(c->dtype);
  const int32_t H = L->num_kv_heads, W = dims.kernel;
  const size_t half = (size_t)in->num_tokens * H * W * cache_size; /* step_kv's keys, then its values */
  _Alignas(16) char kbuf[UATTN_MAX_HEAD_DIM * 4], vbuf[UATTN_MAX_HEAD_DIM * 4];
  for (int32_t row = 0; row < in->num_tokens; row++) {
    const int64_t slot = in->slot_mapping[row];
    if (slot < 0 && !step_kv) continue;
    for (int32_t h = 0; h < H; h++) {
      char *kx = step_kv ? step_kv + ((size_t)row * H + h) * W * cache_size : kbuf;
      char *vx = L->kv_latent ? NULL : step_kv ? kx + half : vbuf;
      to_cache_dtype(L, (const char *)t->k + ((size_t)row * H + h) * dims.k * in_size, c->dtype, kx, dims.k,
                     L->k_scale);
      if (vx)
        to_cache_dtype(L, (const char *)t->v + ((size_t)row * H + h) * dims.v * in_size, c->dtype, vx, dims.v,
                       L->v_scale);
      if (step_kv && W > dims.k) memset(kx + (size_t)dims.k * cache_size, 0, (size_t)(W - dims.k) * cache_size);
      if (step_kv && vx && W > dims.v) memset(vx + (size_t)dims.v * cache_size, 0, (size_t)(W - dims.v) * cache_size);
      if (slot >= 0) store_vectors(c, slot, h, kx, vx);
    }
  }
}
