/* The bf16 block-128 head-dim-128 avx2 bucket once more, under the names uattn_variant_*, compiled from the
 * kernel headers of UATTN_KERNEL_VARIANT (a copy of kernels/ with its bodies edited; by default kernels/
 * itself): what `uattn-kernel-bench --variant` times against the library's own bucket in one process. Only
 * the always-inline bodies the bucket includes (avx2_body.h, avx2_decode.h, avx2_bucket.h) come from the
 * variant; the functions of kernels' .c files (the libxsmm body among them) are the library's. */
#define BUCKET_DTYPE UATTN_BF16
#define BUCKET_BLOCK_SIZE 128
#define BUCKET_HEAD_DIM 128
#define BUCKET_CHUNK_SIZE 0
#define BUCKET_DECODE uattn_variant_decode
#define BUCKET_LOAD uattn_variant_load
#define BUCKET_CAUSAL uattn_variant_causal
#define BUCKET_SHARED uattn_variant_shared
#define BUCKET_UNIQUE uattn_variant_unique
#define BUCKET_ENTRY uattn_variant_bucket
#include "avx2_bucket.h"
