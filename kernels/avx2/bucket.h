/* One generated bucket of the avx2 set: included by a source gen/generate.py writes, after it has defined
 *   BUCKET_DTYPE, BUCKET_BLOCK_SIZE, BUCKET_HEAD_DIM, BUCKET_CHUNK_SIZE   the bucket;
 *   BUCKET_LOAD, BUCKET_CAUSAL, BUCKET_SHARED, BUCKET_UNIQUE, BUCKET_DECODE its functions' names;
 *   BUCKET_ENTRY                                                         its registry entry's name.
 * The bodies are avx2/body.h's with the head dim (and, where the call allows, the dtype and the block size)
 * constant, so score and P V loops are unrolled to the head dim and the ragged-edge code folds away. The
 * panel layout is the generic avx2 set's. The load, the decode kernels (common/decode8.h, on a TILED cache
 * avx2/decode_tiled.h) and the entry are every ISA's (bucket_entry.h); the three attend functions, below, are
 * separate copies under their own names so a profile shows each part; the unique part's jobs have a single row
 * (one decode row at a time), which its copy is compiled for. The causal and shared parts hand the jobs where
 * the libxsmm GEMM body of xsmm.c measured faster (uattn_xsmm_wins: the job's shape only) to it, over the same
 * panels. */
#include "avx2/avx2.h"
#include "avx2/body.h"
#include "avx2/decode_tiled.h"
#include "avx2/xsmm.h"

#define BUCKET_ISA "avx2"
#define BUCKET_GENERIC uattn_kernels_avx2
#define BUCKET_RUNS_HERE uattn_avx2_runs_here
#define BUCKET_TARGET AVX2_TARGET
#define BUCKET_PANEL_FLOATS uattn_avx2_panel_floats
#define BUCKET_CAPS AVX2_CAPS
#define BUCKET_LOAD_BODY avx2_load_body
#define BUCKET_LOAD_TILED_BODY avx2_load_tiled_body
#define BUCKET_UNIQUE_BODY avx2_attend_body
#define BUCKET_DECODE_BODY avx2_decode_body
#define BUCKET_DECODE_TILED_BODY avx2_decode_tiled_body
#include "bucket_entry.h"

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
