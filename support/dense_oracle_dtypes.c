/*
 * The dense oracle's numbers (see dense_oracle.h): its own conversions between double and every dtype uattn
 * stores, bit-exact and written from the formats' definitions, its typed element access and the caches'
 * element layouts. Apart from the attention (dense_oracle.c) because these are plain functions of a value that
 * the tests also call on their own to build inputs and read outputs.
 */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "support/dense_oracle.h"

/* ================================================================================================ */
/* scalar conversions                                                                                 */
/* ================================================================================================ */

static uint64_t double_bits(double x) {
  uint64_t b;
  memcpy(&b, &x, sizeof b);
  return b;
}

static double bits_double(uint64_t b) {
  double x;
  memcpy(&x, &b, sizeof x);
  return x;
}

double oracle_bf16_to_double(uint16_t h) {
  uint32_t b = (uint32_t)h << 16;
  float f;
  memcpy(&f, &b, sizeof f);
  return (double)f; /* float -> double is exact, NaN payload included */
}

double oracle_f16_to_double(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  if (exp == 0x1F) {
    /* inf or NaN: build the double directly so a NaN keeps its sign and payload (quiet bit 9 -> bit 51) */
    uint64_t b = ((uint64_t)sign << 63) | ((uint64_t)0x7FF << 52) | ((uint64_t)man << 42);
    return bits_double(b);
  }
  /* exact: at most 11 significant bits; exponent field 0 is the subnormal man * 2^-24 */
  double mag = exp == 0 ? ldexp((double)man, -24) : ldexp((double)(0x400 | man), exp - 25);
  return sign ? -mag : mag;
}

/* Rounds a double to a binary format with `ebits` exponent bits and `mbits` stored mantissa bits (IEEE
 * layout, bias 2^(ebits-1) - 1), round-to-nearest-even, once. Returns the format's bit pattern. */
static uint32_t narrow(double x, int ebits, int mbits) {
  const uint64_t b = double_bits(x);
  const uint32_t sign = (uint32_t)(b >> 63) << (ebits + mbits);
  const int dexp = (int)((b >> 52) & 0x7FF);
  const uint64_t dman = b & ((UINT64_C(1) << 52) - 1);
  const uint32_t exp_ones = ((UINT32_C(1) << ebits) - 1) << mbits;

  if (dexp == 0x7FF) {
    if (dman == 0) return sign | exp_ones; /* inf */
    /* NaN: keep the top payload bits, force the quiet bit so that it can never read as inf */
    uint32_t payload = (uint32_t)(dman >> (52 - mbits));
    return sign | exp_ones | payload | (UINT32_C(1) << (mbits - 1));
  }
  if (dexp == 0 && dman == 0) return sign; /* +-0 */

  /* value = sig * 2^(e - 52), sig a 53-bit integer (a double subnormal has no implicit bit) */
  const int e = dexp == 0 ? -1022 : dexp - 1023;
  const uint64_t sig = dexp == 0 ? dman : (dman | (UINT64_C(1) << 52));
  const int bias = (1 << (ebits - 1)) - 1, emin = 1 - bias, emax = bias;
  if (e > emax + 1) return sign | exp_ones; /* beyond twice the largest finite: inf whatever the rounding */

  /* The quantum (value of one unit in the last place) is 2^(e - mbits) for a normal result and the fixed
   * 2^(emin - mbits) for a subnormal one; shift = how many of sig's low bits fall below it. */
  const int shift = e >= emin ? 52 - mbits : 52 - mbits + (emin - e);
  uint64_t q;
  if (shift >= 64) {
    q = 0; /* value < 2^-11 quanta: rounds to zero */
  } else {
    q = sig >> shift;
    const uint64_t rem = sig & ((UINT64_C(1) << shift) - 1), half = UINT64_C(1) << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
  }
  /* Normal: q carries the implicit bit at position mbits, so adding it to exponent field (e + bias - 1)
   * lands on (e + bias) -- and a rounding carry into 2^(mbits+1) moves to the next binade by itself.
   * Subnormal: the exponent field is 0 and a carry into 2^mbits is exactly the smallest normal. */
  uint64_t mag = e >= emin ? ((uint64_t)(e + bias - 1) << mbits) + q : q;
  if (mag >= exp_ones) return sign | exp_ones; /* rounded past the largest finite */
  return sign | (uint32_t)mag;
}

uint16_t oracle_double_to_bf16(double x) { return (uint16_t)narrow(x, 8, 7); }
uint16_t oracle_double_to_f16(double x) { return (uint16_t)narrow(x, 5, 10); }
uint16_t oracle_float_to_bf16(float x) { return oracle_double_to_bf16((double)x); }
uint16_t oracle_float_to_f16(float x) { return oracle_double_to_f16((double)x); }

/* ---- fp8 ---------------------------------------------------------------------------------------------- */

int oracle_is_fp8(uattn_dtype t) { return t == UATTN_FP8_E4M3 || t == UATTN_FP8_E5M2; }

double oracle_fp8_to_double(uattn_dtype t, uint8_t b) {
  const int sign = b >> 7;
  double mag;
  if (t == UATTN_FP8_E4M3) {
    const int exp = (b >> 3) & 0xF, man = b & 7;
    if (exp == 0xF && man == 7) return sign ? -NAN : NAN; /* the "fn" variant's only NaN; no infinities */
    /* subnormal: man/8 * 2^(1-7); normal: (1 + man/8) * 2^(exp-7) */
    mag = exp == 0 ? ldexp((double)man, -9) : ldexp((double)(8 + man), exp - 10);
  } else if (t == UATTN_FP8_E5M2) {
    const int exp = (b >> 2) & 0x1F, man = b & 3;
    if (exp == 0x1F) return man ? (sign ? -NAN : NAN) : (sign ? -INFINITY : INFINITY);
    /* subnormal: man/4 * 2^(1-15); normal: (1 + man/4) * 2^(exp-15) */
    mag = exp == 0 ? ldexp((double)man, -16) : ldexp((double)(4 + man), exp - 17);
  } else {
    return NAN;
  }
  return sign ? -mag : mag;
}

/* The 128 non-negative codes of each format decoded once (t - UATTN_FP8_E4M3 selects the format). */
static double fp8_values[2][128];
static pthread_once_t fp8_once = PTHREAD_ONCE_INIT;

static void fp8_init(void) {
  for (int f = 0; f < 2; f++)
    for (int c = 0; c < 128; c++)
      fp8_values[f][c] = oracle_fp8_to_double((uattn_dtype)(UATTN_FP8_E4M3 + f), (uint8_t)c);
}

uint8_t oracle_double_to_fp8(uattn_dtype t, double x) {
  if (!oracle_is_fp8(t)) return 0;
  pthread_once(&fp8_once, fp8_init);
  const double *v = fp8_values[t - UATTN_FP8_E4M3];
  const uint8_t sign = signbit(x) ? 0x80 : 0;
  if (isnan(x)) return sign | 0x7F;
  const double ax = fabs(x);
  /* Beyond the largest finite value (infinities too) the format saturates. Decided here, not by the
   * search: far out (3.4e38 against 57344) the distances to the top codes round to the same double, and
   * the tie rule would pick the wrong one. */
  int top = 127;
  while (!isfinite(v[top])) top--; /* E4M3's NaN, E5M2's NaNs and inf */
  if (ax >= v[top]) return sign | (uint8_t)top;
  /* The search: codes of x's sign only, so a value that rounds to zero keeps its sign (-0 is 0x80). Codes
   * 0..top increase with their value, so bisection finds the two that bracket x, v[lo] <= x < v[hi] (v[0]
   * is 0); below the largest finite value they are within one binade of x, so their distances are exact. */
  int lo = 0, hi = top;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (v[mid] <= ax)
      lo = mid;
    else
      hi = mid;
  }
  const double d_lo = ax - v[lo], d_hi = v[hi] - ax;
  const int best = d_lo < d_hi ? lo : d_hi < d_lo ? hi : (lo & 1) == 0 ? lo : hi; /* a tie goes to the even code */
  return sign | (uint8_t)best;
}

uint8_t oracle_quantize_fp8(uattn_dtype t, double x, float scale) {
  /* x came from an f32/bf16/f16 input, so (float)x is exact; the division is the library's, in fp32 */
  const float y = (float)x / scale;
  return oracle_double_to_fp8(t, (double)y);
}

/* ---- typed element access and the caches' layouts ---------------------------------------------------- */

size_t oracle_dtype_size(uattn_dtype dtype) {
  switch (dtype) {
  case UATTN_F32: return 4;
  case UATTN_BF16:
  case UATTN_F16: return 2;
  case UATTN_FP8_E4M3:
  case UATTN_FP8_E5M2: return 1;
  }
  return 0;
}

double oracle_load(const void *base, uattn_dtype dtype, size_t i) {
  switch (dtype) {
  case UATTN_F32: return (double)((const float *)base)[i];
  case UATTN_BF16: return oracle_bf16_to_double(((const uint16_t *)base)[i]);
  case UATTN_F16: return oracle_f16_to_double(((const uint16_t *)base)[i]);
  case UATTN_FP8_E4M3:
  case UATTN_FP8_E5M2: return oracle_fp8_to_double(dtype, ((const uint8_t *)base)[i]);
  }
  return NAN;
}

void oracle_store(void *base, uattn_dtype dtype, size_t i, double x) {
  switch (dtype) {
  case UATTN_F32: ((float *)base)[i] = (float)x; break; /* C's conversion rounds to nearest even */
  case UATTN_BF16: ((uint16_t *)base)[i] = oracle_double_to_bf16(x); break;
  case UATTN_F16: ((uint16_t *)base)[i] = oracle_double_to_f16(x); break;
  case UATTN_FP8_E4M3:
  case UATTN_FP8_E5M2: ((uint8_t *)base)[i] = oracle_double_to_fp8(dtype, x); break;
  }
}

double oracle_round(uattn_dtype dtype, double x) {
  unsigned char buf[4];
  oracle_store(buf, dtype, 0, x);
  return oracle_load(buf, dtype, 0);
}

int32_t oracle_value_dim(const uattn_layer *layer) {
  return layer->head_dim_v > 0 ? layer->head_dim_v : layer->head_dim;
}

size_t oracle_cache_index(const uattn_layer *layer, int32_t block_size, int64_t slot, int32_t kv_head, int32_t dim,
                          bool value) {
  /* a latent's value dims are its key's first dims, in the key cache */
  if (layer->kv_latent) value = false;
  /* each cache's rows are its own width: D for keys, Dv for values */
  const size_t hkv = (size_t)layer->num_kv_heads, bs = (size_t)block_size;
  const size_t D = value ? (size_t)oracle_value_dim(layer) : (size_t)layer->head_dim;
  const size_t b = (size_t)slot / bs, o = (size_t)slot % bs, h = (size_t)kv_head, d = (size_t)dim;
  switch (layer->kv_layout) {
  case UATTN_LAYOUT_HND: return ((b * hkv + h) * bs + o) * D + d;
  case UATTN_LAYOUT_TILED: {
    /* tile t of the block, key i of the tile */
    const size_t tile = (b * (bs / 16) + o / 16) * hkv + h, i = o % 16;
    if (value) return ((tile * 8 + i / 2) * D + d) * 2 + i % 2;
    return ((tile * (D / 2) + d / 2) * 16 + i) * 2 + d % 2;
  }
  case UATTN_LAYOUT_NHD:
  default: return ((size_t)slot * hkv + h) * D + d;
  }
}
