/* The AVX2 + FMA + F16C kernel set for any shape: the bodies of avx2/body.h with the head dim and block size
 * known only at run time (the generated bucket kernels instantiate the same bodies with constants). The
 * probe carries no target attribute, so it runs anywhere. */
#include "avx2/avx2.h"

#include <math.h>
#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <stdatomic.h>

#include "avx2/body.h"
#include "avx2/decode_tiled.h"
#include "avx2/xsmm.h"

int uattn_avx2_runs_here(void) {
  /* probed once: every forward asks, and CPUID traps to the hypervisor in a VM (~10 us each on this one) */
  static _Atomic int state = -1; /* -1: not probed yet */
  int v = atomic_load_explicit(&state, memory_order_relaxed);
  if (v < 0) {
    __builtin_cpu_init();
    /* F16C through CPUID: not every compiler's __builtin_cpu_supports knows it (clang 14 does not); the
     * builtin's avx2 already says the OS saves the ymm registers */
    unsigned a, b, c, d;
    const int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    atomic_store_explicit(&state, v, memory_order_relaxed);
  }
  return v;
}

void uattn_avx2_layout(int32_t panel_keys, int32_t head_dim, int32_t *ks, int32_t *vs) {
  *ks = key_stride(panel_keys);
  *vs = value_stride(head_dim);
}

size_t uattn_avx2_panel_floats(int32_t panel_keys, int32_t head_dim) {
  const size_t k = (size_t)head_dim * key_stride(panel_keys), v = (size_t)panel_keys * value_stride(head_dim);
  return (k > v ? k : v) + 16; /* + the slack align64 may skip */
}

AVX2_TARGET void uattn_avx2_load(uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride, int32_t count,
                                 int32_t head_dim, int32_t panel_keys, float *keys, float *values) {
  avx2_load_body(dtype, k_src, v_src, stride, count, head_dim, panel_keys, keys, values);
}

AVX2_TARGET void uattn_avx2_load_tiled(uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride,
                                       int32_t first, int32_t count, int32_t head_dim, int32_t panel_keys, float *keys,
                                       float *values) {
  avx2_load_tiled_body(dtype, k_src, v_src, stride, first, count, head_dim, panel_keys, keys, values);
}

/* Jobs where the libxsmm GEMM body measured faster (uattn_xsmm_wins: their shape only) go to it. */
AVX2_TARGET void uattn_avx2_attend(const uattn_panel_job *job, int32_t panel_keys) {
  if (uattn_xsmm_wins(job))
    uattn_xsmm_attend(job, panel_keys);
  else
    avx2_attend_body(job, panel_keys, job->head_dim, 0);
}

enum { MAP_EXP, MAP_TANH };

/* y = F(x) over n floats (F constant: MAP_EXP, MAP_TANH), 8 at a time, the tail masked. */
AVX2_INLINE void map8(const int F, const float *x, float *y, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(y + i, F == MAP_EXP ? exp8(v) : tanh8(v));
  }
  if (i < n) {
    const __m256i m = tail_mask((int32_t)(n - i));
    const __m256 v = _mm256_maskload_ps(x + i, m);
    _mm256_maskstore_ps(y + i, m, F == MAP_EXP ? exp8(v) : tanh8(v));
  }
}

AVX2_TARGET void uattn_avx2_exp(const float *x, float *y, size_t n) { map8(MAP_EXP, x, y, n); }

AVX2_TARGET void uattn_avx2_tanh(const float *x, float *y, size_t n) { map8(MAP_TANH, x, y, n); }

AVX2_TARGET static void avx2_decode(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype dtype,
                                    const uattn_decode_src *src, float *scratch) {
  avx2_decode_body(job, heads, head_vectors, dtype, src, scratch, job->head_dim);
}

AVX2_TARGET static void avx2_decode_tiled(const uattn_panel_job *job, int32_t heads, size_t head_vectors,
                                          uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride,
                                          size_t head_stride, float *scratch) {
  avx2_decode_tiled_body(job, heads, head_vectors, dtype, k_src, v_src, stride, head_stride, scratch, job->head_dim);
}

const uattn_kernels uattn_kernels_avx2 = {.name = "avx2",
                                          .load = uattn_avx2_load,
                                          .load_tiled = uattn_avx2_load_tiled,
                                          .attend = {uattn_avx2_attend, uattn_avx2_attend, uattn_avx2_attend},
                                          .panel_floats = uattn_avx2_panel_floats,
                                          .decode = avx2_decode,
                                          .decode_tiled = avx2_decode_tiled,
                                          .caps = UATTN_CAPS_RECORD(AVX2_CAPS)};

/* The fused register-tile body alone, whatever the job's size. */
AVX2_TARGET static void avx2_fused_attend(const uattn_panel_job *job, int32_t panel_keys) {
  avx2_attend_body(job, panel_keys, job->head_dim, 0);
}

const uattn_kernels uattn_kernels_avx2_fused = {.name = "avx2-fused",
                                                .load = uattn_avx2_load,
                                                .attend = {avx2_fused_attend, avx2_fused_attend, avx2_fused_attend},
                                                .panel_floats = uattn_avx2_panel_floats,
                                                .caps = UATTN_CAPS_RECORD(AVX2_CAPS)};

const uattn_kernels uattn_kernels_xsmm = {.name = "xsmm",
                                          .load = uattn_avx2_load,
                                          .attend = {uattn_xsmm_attend, uattn_xsmm_attend, uattn_xsmm_attend},
                                          .panel_floats = uattn_avx2_panel_floats,
                                          .caps = UATTN_CAPS_RECORD(AVX2_CAPS)};

#else /* not x86: the set exists (dispatch.c lists it) but never runs */

int uattn_avx2_runs_here(void) { return 0; }
void uattn_avx2_layout(int32_t panel_keys, int32_t head_dim, int32_t *ks, int32_t *vs) {
  *ks = panel_keys;
  *vs = head_dim;
}
size_t uattn_avx2_panel_floats(int32_t panel_keys, int32_t head_dim) { return (size_t)panel_keys * head_dim; }
void uattn_avx2_exp(const float *x, float *y, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = expf(x[i]);
}
void uattn_avx2_tanh(const float *x, float *y, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = tanhf(x[i]);
}
const uattn_kernels uattn_kernels_avx2 = {.name = "avx2", .caps = UATTN_CAPS_RECORD(AVX2_CAPS)};
const uattn_kernels uattn_kernels_avx2_fused = {.name = "avx2-fused", .caps = UATTN_CAPS_RECORD(AVX2_CAPS)};
const uattn_kernels uattn_kernels_xsmm = {.name = "xsmm", .caps = UATTN_CAPS_RECORD(AVX2_CAPS)};

#endif
