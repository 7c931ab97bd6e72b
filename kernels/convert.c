#include "convert.h"

static const struct {
  const char *name, *long_name;
} dtypes[] = {[UATTN_F32] = {"f32", "float32"},
              [UATTN_BF16] = {"bf16", "bfloat16"},
              [UATTN_F16] = {"f16", "float16"},
              [UATTN_FP8_E4M3] = {"fp8_e4m3", "float8_e4m3fn"},
              [UATTN_FP8_E5M2] = {"fp8_e5m2", "float8_e5m2"}};

const char *uattn_dtype_name(uattn_dtype t) { return uattn_dtype_valid(t) ? dtypes[t].name : "?"; }

bool uattn_dtype_parse(const char *s, bool long_names, uattn_dtype *out) {
  for (int t = 0; t < (int)(sizeof dtypes / sizeof *dtypes); t++)
    if (!strcmp(s, dtypes[t].name) || (long_names && !strcmp(s, dtypes[t].long_name))) {
      *out = (uattn_dtype)t;
      return true;
    }
  return false;
}

float uattn_f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13); /* inf or NaN */
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    u = sign;
  } else { /* subnormal: normalize */
    int e = -1;
    do {
      e++;
      mant <<= 1;
    } while (!(mant & 0x400u));
    u = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t uattn_f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  /* NaN */
  if (abs >= 0x477ff000u) return sign | 0x7c00u; /* rounds to inf (>= 65520) */
  if (abs >= 0x38800000u) {                      /* normal in f16 */
    uint32_t v = abs - (112u << 23);
    v += 0xfffu + ((v >> 13) & 1u);
    return sign | (uint16_t)(v >> 13);
  }
  if (abs < 0x33000000u) return sign; /* below half the smallest subnormal: zero */
  /* subnormal: shift the mantissa (with its hidden bit) into place, rounding to nearest even */
  const uint32_t e = abs >> 23, mant = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e; /* 14..24 */
  uint32_t v = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (v & 1u))) v++;
  return sign | (uint16_t)v;
}

/* ---- fp8 ----------------------------------------------------------------------------------------------- */

/* The tables as constant expressions of the code c, so they are data from the start (no initialization to
 * race on) and exact: each magnitude is an integer of at most 4 bits times a power of two.
 *   E4M3 (bias 7): exponent field e = 1..15: (8 + m) * 2^(e - 10); e = 0: m * 2^-9; S.1111.111 is NaN.
 *   E5M2 (bias 15): e = 1..30: (4 + m) * 2^(e - 17); e = 0: m * 2^-16; e = 31: inf (m = 0) or NaN. */
#define FP8_SIGNED(c, mag) ((c)&0x80 ? -(mag) : (mag))
#define E4M3_MAG(c)                                                                                                    \
  (((c)&0x7f) == 0x7f     ? __builtin_nanf("")                                                                         \
   : ((c) >> 3 & 15) != 0 ? (float)(8 + ((c)&7)) * (float)(1u << ((c) >> 3 & 15)) * 0x1p-10f                           \
                          : (float)((c)&7) * 0x1p-9f)
#define E5M2_MAG(c)                                                                                                    \
  (((c) >> 2 & 31) == 31  ? (((c)&3) ? __builtin_nanf("") : __builtin_inff())                                          \
   : ((c) >> 2 & 31) != 0 ? (float)(4 + ((c)&3)) * (float)(1u << ((c) >> 2 & 31)) * 0x1p-17f                           \
                          : (float)((c)&3) * 0x1p-16f)
#define E4M3(c) FP8_SIGNED(c, E4M3_MAG(c))
#define E5M2(c) FP8_SIGNED(c, E5M2_MAG(c))
#define FP8_4(F, c) F(c), F((c) + 1), F((c) + 2), F((c) + 3)
#define FP8_16(F, c) FP8_4(F, c), FP8_4(F, (c) + 4), FP8_4(F, (c) + 8), FP8_4(F, (c) + 12)
#define FP8_64(F, c) FP8_16(F, c), FP8_16(F, (c) + 16), FP8_16(F, (c) + 32), FP8_16(F, (c) + 48)
#define FP8_256(F) FP8_64(F, 0), FP8_64(F, 64), FP8_64(F, 128), FP8_64(F, 192)

const float uattn_fp8_e4m3_values[256] = {FP8_256(E4M3)};
const float uattn_fp8_e5m2_values[256] = {FP8_256(E5M2)};

/* Like uattn_f32_to_f16, for a format of `mant` mantissa bits and exponent bias `bias`, whose largest finite
 * code is max_code (E4M3: 0x7E, as 0x7F is NaN; E5M2: 0x7B, as 0x7C is inf). Rounding first and then
 * comparing the code with max_code saturates exactly the values that round past the largest finite one:
 * E4M3 464 (halfway between 448 and 480, ties to the even 448) stays 448 by rounding, anything above goes
 * to 480 = 0x7F and is saturated; E5M2 61440 (halfway to 65536, ties to the even 65536 = 0x7C) is
 * saturated. Infinities saturate too: E4M3 has none, and a cache of E5M2 holds none (uattn.h). */
static uint8_t f32_to_fp8(float f, uint32_t mant, uint32_t bias, uint32_t max_code) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7fffffffu, shift_n = 23u - mant;
  if (abs > 0x7f800000u) return sign | 0x7fu; /* NaN */
  if (abs == 0x7f800000u) return sign | (uint8_t)max_code;
  const uint32_t e = abs >> 23;
  if (e >= 128u - bias) { /* normal in fp8 (exponent >= 1 - bias): rebias, then round the mantissa */
    uint32_t v = abs - ((127u - bias) << 23);
    v += (1u << (shift_n - 1u)) - 1u + ((v >> shift_n) & 1u);
    v >>= shift_n;
    return sign | (uint8_t)(v > max_code ? max_code : v);
  }
  /* subnormal in fp8, in units of its smallest subnormal 2^(1 - bias - mant): the mantissa with its hidden
   * bit, shifted into place and rounded to nearest even. Below half a unit (shift >= 25, f32 subnormals
   * included) it is zero. */
  const uint32_t shift = 151u - bias - mant - e;
  if (e == 0 || shift >= 25u) return sign;
  const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
  uint32_t v = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (v & 1u))) v++;
  return sign | (uint8_t)v; /* v = 2^mant: the smallest normal, whose code it is */
}

uint8_t uattn_f32_to_fp8(uattn_dtype t, float x) {
  return t == UATTN_FP8_E4M3 ? f32_to_fp8(x, 3, 7, 0x7e) : f32_to_fp8(x, 2, 15, 0x7b);
}

UATTN_ROW_CLONES void uattn_widen(uattn_dtype t, const void *src, float *dst, size_t n) {
  if (t == UATTN_F32) {
    memcpy(dst, src, n * sizeof(float));
  } else if (t == UATTN_BF16) {
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = uattn_bf16_to_f32(s[i]);
  } else if (uattn_dtype_is_fp8(t)) {
    const uint8_t *s = src;
    const float *table = uattn_fp8_table(t);
    for (size_t i = 0; i < n; i++) dst[i] = table[s[i]];
  } else {
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = uattn_f16_to_f32(s[i]);
  }
}

UATTN_ROW_CLONES void uattn_narrow(uattn_dtype t, const float *src, void *dst, size_t n) {
  if (t == UATTN_F32) {
    memcpy(dst, src, n * sizeof(float));
  } else if (t == UATTN_BF16) {
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = uattn_f32_to_bf16(src[i]);
  } else if (uattn_dtype_is_fp8(t)) {
    uint8_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = uattn_f32_to_fp8(t, src[i]);
  } else {
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = uattn_f32_to_f16(src[i]);
  }
}

void uattn_convert(uattn_dtype from, const void *src, uattn_dtype to, void *dst, size_t n) {
  if (from == to) {
    memcpy(dst, src, n * uattn_dtype_size(from));
    return;
  }
  float buf[256];
  for (size_t i = 0; i < n; i += 256) {
    const size_t m = n - i < 256 ? n - i : 256;
    uattn_widen(from, (const char *)src + i * uattn_dtype_size(from), buf, m);
    uattn_narrow(to, buf, (char *)dst + i * uattn_dtype_size(to), m);
  }
}
