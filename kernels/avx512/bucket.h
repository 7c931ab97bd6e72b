/* One generated bucket of the avx512 set: included by a source gen/generate.py writes, after it has defined
 * the bucket, BUCKET_DECODE and BUCKET_ENTRY (as for avx2/bucket.h) and AVX2_BUCKET_LOAD, AVX2_BUCKET_CAUSAL,
 * AVX2_BUCKET_SHARED and AVX2_BUCKET_UNIQUE, the names of the same bucket's avx2 functions (generated with
 * it). As the generic avx512 set shares the avx2 set's panels and attend, this bucket shares its avx2 twin's:
 * the decode kernel (avx512/decode.h, with the head dim, and where the call allows the dtype, constant) is
 * its own, and the entry is every ISA's (bucket_entry.h). */
#define AVX512_VEC_ZMM
#include "avx2/avx2.h"
#include "avx512/avx512.h"
#include "avx512/decode.h"

#define BUCKET_LOAD AVX2_BUCKET_LOAD
#define BUCKET_CAUSAL AVX2_BUCKET_CAUSAL
#define BUCKET_SHARED AVX2_BUCKET_SHARED
#define BUCKET_UNIQUE AVX2_BUCKET_UNIQUE
#define BUCKET_ISA "avx512"
#define BUCKET_GENERIC uattn_kernels_avx512
#define BUCKET_RUNS_HERE uattn_avx512_runs_here
#define BUCKET_TARGET AVX512_TARGET
#define BUCKET_PANEL_FLOATS uattn_avx2_panel_floats
#define BUCKET_UNSCALED_Q false
#define BUCKET_BF16_INPUTS false
#define BUCKET_DECODE_BODY avx512_decode_body
#include "bucket_entry.h"
