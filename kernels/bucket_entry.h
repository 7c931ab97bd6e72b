/* What every ISA's generated bucket has in the same form: its functions' declarations, the load and the decode
 * kernel as its bodies with the bucket's numbers constant, and its registry entry. Included once by an ISA's
 * bucket.h (kernels/<isa>/bucket.h), which is included once by a source gen/generate.py writes, after
 *   BUCKET_DTYPE, BUCKET_BLOCK_SIZE, BUCKET_HEAD_DIM, BUCKET_CHUNK_SIZE   the bucket (generate.py);
 *   BUCKET_DECODE, BUCKET_ENTRY                                          its decode kernel's and entry's names;
 *   BUCKET_LOAD, BUCKET_CAUSAL, BUCKET_SHARED, BUCKET_UNIQUE             the entry's load and attend functions:
 *       the bucket's own (generate.py names them), or those of the bucket of the ISA it shares (bucket.h);
 *   BUCKET_ISA, BUCKET_RUNS_HERE    the generic set it specializes (its name, a string) and that set's probe;
 *   BUCKET_GENERIC                  that set (a uattn_kernels), whose decode kernel takes other dtypes' calls;
 *   BUCKET_TARGET                   the target attribute of the functions defined here;
 *   BUCKET_PANEL_FLOATS             the panel size of its layout (the generic set's);
 *   BUCKET_CAPS                     the set's capability list (<ISA>_CAPS: kernels.h's uattn_kernel_caps);
 *   BUCKET_LOAD_BODY (optional)     the load body: BUCKET_LOAD is defined here with it (else it is another
 *                                   bucket's);
 *   BUCKET_DECODE_BODY (optional)   the decode body (the arguments of kernels.h's decode, then the head dim):
 *                                   BUCKET_DECODE is defined here with it where the bucket's shape allows one
 *                                   (else, in such a shape, it is another bucket's);
 *   BUCKET_DECODE_TILED_BODY (optional)  the same for kernels.h's decode_tiled (BUCKET_DECODE_TILED); without
 *                                   it BUCKET_HAS_DECODE_TILED says another bucket has one;
 *   BUCKET_LOAD_TILED_BODY (optional)    the same for kernels.h's load_tiled (BUCKET_LOAD_TILED); without it
 *                                   BUCKET_HAS_LOAD_TILED says another bucket has one;
 *   BUCKET_UNIQUE_BODY (optional)   an attend body whose last argument, 1, compiles its copy for single-row
 *                                   jobs: BUCKET_UNIQUE is defined here with it.
 * The ISA's bucket.h defines the other attend functions (their bodies differ in what each part gets), unless
 * its buckets share another ISA's (avx512bf16fma/bucket.h: an entry of other buckets' functions, no bodies). */
#include "kernels.h"

#define BUCKET_STR_(x) #x
#define BUCKET_STR(x) BUCKET_STR_(x)

/* External names (hidden by the build's visibility preset), so a profiler sees them. */
void BUCKET_LOAD(uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride, int32_t count,
                 int32_t head_dim, int32_t panel_keys, float *keys, float *values);
void BUCKET_CAUSAL(const uattn_panel_job *job, int32_t panel_keys);
void BUCKET_SHARED(const uattn_panel_job *job, int32_t panel_keys);
void BUCKET_UNIQUE(const uattn_panel_job *job, int32_t panel_keys);

#if defined(BUCKET_LOAD_BODY)
BUCKET_TARGET void BUCKET_LOAD(uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride, int32_t count,
                               int32_t head_dim, int32_t panel_keys, float *keys, float *values) {
  (void)head_dim;                                          /* BUCKET_HEAD_DIM: the dispatch matched it */
  if (dtype == BUCKET_DTYPE && count == BUCKET_BLOCK_SIZE) /* a whole cache block, the common call */
    BUCKET_LOAD_BODY(BUCKET_DTYPE, k_src, v_src, stride, BUCKET_BLOCK_SIZE, BUCKET_HEAD_DIM, panel_keys, keys, values);
  else /* this step's keys (the causal part, in the layer's dtype) or a partial block */
    BUCKET_LOAD_BODY(dtype, k_src, v_src, stride, count, BUCKET_HEAD_DIM, panel_keys, keys, values);
}
#endif

/* The unique part's jobs have a single row (one decode row at a time), which the body's copy is compiled for. */
#if defined(BUCKET_UNIQUE_BODY)
BUCKET_TARGET void BUCKET_UNIQUE(const uattn_panel_job *job, int32_t panel_keys) {
  if (job->rows == 1)
    BUCKET_UNIQUE_BODY(job, panel_keys, BUCKET_HEAD_DIM, 1);
  else /* not what the forward sends, but still right */
    BUCKET_UNIQUE_BODY(job, panel_keys, BUCKET_HEAD_DIM, 0);
}
#endif

/* The panels from a TILED cache's blocks as they lie, where the ISA has such a load (uattn_load_tiled_fits). */
#if defined(BUCKET_LOAD_TILED_BODY) || defined(BUCKET_HAS_LOAD_TILED)
void BUCKET_LOAD_TILED(uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride, int32_t first,
                       int32_t count, int32_t head_dim, int32_t panel_keys, float *keys, float *values);
#endif
#if defined(BUCKET_LOAD_TILED_BODY)
BUCKET_TARGET void BUCKET_LOAD_TILED(uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride,
                                     int32_t first, int32_t count, int32_t head_dim, int32_t panel_keys, float *keys,
                                     float *values) {
  (void)head_dim; /* BUCKET_HEAD_DIM: the dispatch matched it */
  if (dtype == BUCKET_DTYPE)
    BUCKET_LOAD_TILED_BODY(BUCKET_DTYPE, k_src, v_src, stride, first, count, BUCKET_HEAD_DIM, panel_keys, keys, values);
  else /* as BUCKET_DECODE's below */
    BUCKET_GENERIC.load_tiled(dtype, k_src, v_src, stride, first, count, BUCKET_HEAD_DIM, panel_keys, keys, values);
}
#elif !defined(BUCKET_HAS_LOAD_TILED)
#undef BUCKET_LOAD_TILED
#define BUCKET_LOAD_TILED NULL
#endif

/* The unique part's decode rows straight from the cache, where the set's record allows the bucket's shape
 * (kernels.h's uattn_decode_fits), with the dtype constant too. */
#if BUCKET_HEAD_DIM % UATTN_CAPS_DECODE_DIM(BUCKET_CAPS) == 0 &&                                                       \
    BUCKET_BLOCK_SIZE <= UATTN_CAPS_DECODE_KEYS(BUCKET_CAPS)
void BUCKET_DECODE(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype dtype,
                   const uattn_decode_src *src, float *scratch);
#if defined(BUCKET_DECODE_BODY)
BUCKET_TARGET void BUCKET_DECODE(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype dtype,
                                 const uattn_decode_src *src, float *scratch) {
  if (dtype == BUCKET_DTYPE)
    BUCKET_DECODE_BODY(job, heads, head_vectors, BUCKET_DTYPE, src, scratch, BUCKET_HEAD_DIM);
  else /* a cache of another dtype, which the dispatch never gives a bucket: the generic set's kernel, so that
        * the body is compiled once a bucket (a second instance made a bucket source 1.3-1.8x slower to build) */
    BUCKET_GENERIC.decode(job, heads, head_vectors, dtype, src, scratch);
}
#endif
#define BUCKET_UNIQUE_KERNEL BUCKET_DECODE
#else
#undef BUCKET_DECODE
#define BUCKET_DECODE NULL
#define BUCKET_UNIQUE_KERNEL BUCKET_UNIQUE
#endif

/* The same on a TILED cache, where the ISA has such a kernel and its record allows the shape
 * (uattn_decode_tiled_fits). */
#if (defined(BUCKET_DECODE_TILED_BODY) || defined(BUCKET_HAS_DECODE_TILED)) &&                                         \
    BUCKET_HEAD_DIM % UATTN_CAPS_TILED_DIM(BUCKET_CAPS) == 0 &&                                                        \
    BUCKET_HEAD_DIM % UATTN_CAPS_DECODE_DIM(BUCKET_CAPS) == 0 &&                                                       \
    BUCKET_BLOCK_SIZE <= UATTN_CAPS_DECODE_KEYS(BUCKET_CAPS)
void BUCKET_DECODE_TILED(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype dtype,
                         const void *k_src, const void *v_src, size_t stride, size_t head_stride, float *scratch);
#if defined(BUCKET_DECODE_TILED_BODY)
BUCKET_TARGET void BUCKET_DECODE_TILED(const uattn_panel_job *job, int32_t heads, size_t head_vectors,
                                       uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride,
                                       size_t head_stride, float *scratch) {
  if (dtype == BUCKET_DTYPE)
    BUCKET_DECODE_TILED_BODY(job, heads, head_vectors, BUCKET_DTYPE, k_src, v_src, stride, head_stride, scratch,
                             BUCKET_HEAD_DIM);
  else /* as BUCKET_DECODE's */
    BUCKET_GENERIC.decode_tiled(job, heads, head_vectors, dtype, k_src, v_src, stride, head_stride, scratch);
}
#endif
#define BUCKET_DECODE_TILED_NAME BUCKET_STR(BUCKET_DECODE_TILED)
#else
#undef BUCKET_DECODE_TILED
#define BUCKET_DECODE_TILED NULL
#define BUCKET_DECODE_TILED_NAME NULL
#endif

const uattn_bucket_kernels BUCKET_ENTRY = {
    .block_size = BUCKET_BLOCK_SIZE,
    .head_dim = BUCKET_HEAD_DIM,
    .dtype = BUCKET_DTYPE,
    .chunk_size = BUCKET_CHUNK_SIZE,
    .isa = BUCKET_ISA,
    .runs_here = BUCKET_RUNS_HERE,
    .part_names = {BUCKET_STR(BUCKET_CAUSAL), BUCKET_STR(BUCKET_SHARED), BUCKET_STR(BUCKET_UNIQUE_KERNEL)},
    .decode_tiled_name = BUCKET_DECODE_TILED_NAME,
    .set = {.name = BUCKET_ISA,
            .load = BUCKET_LOAD,
            .load_tiled = BUCKET_LOAD_TILED,
            .attend = {BUCKET_CAUSAL, BUCKET_SHARED, BUCKET_UNIQUE},
            .panel_floats = BUCKET_PANEL_FLOATS,
            .decode = BUCKET_DECODE,
            .decode_tiled = BUCKET_DECODE_TILED,
            .caps = UATTN_CAPS_RECORD(BUCKET_CAPS)},
};
