/* The generic avx512 set, in one of common/vec16.h's two forms: included by avx512/set.c (the zmm kernel) and by
 * avx512/twin.c (its twin), each after deciding AVX512_VEC_ZMM, with AVX512_SET naming the set and AVX512_ATTEND
 * its attend, which the avx512bf16fma set shares (external, declared in avx512/avx512.h). */
#include "avx2/avx2.h"
#include "avx512/avx512.h"
#include "avx512/body.h"
#include "avx512/decode.h"
#include "avx2/decode_tiled.h"

AVX512_TARGET static void avx512_decode(const uattn_panel_job *job, int32_t heads, size_t head_vectors,
                                        uattn_dtype dtype, const uattn_decode_src *src, float *scratch) {
  avx512_decode_body(job, heads, head_vectors, dtype, src, scratch, job->head_dim);
}

/* On a TILED cache, the avx2 set's kernel (its 8-float products; no 16-lane one yet). */
AVX512_TARGET static void avx512_decode_tiled(const uattn_panel_job *job, int32_t heads, size_t head_vectors,
                                              uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride,
                                              size_t head_stride, float *scratch) {
  avx2_decode_tiled_body(job, heads, head_vectors, dtype, k_src, v_src, stride, head_stride, scratch, job->head_dim);
}

AVX512_TARGET void AVX512_ATTEND(const uattn_panel_job *job, int32_t panel_keys) {
  avx512_attend_body(job, panel_keys, job->head_dim, 0);
}

const uattn_kernels AVX512_SET = {.name = "avx512",
                                  .load = uattn_avx2_load,
                                  .load_tiled = uattn_avx2_load_tiled,
                                  .attend = {AVX512_ATTEND, AVX512_ATTEND, AVX512_ATTEND},
                                  .panel_floats = uattn_avx2_panel_floats,
                                  .decode = avx512_decode,
                                  .decode_tiled = avx512_decode_tiled,
                                  .caps = UATTN_CAPS_RECORD(AVX512_CAPS)};
