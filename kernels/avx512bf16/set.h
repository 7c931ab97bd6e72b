/* The generic avx512bf16 set, in one of avx512bf16/vec.h's two forms: included by avx512bf16/set.c (vdpbf16ps)
 * and avx512bf16/twin.c (its emulation), each after deciding AVX512_VEC_ZMM, with BF16_SET naming the set
 * and BF16_FN(name) naming its functions apart (external names: the avx512bf16fma set shares the decode
 * kernels, and a profile names them). */
#include "avx512bf16/avx512bf16.h"
#include "avx512bf16/body.h"

BF16_TARGET void BF16_FN(load)(uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride, int32_t count,
                               int32_t head_dim, int32_t panel_keys, float *keys, float *values) {
  bf16_load_body(dtype, k_src, v_src, stride, count, head_dim, panel_keys, keys, values);
}

BF16_TARGET void BF16_FN(load_tiled)(uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride,
                                     int32_t first, int32_t count, int32_t head_dim, int32_t panel_keys, float *keys,
                                     float *values) {
  bf16_load_tiled_body(dtype, k_src, v_src, stride, first, count, head_dim, panel_keys, keys, values);
}

BF16_TARGET void BF16_FN(attend)(const uattn_panel_job *job, int32_t panel_keys) {
  bf16_attend_body(job, panel_keys, job->head_dim);
}

BF16_TARGET void BF16_FN(decode)(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype dtype,
                                 const uattn_decode_src *src, float *scratch) {
  bf16_decode_body(job, heads, head_vectors, dtype, src, scratch, job->head_dim);
}

BF16_TARGET void BF16_FN(decode_tiled)(const uattn_panel_job *job, int32_t heads, size_t head_vectors,
                                       uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride,
                                       size_t head_stride, float *scratch) {
  bf16_decode_tiled_body(job, heads, head_vectors, dtype, k_src, v_src, stride, head_stride, scratch, job->head_dim);
}

const uattn_kernels BF16_SET = {.name = "avx512bf16",
                                .load = BF16_FN(load),
                                .load_tiled = BF16_FN(load_tiled),
                                .attend = {BF16_FN(attend), BF16_FN(attend), BF16_FN(attend)},
                                .panel_floats = uattn_avx512bf16_panel_floats,
                                .decode = BF16_FN(decode),
                                .decode_tiled = BF16_FN(decode_tiled),
                                .caps = UATTN_CAPS_RECORD(AVX512BF16_CAPS)};
