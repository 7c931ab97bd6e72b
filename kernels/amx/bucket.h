/* One generated bucket of the amx set (bf16 and fp8 caches): avx512bf16/bucket.h's (its load, load_tiled and
 * decode kernels, the same panels), with the amx set as the generic one, its probe and target, and amx/body.h's
 * attend at the bucket's head dim. */
#define AMX_TILE_HW
#define AVX512_VEC_ZMM
#include "amx/amx.h"
#include "amx/body.h"

#define BUCKET_ISA "amx"
#define BUCKET_GENERIC uattn_kernels_amx
#define BUCKET_RUNS_HERE uattn_amx_runs_here
#define BUCKET_TARGET AMX_TARGET
#define BUCKET_ATTEND_BODY amx_attend_body
#define BUCKET_CAPS AMX_CAPS
#include "avx512bf16/bucket.h"
