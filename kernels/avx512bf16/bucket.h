/* One generated bucket of the avx512bf16 set (bf16 and fp8 caches, whose values are all exact in bf16): included
 * by a source gen/generate.py writes, after it has defined what avx2/bucket.h takes (the bucket, BUCKET_LOAD,
 * BUCKET_CAUSAL, BUCKET_SHARED, BUCKET_UNIQUE, BUCKET_DECODE, BUCKET_ENTRY). The bodies are avx512bf16/body.h's
 * with the head dim constant (and, where the call allows, the dtype and the block size), in the generic set's
 * panel layout; the load, the decode kernel and the entry are every ISA's (bucket_entry.h), and the three
 * attend functions, below, copies under their own names so a profile shows each part. An fp8 bucket's load
 * widens the codes exactly (bf16_stage) and its decode kernel takes its fp8 path (vpermi2b lookups) where the
 * head dim is a multiple of 64, else its wide path; its decode_tiled is decode_tiled.h's with the head dim constant, its load_tiled body.h's; the cache's k_scale and v_scale are the forward's, as for
 * the generic set. */
#define AVX512_VEC_ZMM
#include "avx512bf16/avx512bf16.h"
#include "avx512bf16/body.h"

#if !defined(BUCKET_ISA) /* amx/bucket.h's buckets are these with its own set, probe, target and attend body */
#define BUCKET_ISA "avx512bf16"
#define BUCKET_GENERIC uattn_kernels_avx512bf16
#define BUCKET_RUNS_HERE uattn_avx512bf16_runs_here
#define BUCKET_TARGET BF16_TARGET
#define BUCKET_ATTEND_BODY bf16_attend_body
#define BUCKET_CAPS AVX512BF16_CAPS
#endif
#define BUCKET_PANEL_FLOATS uattn_avx512bf16_panel_floats
#define BUCKET_LOAD_BODY bf16_load_body
#define BUCKET_LOAD_TILED_BODY bf16_load_tiled_body
#define BUCKET_DECODE_BODY bf16_decode_body
#define BUCKET_DECODE_TILED_BODY bf16_decode_tiled_body
#include "bucket_entry.h"

BUCKET_TARGET void BUCKET_CAUSAL(const uattn_panel_job *job, int32_t panel_keys) {
  BUCKET_ATTEND_BODY(job, panel_keys, BUCKET_HEAD_DIM);
}

BUCKET_TARGET void BUCKET_SHARED(const uattn_panel_job *job, int32_t panel_keys) {
  BUCKET_ATTEND_BODY(job, panel_keys, BUCKET_HEAD_DIM);
}

BUCKET_TARGET void BUCKET_UNIQUE(const uattn_panel_job *job, int32_t panel_keys) {
  BUCKET_ATTEND_BODY(job, panel_keys, BUCKET_HEAD_DIM);
}
