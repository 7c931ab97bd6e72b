/* One generated bucket of the avx2 set: included by a source gen/generate.py writes, after it has defined
 *   BUCKET_DTYPE, BUCKET_BLOCK_SIZE, BUCKET_HEAD_DIM, BUCKET_CHUNK_SIZE   the bucket;
 *   BUCKET_LOAD, BUCKET_CAUSAL, BUCKET_SHARED, BUCKET_UNIQUE, BUCKET_DECODE its functions' names;
 *   BUCKET_ENTRY                                                         its registry entry's name.
 * The bodies are avx2/body.h's with the head dim (and, where the call allows, the dtype and the block size)
 * constant, so score and P V loops are unrolled to the head dim and the ragged-edge code folds away. The
 * panel layout is the generic avx2 set's. The three attend functions are separate copies under their own
 * names so a profile shows each part; the unique part's jobs have a single row (one decode row at a time),
 * which its copy is compiled for. The causal and shared parts hand the jobs where the libxsmm GEMM body of
 * xsmm.c measured faster (uattn_xsmm_wins: the job's shape only) to it, over the same panels. */
#include "avx2/avx2.h"
#include "avx2/body.h"
#include "avx2/decode.h"
#include "avx2/xsmm.h"

#define BUCKET_STR_(x) #x
#define BUCKET_STR(x) BUCKET_STR_(x)

/* External names (hidden by the build's visibility preset), so a profiler sees them. */
void BUCKET_LOAD(uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride, int32_t count,
                 int32_t head_dim, int32_t panel_keys, float *keys, float *values);
void BUCKET_CAUSAL(const uattn_panel_job *job, int32_t panel_keys);
void BUCKET_SHARED(const uattn_panel_job *job, int32_t panel_keys);
void BUCKET_UNIQUE(const uattn_panel_job *job, int32_t panel_keys);
void BUCKET_DECODE(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype dtype,
                   const void *k_src, const void *v_src, size_t stride, size_t head_stride, float *scratch);

AVX2_TARGET void BUCKET_LOAD(uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride, int32_t count,
                             int32_t head_dim, int32_t panel_keys, float *keys, float *values) {
  (void)head_dim; /* BUCKET_HEAD_DIM: the dispatch matched it */
  if (dtype == BUCKET_DTYPE && count == BUCKET_BLOCK_SIZE) /* a whole cache block, the common call */
    avx2_load_body(BUCKET_DTYPE, k_src, v_src, stride, BUCKET_BLOCK_SIZE, BUCKET_HEAD_DIM, panel_keys, keys, values);
  else /* this step's keys (the causal part, in the layer's dtype) or a partial block */
    avx2_load_body(dtype, k_src, v_src, stride, count, BUCKET_HEAD_DIM, panel_keys, keys, values);
}

AVX2_TARGET void BUCKET_CAUSAL(const uattn_panel_job *job, int32_t panel_keys) {
  if (uattn_xsmm_wins(job))
    uattn_xsmm_attend(job, panel_keys);
  else
    avx2_attend_body(job, panel_keys, BUCKET_HEAD_DIM, 0);
}

AVX2_TARGET void BUCKET_SHARED(const uattn_panel_job *job, int32_t panel_keys) {
  if (uattn_xsmm_wins(job))
    uattn_xsmm_attend(job, panel_keys);
  else
    avx2_attend_body(job, panel_keys, BUCKET_HEAD_DIM, 0);
}

AVX2_TARGET void BUCKET_UNIQUE(const uattn_panel_job *job, int32_t panel_keys) {
  if (job->rows == 1)
    avx2_attend_body(job, panel_keys, BUCKET_HEAD_DIM, 1);
  else /* not what the forward sends, but still right */
    avx2_attend_body(job, panel_keys, BUCKET_HEAD_DIM, 0);
}

/* The unique part's decode rows straight from the cache (avx2/decode.h), where the bucket allows it. */
#if BUCKET_HEAD_DIM % 8 == 0 && BUCKET_BLOCK_SIZE <= UATTN_DECODE_MAX_KEYS
AVX2_TARGET void BUCKET_DECODE(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype dtype,
                               const void *k_src, const void *v_src, size_t stride, size_t head_stride,
                               float *scratch) {
  if (dtype == BUCKET_DTYPE)
    avx2_decode_body(job, heads, head_vectors, BUCKET_DTYPE, k_src, v_src, stride, head_stride, scratch,
                     BUCKET_HEAD_DIM);
  else
    avx2_decode_body(job, heads, head_vectors, dtype, k_src, v_src, stride, head_stride, scratch, BUCKET_HEAD_DIM);
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
    "avx2",
    uattn_avx2_runs_here,
    {BUCKET_STR(BUCKET_CAUSAL), BUCKET_STR(BUCKET_SHARED), BUCKET_STR(BUCKET_UNIQUE_KERNEL)},
    {"avx2", BUCKET_LOAD, {BUCKET_CAUSAL, BUCKET_SHARED, BUCKET_UNIQUE}, uattn_avx2_panel_floats, BUCKET_DECODE},
};
