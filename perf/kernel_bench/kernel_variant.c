/* The bf16 block-128 head-dim-128 avx2 bucket once more (the shape uattn-kernel-bench times by default and the
 * one it takes from uattn_variant_bucket), under the names uattn_variant_*, compiled from the
 * kernel sources of UATTN_KERNEL_VARIANT (a copy of kernels/ with its code edited; by default kernels/
 * itself): what `uattn-kernel-bench --variant` times against the library's own bucket in one process. The
 * variant's bucket is its always-inline bodies (avx2/body.h, the headers of common/, avx2/bucket.h) and its libxsmm
 * body (xsmm.c, included here under renamed symbols), so a change to any of them is measured; the rest
 * (avx2/set.c's generic set, the conversions) is the library's. */
#define uattn_xsmm_runs_here uattn_variant_xsmm_runs_here
#define uattn_xsmm_target uattn_variant_xsmm_target
#define uattn_xsmm_attend uattn_variant_xsmm_attend
#define uattn_xsmm_qk uattn_variant_xsmm_qk
#define uattn_xsmm_pv uattn_variant_xsmm_pv
#define uattn_xsmm_products uattn_variant_xsmm_products
#define uattn_xsmm_products_floats uattn_variant_xsmm_products_floats
#include "avx2/xsmm.c"

#define BUCKET_DTYPE UATTN_BF16
#define BUCKET_BLOCK_SIZE 128
#define BUCKET_HEAD_DIM 128
#define BUCKET_CHUNK_SIZE 0
#define BUCKET_DECODE uattn_variant_decode
#define BUCKET_DECODE_TILED uattn_variant_decode_tiled
#define BUCKET_LOAD uattn_variant_load
#define BUCKET_LOAD_TILED uattn_variant_load_tiled
#define BUCKET_CAUSAL uattn_variant_causal
#define BUCKET_SHARED uattn_variant_shared
#define BUCKET_UNIQUE uattn_variant_unique
#define BUCKET_ENTRY uattn_variant_bucket
#include "avx2/bucket.h"
