/* The bf16 block-128 head-dim-128 avx512bf16 bucket once more, under the names uattn_variant_bf16_*, compiled
 * from the kernel sources of UATTN_KERNEL_VARIANT (kernel_variant.c says how): what `uattn-kernel-bench
 * --variant` times against the library's own bucket of that ISA, on a CPU with AVX512-BF16. Its bodies
 * (avx512bf16/body.h, decode.h, decode_tiled.h and the avx512 and avx2 parts they include) are the variant's;
 * its generic set, probe and conversions are the library's. Its own file: a source includes one bucket. */
#define BUCKET_DTYPE UATTN_BF16
#define BUCKET_BLOCK_SIZE 128
#define BUCKET_HEAD_DIM 128
#define BUCKET_CHUNK_SIZE 0
#define BUCKET_DECODE uattn_variant_bf16_decode
#define BUCKET_DECODE_TILED uattn_variant_bf16_decode_tiled
#define BUCKET_LOAD_TILED uattn_variant_bf16_load_tiled
#define BUCKET_LOAD uattn_variant_bf16_load
#define BUCKET_CAUSAL uattn_variant_bf16_causal
#define BUCKET_SHARED uattn_variant_bf16_shared
#define BUCKET_UNIQUE uattn_variant_bf16_unique
#define BUCKET_ENTRY uattn_variant_bucket_avx512bf16
#include "avx512bf16/bucket.h"
