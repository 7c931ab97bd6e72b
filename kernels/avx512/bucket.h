/* One generated bucket of the avx512 set: included by a source gen/generate.py writes, after it has defined
 * what avx2/bucket.h takes (the bucket, BUCKET_DECODE, BUCKET_ENTRY) and AVX2_BUCKET_LOAD, AVX2_BUCKET_CAUSAL,
 * AVX2_BUCKET_SHARED and AVX2_BUCKET_UNIQUE, the names of the same bucket's avx2 functions (generated with
 * it). As the generic avx512 set shares the avx2 set's panels and attend, this bucket shares its avx2 twin's:
 * the decode kernel (avx512/decode.h, with the head dim, and where the call allows the dtype, constant) is
 * its own. */
#define AVX512_VEC_ZMM
#include "avx2/avx2.h"
#include "avx512/avx512.h"
#include "avx512/decode.h"

#define BUCKET_STR_(x) #x
#define BUCKET_STR(x) BUCKET_STR_(x)

void AVX2_BUCKET_LOAD(uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride, int32_t count,
                      int32_t head_dim, int32_t panel_keys, float *keys, float *values);
void AVX2_BUCKET_CAUSAL(const uattn_panel_job *job, int32_t panel_keys);
void AVX2_BUCKET_SHARED(const uattn_panel_job *job, int32_t panel_keys);
void AVX2_BUCKET_UNIQUE(const uattn_panel_job *job, int32_t panel_keys);

#if BUCKET_HEAD_DIM % 8 == 0 && BUCKET_BLOCK_SIZE <= UATTN_DECODE_MAX_KEYS
void BUCKET_DECODE(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype dtype,
                   const void *k_src, const void *v_src, size_t stride, size_t head_stride, float *scratch);

AVX512_TARGET void BUCKET_DECODE(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype dtype,
                                 const void *k_src, const void *v_src, size_t stride, size_t head_stride,
                                 float *scratch) {
  if (dtype == BUCKET_DTYPE)
    avx512_decode_body(job, heads, head_vectors, BUCKET_DTYPE, k_src, v_src, stride, head_stride, scratch,
                       BUCKET_HEAD_DIM);
  else
    avx512_decode_body(job, heads, head_vectors, dtype, k_src, v_src, stride, head_stride, scratch, BUCKET_HEAD_DIM);
}
#define BUCKET_UNIQUE_KERNEL BUCKET_DECODE
#else
#define BUCKET_DECODE NULL
#define BUCKET_UNIQUE_KERNEL AVX2_BUCKET_UNIQUE
#endif

const uattn_bucket_kernels BUCKET_ENTRY = {
    BUCKET_BLOCK_SIZE,
    BUCKET_HEAD_DIM,
    BUCKET_DTYPE,
    BUCKET_CHUNK_SIZE,
    "avx512",
    uattn_avx512_runs_here,
    {BUCKET_STR(AVX2_BUCKET_CAUSAL), BUCKET_STR(AVX2_BUCKET_SHARED), BUCKET_STR(BUCKET_UNIQUE_KERNEL)},
    {"avx512", AVX2_BUCKET_LOAD, {AVX2_BUCKET_CAUSAL, AVX2_BUCKET_SHARED, AVX2_BUCKET_UNIQUE}, uattn_avx2_panel_floats,
     BUCKET_DECODE},
};
