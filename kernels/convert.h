/* Storage dtypes <-> fp32. Portable bit manipulation, so results are identical on every CPU: bf16 and f16
 * narrowing rounds to nearest even; NaN stays NaN. */
#ifndef UATTN_CONVERT_H
#define UATTN_CONVERT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "uattn.h"

static inline float uattn_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline uint16_t uattn_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);                                           /* round to nearest even */
  return (uint16_t)(u >> 16);
}

float uattn_f16_to_f32(uint16_t h);
uint16_t uattn_f32_to_f16(float f);

/* The dtype table (convert.c): each uattn_dtype's short name ("f32", "bf16", "f16": the one uattn writes and
 * tuning files take) and long name ("float32", "bfloat16", "float16": NumPy's, which step dumps and the Python
 * package also take). The size stays arithmetic here: the kernels call it in their loops. */
static inline size_t uattn_dtype_size(uattn_dtype t) { return t == UATTN_F32 ? 4 : 2; }
static inline bool uattn_dtype_valid(uattn_dtype t) { return t == UATTN_F32 || t == UATTN_BF16 || t == UATTN_F16; }
/* The short name; "?" for a value that is not a uattn_dtype. */
const char *uattn_dtype_name(uattn_dtype t);
/* The dtype named s (a short name, or a long one too when long_names), into *out; false when s names none. */
bool uattn_dtype_parse(const char *s, bool long_names, uattn_dtype *out);

/* n elements of src (in type t) into fp32. */
void uattn_widen(uattn_dtype t, const void *src, float *dst, size_t n);
/* n fp32 values into dst (in type t). */
void uattn_narrow(uattn_dtype t, const float *src, void *dst, size_t n);
/* n elements from one storage type to another (through fp32). */
void uattn_convert(uattn_dtype from, const void *src, uattn_dtype to, void *dst, size_t n);

#endif
