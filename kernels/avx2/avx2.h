/* The AVX2 + FMA + F16C kernel set (avx2/set.c). The library itself is built for baseline x86-64, so nothing
 * here may be called unless uattn_avx2_runs_here() said yes. */
#ifndef UATTN_AVX2_H
#define UATTN_AVX2_H

#include <stddef.h>

#include "kernels.h"

extern const uattn_kernels uattn_kernels_avx2;

/* Its capability record (kernels.h: uattn_kernel_caps' fields in order): queries scaled for both kernels, fp32
 * inputs; decode of head dims of whole ymm vectors, P V tiles of 8 keys; decode_tiled for bf16 and fp8 caches,
 * head dims a multiple of 16, P in fp32 (avx2/decode_tiled.h); load_tiled for the same dtypes (common/panels.h). */
#define AVX2_CAPS                                                                                                      \
  0, 0, 0, 8, UATTN_DECODE_MAX_KEYS, UATTN_DECODE_MAX_VECTORS, 8,                                                      \
      UATTN_DTYPE_BIT(UATTN_BF16) | UATTN_DTYPE_BIT(UATTN_FP8_E4M3) | UATTN_DTYPE_BIT(UATTN_FP8_E5M2), 16, 1
UATTN_CAPS_CHECK(AVX2_CAPS);

/* 1 when this CPU (and OS) runs AVX2, FMA and F16C; always 0 off x86. Safe to call anywhere. */
int uattn_avx2_runs_here(void);

/* The set's vector math over arrays, for the accuracy tests (n any; only after uattn_avx2_runs_here()). */
void uattn_avx2_exp(const float *x, float *y, size_t n);  /* e^x, inputs <= 88 */
void uattn_avx2_tanh(const float *x, float *y, size_t n); /* tanh x */

/* The set's load, load_tiled and attend (every part); the avx512 set shares the loads. */
void uattn_avx2_load(uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride, int32_t count,
                     int32_t head_dim, int32_t panel_keys, float *keys, float *values);
void uattn_avx2_load_tiled(uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride, int32_t first,
                           int32_t count, int32_t head_dim, int32_t panel_keys, float *keys, float *values);
void uattn_avx2_attend(const uattn_panel_job *job, int32_t panel_keys);

/* The set's two attend bodies apart, each on every job and part, with the set's loads: what the tests and
 * uattn-kernel-bench --xsmm check and time one against the other (the set picks per job: uattn_xsmm_wins).
 * uattn_kernels_avx2_fused: the fused register-tile body (avx2/body.h); uattn_kernels_xsmm: the libxsmm GEMM
 * body (avx2/xsmm.c), only where uattn_xsmm_runs_here(). */
extern const uattn_kernels uattn_kernels_avx2_fused;
extern const uattn_kernels uattn_kernels_xsmm;

/* Floats each panel of the set needs (its panel_floats; the generated buckets share the layout). */
size_t uattn_avx2_panel_floats(int32_t panel_keys, int32_t head_dim);

/* The panel layout, for the tests: key i, dim d at keys[d * *key_stride + i] and value i, dim d at
 * values[i * *value_stride + d], both panels starting at the first 64-byte boundary of their buffer. */
void uattn_avx2_layout(int32_t panel_keys, int32_t head_dim, int32_t *key_stride, int32_t *value_stride);

#endif
