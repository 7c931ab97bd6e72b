/* The plan of the fused attend bodies (avx2/body.h's, avx512/body.h's, avx512bf16/body.h's): chunks of KC keys
 * that stay in L1/L2 while every block of up to QB query vectors passes over them, DB dims a partial score,
 * and CHAINS(NB) FMA chains an accumulator so small blocks still keep the FMA units busy. */
#ifndef UATTN_COMMON_ATTEND_PLAN_H
#define UATTN_COMMON_ATTEND_PLAN_H

#include "common/vec8.h"

enum {
  QB = 6,   /* query vectors per block: 6 x 16 keys = 12 accumulators, + 2 key vectors + 1 broadcast */
  KC = 128, /* keys per chunk: the chunk's scores of a block fit a small stack tile */
  DB = 32,  /* dims per partial dot product (see avx2/body.h's score_tile) */
};

/* Independent FMA chains per accumulator: Zen 3 runs two 4-cycle FMAs a cycle, so a tile needs 8 chains in
 * flight. From 4 vectors up, the 2 NB accumulators of a tile are enough; smaller blocks (a decode with
 * fewer than 4 heads a KV head, MHA) split each sum over 2 or 4 chains (dims for scores, keys for P V)
 * and add them at the end. */
#define CHAINS(NB) ((NB) >= 4 ? 1 : (NB) == 1 ? 4 : 2)

/* Each accumulator's C = CHAINS(NB) chains (a[c][i][w] for NB vectors and W vectors of 8) summed into
 * a[0][i][w], in the one order every split sum of the set uses: (a0 + a1) + (a2 + a3). */
AVX2_INLINE void sum_chains(const int C, const int NB, const int W, __m256 (*a)[QB][2]) {
  for (int i = 0; i < NB; i++)
    for (int w = 0; w < W; w++) {
      if (C == 4)
        a[0][i][w] = _mm256_add_ps(_mm256_add_ps(a[0][i][w], a[1][i][w]), _mm256_add_ps(a[2][i][w], a[3][i][w]));
      if (C == 2) a[0][i][w] = _mm256_add_ps(a[0][i][w], a[1][i][w]);
    }
}

/* A call's job and its panels, for the blocks of an fp32 attend. */
typedef struct attend_ctx {
  const uattn_panel_job *job;
  const float *kt, *vp;
  int32_t P, Dv;
} attend_ctx;

/* Keys [0, the returned count) are all that the first `rows` rows of the job see of its panel. */
AVX2_INLINE int32_t keys_seen(const uattn_panel_job *job, int32_t rows) {
  int32_t kmax = 0;
  for (int32_t r = 0; r < rows; r++) {
    const int32_t hi = job->visible[r] < job->num_keys ? job->visible[r] : job->num_keys;
    if (hi > kmax) kmax = hi;
  }
  return kmax;
}

/* The plan of the fused attend bodies (avx2/body.h's and avx512bf16/body.h's) for n query vectors against the
 * kmax keys they see: chunks of KC keys in turn, and in each, blocks of at most QB vectors, as even as they
 * go (8 heads are 4 + 4, not 6 + 2: a block of 2 reloads every key for a quarter of the FMAs):
 * BLOCK(NB, D, ctx, x0, c0, c1) for vectors [x0, x0 + NB) and keys [c0, c1), NB a constant (one instance
 * per block size, each with its tiles in registers). */
#define ATTEND_BLOCKS(n, kmax, BLOCK, D, ctx)                                                                          \
  do {                                                                                                                 \
    const int32_t n_ = (n), blocks_ = (n_ + QB - 1) / QB, small_ = n_ / blocks_, big_ = n_ % blocks_;                  \
    for (int32_t c0_ = 0; c0_ < (kmax); c0_ += KC) {                                                                   \
      const int32_t c1_ = (kmax)-c0_ < KC ? (kmax) : c0_ + KC;                                                         \
      for (int32_t b_ = 0, x0_ = 0; b_ < blocks_; b_++) {                                                              \
        const int32_t nb_ = small_ + (b_ < big_);                                                                      \
        switch (nb_) {                                                                                                 \
        case 1: BLOCK(1, D, ctx, x0_, c0_, c1_); break;                                                                \
        case 2: BLOCK(2, D, ctx, x0_, c0_, c1_); break;                                                                \
        case 3: BLOCK(3, D, ctx, x0_, c0_, c1_); break;                                                                \
        case 4: BLOCK(4, D, ctx, x0_, c0_, c1_); break;                                                                \
        case 5: BLOCK(5, D, ctx, x0_, c0_, c1_); break;                                                                \
        default: BLOCK(QB, D, ctx, x0_, c0_, c1_); break;                                                              \
        }                                                                                                              \
        x0_ += nb_;                                                                                                    \
      }                                                                                                                \
    }                                                                                                                  \
  } while (0)

#endif
