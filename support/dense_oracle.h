/*
 * The dense attention oracle: docs/design.md's semantics per request, in double precision, straight from the
 * step description and the tensors. It shares no code with runtime/ or kernels/ and knows nothing of the
 * planner (no causal/shared/unique split, no biases, no buckets), so that uattn_forward can be tested
 * against something that cannot share its mistakes.
 *
 * Every function here is a plain function of its arguments except oracle_last_error's per-thread message.
 */
#ifndef UATTN_SUPPORT_DENSE_ORACLE_H
#define UATTN_SUPPORT_DENSE_ORACLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "uattn.h"

/* One step, as the scheduler describes it. Rows of q/k/v/out are the scheduled tokens flattened in request
 * order; row i of request r is at position num_computed[r] + i. num_scheduled is the effective count
 * (rejected drafts already removed). num_prompt does not change attention (§1 has no prompt/decode
 * distinction) and may be NULL; it is here so that a step can be passed through unchanged. */
typedef struct oracle_step {
  int32_t num_reqs, block_size;
  const int32_t *num_computed, *num_scheduled, *num_prompt;
  const int32_t *block_table; /* [num_reqs, block_table_stride] */
  int32_t block_table_stride;
} oracle_step;

/* The message of the last failing oracle call on this thread ("" if none). */
const char *oracle_last_error(void);

/* ---- scalar conversions (bit-exact, no _Float16, no F16C) ------------------------------------------- */
/* Widening is exact. Narrowing rounds to nearest, ties to even, directly from the double (one rounding),
 * with subnormals, overflow to +-inf, and the sign of zero kept. A NaN stays a NaN of the same sign with the
 * quiet bit set and the top payload bits kept (for a NaN that came from a float this is bf16's usual
 * `(bits >> 16) | 0x40`). */
double oracle_bf16_to_double(uint16_t h);
double oracle_f16_to_double(uint16_t h);
uint16_t oracle_double_to_bf16(double x);
uint16_t oracle_double_to_f16(double x);
/* The float forms round the float's exact value once, as a library converting fp32 would. */
uint16_t oracle_float_to_bf16(float x);
uint16_t oracle_float_to_f16(float x);

/* fp8 (uattn.h's UATTN_FP8_E4M3 / UATTN_FP8_E5M2), written from the formats' definitions, not from the
 * library's conversions. Decoding reads the bit fields: sign, exponent (bias 7 / 15), mantissa, subnormals
 * at exponent field 0; E4M3 (the "fn" variant) has no infinities and one NaN per sign (S.1111.111), E5M2 has
 * IEEE infinities (S.11111.00) and NaNs (S.11111.xx, xx != 0). */
double oracle_fp8_to_double(uattn_dtype t, uint8_t b);
/* The nearest fp8 value to x by a search over the 256 decoded codes (not by bit manipulation, so that it
 * cannot share a rounding library's mistakes): the closest finite code of x's sign, a tie going to the code
 * whose mantissa's last bit is 0 (round to nearest even); anything beyond the largest finite value,
 * infinities included, saturates to it (448 / 57344); a NaN gives 0x7F with x's sign. */
uint8_t oracle_double_to_fp8(uattn_dtype t, double x);
/* What a cache write stores for the value x of a layer with this k_scale or v_scale: x / scale in fp32,
 * then oracle_double_to_fp8. */
uint8_t oracle_quantize_fp8(uattn_dtype t, double x, float scale);
/* true for UATTN_FP8_E4M3 and UATTN_FP8_E5M2. */
int oracle_is_fp8(uattn_dtype t);

/* ---- typed element access, for building inputs and reading outputs ---------------------------------- */
size_t oracle_dtype_size(uattn_dtype dtype); /* 4, 2, 2, 1, 1; 0 for an unknown dtype */
/* Element i of an array of `dtype`, widened to double (an fp8 code's own value, not times a scale). */
double oracle_load(const void *base, uattn_dtype dtype, size_t i);
/* Stores x rounded to `dtype` (round-to-nearest-even; fp8: oracle_double_to_fp8, no scale) as element i. */
void oracle_store(void *base, uattn_dtype dtype, size_t i, double x);
/* x rounded to `dtype` and widened back: the value an input actually holds once stored. */
double oracle_round(uattn_dtype dtype, double x);

/* The layer's value width: head_dim_v, or head_dim where it is 0 (uattn.h). */
int32_t oracle_value_dim(const uattn_layer *layer);

/* Element index of (slot, kv_head, dim) in the key cache (value false) or the value cache (value true) of
 * the layer's kv_layout, written from uattn.h's definitions, with b = slot / bs, o = slot % bs, D the head
 * dim and Dv the value dim (oracle_value_dim):
 *   NHD   keys [num_blocks * bs, Hkv, D], values [num_blocks * bs, Hkv, Dv];
 *   HND   keys [num_blocks, Hkv, bs, D], values [num_blocks, Hkv, bs, Dv];
 *   TILED keys [num_blocks, bs / 16, Hkv, D / 2, 16, 2] at (b, o / 16, h, dim / 2, o % 16, dim % 2),
 *         values [num_blocks, bs / 16, Hkv, 8, Dv, 2] at (b, o / 16, h, o % 16 / 2, dim, o % 2).
 * A kv_latent layer has no value cache: its value dim d is the key's dim d, so value true gives the key
 * cache's index. Per element, not per row: in TILED a key's D elements are not contiguous. */
size_t oracle_cache_index(const uattn_layer *layer, int32_t block_size, int64_t slot, int32_t kv_head, int32_t dim,
                          bool value);

/* ---- the reference ------------------------------------------------------------------------------------ */
/* Writes this step's k/v into the caches: for p = num_computed[r] + i, slot = block_table[r][p / bs] * bs +
 * p % bs, converting dtype -> cache_dtype with round-to-nearest-even (bits copied when the dtypes are equal);
 * a kv_latent layer writes its keys alone (it has no v and no value cache). Encoder-decoder cross attention
 * writes nothing (its step k/v are ignored). Everything is checked before anything is written: returns 0, or
 * -1 with a message (and nothing written) for a block id outside [0, t->num_blocks), a block table row too
 * short, two tokens mapped to one slot, or bad arguments (a kv_latent layer: head_dim_v outside
 * (0, head_dim], a TILED cache, v or value_cache given, an fp8 v_scale other than k_scale). */
int oracle_write_cache(const oracle_step *s, const uattn_layer *layer, const uattn_tensors *t);

/* out [T, Hq, Dv] and lse [T, Hq] (lse may be NULL) in double, T = sum of num_scheduled, Dv the value dim.
 * Reads the caches AFTER the update (call oracle_write_cache first): every key of a self-attention, this
 * step's own too, is read as the cache holds it (in cache_dtype; an fp8 code times k_scale or v_scale), so
 * that a key has one value whoever reads it (uattn.h, uattn_forward); a kv_latent layer's value is the first
 * Dv dims of its key as read (times k_scale); cross attention reads keys [0, encoder_lens[r]) through
 * t->cross->block_table. A row with no visible key gets out 0 and lse -inf (lse = sink with a sink). Returns
 * 0, or -1 with a message, writing nothing, for inputs it cannot handle. */
int oracle_attention(const oracle_step *s, const uattn_layer *layer, const uattn_tensors *t, double *out, double *lse);

/* The same for a sample of rows only (any order, repeats allowed): out [num_rows, Hq, Dv], lse [num_rows, Hq]
 * for rows[0..num_rows). The answer for a row is bit-identical to oracle_attention's; the cost is that of
 * the sampled rows plus widening the keys of the requests they belong to. */
int oracle_attention_rows(const oracle_step *s, const uattn_layer *layer, const uattn_tensors *t, int32_t num_rows,
                          const int32_t *rows, double *out, double *lse);

/* Threads the two functions above use (0, the default: one per online CPU). Results do not depend on it:
 * threads only share out (request, KV head, rows) units whose arithmetic is fixed. Not thread-safe itself. */
void oracle_set_num_threads(int n);

#endif
