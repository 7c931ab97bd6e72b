/* Storage dtypes <-> fp32. Portable bit manipulation, so results are identical on every CPU: bf16, f16 and
 * fp8 narrowing rounds to nearest even; NaN stays NaN. */
#ifndef UATTN_CONVERT_H
#define UATTN_CONVERT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "uattn.h"

/* For the plain loops the forward runs over every output row (conversions, the merge of partial states): copies
 * compiled for AVX-512 and AVX2 as well, the one the CPU runs picked when the library loads (target_clones).
 * The same operations element by element, nothing contracted (ISO C's FP_CONTRACT off), so the same bits on
 * every path. Not under ThreadSanitizer, whose runtime is not up yet when the resolver runs, and GCC only: clang
 * 14 names the resolved function `name.ifunc`, so other files' calls to `name` do not link. */
#if defined(__x86_64__) && defined(__has_attribute) && !defined(__SANITIZE_THREAD__) && !defined(__clang__)
#if __has_attribute(target_clones)
#define UATTN_ROW_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef UATTN_ROW_CLONES
#define UATTN_ROW_CLONES
#endif

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

/* fp8 (uattn.h: UATTN_FP8_E4M3, UATTN_FP8_E5M2), raw values: the cache's scales are the forward's business.
 * Every one of the 256 codes of each format as fp32 (exact: fp32 holds them all), -0.0f for 0x80, NaN for
 * S.1111.111 (E4M3) and S.11111.xx (E5M2), +-inf for E5M2's S.11111.00. A table, as constants, so a widening
 * is one load and the kernels may index it directly. */
extern const float uattn_fp8_e4m3_values[256], uattn_fp8_e5m2_values[256];
static inline bool uattn_dtype_is_fp8(uattn_dtype t) { return t == UATTN_FP8_E4M3 || t == UATTN_FP8_E5M2; }
/* The table of an fp8 dtype (t must be one). */
static inline const float *uattn_fp8_table(uattn_dtype t) {
  return t == UATTN_FP8_E4M3 ? uattn_fp8_e4m3_values : uattn_fp8_e5m2_values;
}
/* b (a code of fp8 dtype t) as fp32, exactly. */
static inline float uattn_fp8_to_f32(uattn_dtype t, uint8_t b) { return uattn_fp8_table(t)[b]; }
/* x in fp8 dtype t: rounded to nearest even (subnormals of the format included); a finite value past the
 * largest finite one, and +-inf, saturate to +-the largest finite value (E4M3 448: it has no infinities;
 * E5M2 57344: an fp8 cache holds no infinities either, uattn.h); NaN -> 0x7F | sign; -0.0f -> 0x80. */
uint8_t uattn_f32_to_fp8(uattn_dtype t, float x);

/* The dtype table (convert.c): each uattn_dtype's short name ("f32", "bf16", "f16", "fp8_e4m3", "fp8_e5m2":
 * the one uattn writes and tuning files take) and long name ("float32", "bfloat16", "float16", "float8_e4m3fn",
 * "float8_e5m2": NumPy's and ml_dtypes', which step dumps and the Python package also take). The size stays
 * arithmetic here: the kernels call it in their loops. */
static inline size_t uattn_dtype_size(uattn_dtype t) { return t == UATTN_F32 ? 4 : uattn_dtype_is_fp8(t) ? 1 : 2; }
static inline bool uattn_dtype_valid(uattn_dtype t) {
  return t == UATTN_F32 || t == UATTN_BF16 || t == UATTN_F16 || uattn_dtype_is_fp8(t);
}
/* The short name; "?" for a value that is not a uattn_dtype. */
const char *uattn_dtype_name(uattn_dtype t);
/* The dtype named s (a short name, or a long one too when long_names), into *out; false when s names none. */
bool uattn_dtype_parse(const char *s, bool long_names, uattn_dtype *out);

/* n elements of src (in type t) into fp32; fp8 as raw values (scale 1). */
void uattn_widen(uattn_dtype t, const void *src, float *dst, size_t n);
/* n fp32 values into dst (in type t); fp8 as raw values (scale 1). */
void uattn_narrow(uattn_dtype t, const float *src, void *dst, size_t n);
/* n elements from one storage type to another (through fp32). */
void uattn_convert(uattn_dtype from, const void *src, uattn_dtype to, void *dst, size_t n);

#endif
