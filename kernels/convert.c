#include "convert.h"

static const struct {
  const char *name, *long_name;
} dtypes[] = {[UATTN_F32] = {"f32", "float32"}, [UATTN_BF16] = {"bf16", "bfloat16"}, [UATTN_F16] = {"f16", "float16"}};

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

void uattn_widen(uattn_dtype t, const void *src, float *dst, size_t n) {
  if (t == UATTN_F32) {
    memcpy(dst, src, n * sizeof(float));
  } else if (t == UATTN_BF16) {
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = uattn_bf16_to_f32(s[i]);
  } else {
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = uattn_f16_to_f32(s[i]);
  }
}

void uattn_narrow(uattn_dtype t, const float *src, void *dst, size_t n) {
  if (t == UATTN_F32) {
    memcpy(dst, src, n * sizeof(float));
  } else if (t == UATTN_BF16) {
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = uattn_f32_to_bf16(src[i]);
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
