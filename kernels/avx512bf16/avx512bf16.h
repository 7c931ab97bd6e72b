/* The avx512bf16 kernel set (avx512bf16/set.c): bf16 dot products (vdpbf16ps) with fp32 accumulation for
 * S = Q K^T and, by default, P V, in its own panel layout, and its decode kernel; see avx512bf16/body.h
 * for the arithmetic and the layout. The dispatch uses it for bf16 layers on bf16 and fp8 caches
 * (dispatch.c). Nothing here may be called unless uattn_avx512bf16_runs_here() said yes. */
#ifndef UATTN_AVX512BF16_H
#define UATTN_AVX512BF16_H

#include "kernels.h"

extern const uattn_kernels uattn_kernels_avx512bf16;

/* Its capability record (kernels.h: uattn_kernel_caps' fields in order): unscaled queries for both kernels and
 * bf16 inputs; decode of head dims of whole ymm vectors, P V tiles of 8 keys; TILED kernels for bf16 and fp8 codes
 * (exact in its bf16 panels), decode_tiled for whole 64-byte lines of dims and P in bf16 only. */
#define AVX512BF16_CAPS                                                                                                \
  1, 1, 1, 8, UATTN_DECODE_MAX_KEYS, UATTN_DECODE_MAX_VECTORS, 8,                                                      \
      UATTN_DTYPE_BIT(UATTN_BF16) | UATTN_DTYPE_BIT(UATTN_FP8_E4M3) | UATTN_DTYPE_BIT(UATTN_FP8_E5M2), 32, 0
UATTN_CAPS_CHECK(AVX512BF16_CAPS);

/* 1 when this CPU runs the avx512 set, AVX-512BW, VL and VBMI, and AVX512_BF16 (CPUID leaf 7 subleaf 1, EAX bit
 * 5); always 0 off x86. Probed once; safe to call anywhere, from any thread. */
int uattn_avx512bf16_runs_here(void);

/* The set's panel size (its panel_floats; the generated buckets share the layout). */
size_t uattn_avx512bf16_panel_floats(int32_t panel_keys, int32_t head_dim);

/* The set with vdpbf16ps emulated exactly on AVX2 + FMA (avx512bf16/vec.h): the same bits, for the tests,
 * on machines without AVX512-BF16; only after uattn_avx2_runs_here(). Not a candidate for dispatch. */
extern const uattn_kernels uattn_kernels_avx512bf16_twin;

/* The two sets' decode kernels (kernels.h: decode, decode_tiled), which the avx512bf16fma set shares. */
void uattn_avx512bf16_decode(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype dtype,
                             const uattn_decode_src *src, float *scratch);
void uattn_avx512bf16_decode_tiled(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype dtype,
                                   const void *k_src, const void *v_src, size_t stride, size_t head_stride,
                                   float *scratch);
void uattn_avx512bf16_twin_decode(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype dtype,
                                  const uattn_decode_src *src, float *scratch);
void uattn_avx512bf16_twin_decode_tiled(const uattn_panel_job *job, int32_t heads, size_t head_vectors,
                                        uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride,
                                        size_t head_stride, float *scratch);

#endif
