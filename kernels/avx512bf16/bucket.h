/* One generated bucket of the avx512bf16 set (bf16 caches only): included by a source gen/generate.py
 * writes, after it has defined what avx2/bucket.h takes (the bucket, BUCKET_LOAD, BUCKET_CAUSAL,
 * BUCKET_SHARED, BUCKET_UNIQUE, BUCKET_DECODE, BUCKET_ENTRY). The bodies are avx512bf16/body.h's with the
 * head dim constant (and, where the call allows, the dtype and the block size), in the generic set's panel
 * layout; the three attend functions are copies under their own names so a profile shows each part. */
#define AVX512_VEC_ZMM
#include "avx512bf16/avx512bf16.h"
#include "avx512bf16/body.h"

#define BUCKET_STR_(x) #x
#define BUCKET_STR(x) BUCKET_STR_(x)

/* External names (hidden by the build's visibility preset), so a profiler sees them. */
void BUCKET_LOAD(uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride, int32_t count,
                 int32_t head_dim, int32_t panel_keys, float *keys, float *values);
void BUCKET_CAUSAL(const uattn_panel_job *job, int32_t panel_keys);
void BUCKET_SHARED(const uattn_panel_job *job, int32_t panel_keys);
void BUCKET_UNIQUE(const uattn_panel_job *job, int32_t panel_keys);

BF16_TARGET void BUCKET_LOAD(uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride, int32_t count,
                             int32_t head_dim, int32_t panel_keys, float *keys, float *values) {
  (void)head_dim; /* BUCKET_HEAD_DIM: the dispatch matched it */
  if (dtype == BUCKET_DTYPE && count == BUCKET_BLOCK_SIZE) /* a whole cache block, the common call */
    bf16_load_body(BUCKET_DTYPE, k_src, v_src, stride, BUCKET_BLOCK_SIZE, BUCKET_HEAD_DIM, panel_keys, keys, values);
  else /* this step's keys (the causal part, in the layer's dtype) or a partial block */
    bf16_load_body(dtype, k_src, v_src, stride, count, BUCKET_HEAD_DIM, panel_keys, keys, values);
}

BF16_TARGET void BUCKET_CAUSAL(const uattn_panel_job *job, int32_t panel_keys) {
  bf16_attend_body(job, panel_keys, BUCKET_HEAD_DIM);
}

BF16_TARGET void BUCKET_SHARED(const uattn_panel_job *job, int32_t panel_keys) {
  bf16_attend_body(job, panel_keys, BUCKET_HEAD_DIM);
}

BF16_TARGET void BUCKET_UNIQUE(const uattn_panel_job *job, int32_t panel_keys) {
  bf16_attend_body(job, panel_keys, BUCKET_HEAD_DIM);
}

/* The unique part's decode rows straight from the cache, where the bucket allows it. */
#if BUCKET_HEAD_DIM % 8 == 0 && BUCKET_BLOCK_SIZE <= UATTN_DECODE_MAX_KEYS
void BUCKET_DECODE(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype dtype,
                   const void *k_src, const void *v_src, size_t stride, size_t head_stride, float *scratch);

BF16_TARGET void BUCKET_DECODE(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype dtype,
                               const void *k_src, const void *v_src, size_t stride, size_t head_stride,
                               float *scratch) {
  if (dtype == BUCKET_DTYPE)
    bf16_decode_body(job, heads, head_vectors, BUCKET_DTYPE, k_src, v_src, stride, head_stride, scratch,
                     BUCKET_HEAD_DIM);
  else
    bf16_decode_body(job, heads, head_vectors, dtype, k_src, v_src, stride, head_stride, scratch, BUCKET_HEAD_DIM);
}
#define BUCKET_UNIQUE_KERNEL BUCKET_DECODE
#else
#define BUCKET_DECODE NULL
#define BUCKET_UNIQUE_KERNEL BUCKET_UNIQUE
#endif

const uattn_bucket_kernels BUCKET_ENTRY = {
    BUCKET_BLOCK_SIZE,
    BUCKET_HEAD_DIM,
    BUCKET_DTYPE,
    BUCKET_CHUNK_SIZE,
    "avx512bf16",
    uattn_avx512bf16_runs_here,
    {BUCKET_STR(BUCKET_CAUSAL), BUCKET_STR(BUCKET_SHARED), BUCKET_STR(BUCKET_UNIQUE_KERNEL)},
    {"avx512bf16", BUCKET_LOAD, {BUCKET_CAUSAL, BUCKET_SHARED, BUCKET_UNIQUE}, uattn_avx512bf16_panel_floats,
     BUCKET_DECODE},
};
