/* One generated bucket of the avx512 set: included by a source gen/generate.py writes, after it has defined the
 * bucket and its functions' names (as for avx2/bucket.h). The bodies are avx512/body.h's attend, common/panels.h's
 * load (the set's panels are the avx2 set's), avx512/decode.h's decode kernel and on a TILED cache the avx2
 * set's (avx2/decode_tiled.h), with the head dim (and, where the call allows, the dtype and the block size)
 * constant; the entry is every ISA's (bucket_entry.h). The unique part's copy is compiled for its single-row
 * jobs. */
#define AVX512_VEC_ZMM
#include "avx2/avx2.h"
#include "avx512/avx512.h"
#include "avx512/body.h"
#include "avx512/decode.h"
#include "avx2/decode_tiled.h"

#define BUCKET_ISA "avx512"
#define BUCKET_GENERIC uattn_kernels_avx512
#define BUCKET_RUNS_HERE uattn_avx512_runs_here
#define BUCKET_TARGET AVX512_TARGET
#define BUCKET_PANEL_FLOATS uattn_avx2_panel_floats
#define BUCKET_CAPS AVX512_CAPS
#define BUCKET_LOAD_BODY avx2_load_body
#define BUCKET_LOAD_TILED_BODY avx2_load_tiled_body
#define BUCKET_UNIQUE_BODY avx512_attend_body
#define BUCKET_DECODE_BODY avx512_decode_body
#define BUCKET_DECODE_TILED_BODY avx2_decode_tiled_body
#include "bucket_entry.h"

AVX512_TARGET void BUCKET_CAUSAL(const uattn_panel_job *job, int32_t panel_keys) {
  avx512_attend_body(job, panel_keys, BUCKET_HEAD_DIM, 0);
}

AVX512_TARGET void BUCKET_SHARED(const uattn_panel_job *job, int32_t panel_keys) {
  avx512_attend_body(job, panel_keys, BUCKET_HEAD_DIM, 0);
}
