/* uattn-experiments pipes (pipes.c): loops of 12 vdpbf16ps and 6 of another instruction. */
#ifndef UATTN_PERF_EXPERIMENTS_PIPES_H
#define UATTN_PERF_EXPERIMENTS_PIPES_H

enum pipes_kind {
  PIPES_DOT, /* the dot products alone: the baseline */
  PIPES_DOT_BCAST,
  PIPES_DOT_LOADED,
  PIPES_PERMT2W,
  PIPES_UNPACK,
  PIPES_PERMB,
  PIPES_PERMT2B,
  PIPES_SHUF128,
  PIPES_SHUFPS,
  PIPES_BLEND,
  PIPES_ADD,
  PIPES_MAX,
  PIPES_MUL,
  PIPES_FMA,
  PIPES_CVT,
  PIPES_SCALEF,
  PIPES_ROUND,
  PIPES_BCAST_ADD,
  PIPES_KINDS
};

extern const char *const pipes_names[PIPES_KINDS];

/* iters loops of the kind (AVX512-BF16 and AVX512-VBMI only: the caller checks); sink: their results. */
void pipes_loop(int kind, long iters, float sink[16]);

#endif
