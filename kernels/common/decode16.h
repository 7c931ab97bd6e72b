/* The parts of the 16-lane decode phases that the avx512 and avx512bf16 kernels share: the score walk
 * WIDE_KEYS rows a step (WIDE_SCORES), P V in 16-float parts (wide_pv) and the [evens | odds] order of bf16
 * rows widened 32 elements at a time (eo32_order). Include after common/vec16.h's decision (AVX512_VEC_ZMM or
 * not). */
#ifndef UATTN_COMMON_DECODE16_H
#define UATTN_COMMON_DECODE16_H

#include "common/decode_shape.h"
#include "common/vec16.h"

enum { WIDE_KEYS = 4 }; /* keys a score step */

/* Each 32 floats of a (n of them, n a multiple of 32) into [evens | odds] (to_eo), or back. */
static inline void eo32_order(float *a, int32_t n, bool to_eo) {
  for (int32_t d = 0; d < n; d += 32) {
    float t[32];
    memcpy(t, a + d, sizeof t);
    for (int i = 0; i < 16; i++) {
      if (to_eo)
        a[d + i] = t[2 * i], a[d + 16 + i] = t[2 * i + 1];
      else
        a[d + 2 * i] = t[i], a[d + 2 * i + 1] = t[16 + i];
    }
  }
}

/* The score walk of the wide decode kernels (avx512/decode.h's and avx512bf16/decode.h's; decode_scores' order, with
 * WIDE_KEYS rows a step): S[g][x][j - j0] for keys [LO, HI), WIDE_KEYS rows at a time (past the last key, the
 * last again), every head in turn (the rows ahead asked for a head's share at a time), every block:
 * STEP(NB, ..., qb, r, out) with NB the block's vectors (a constant), qb its query vectors (head g's block
 * at q + g qstep + x0 qlen elements), r the WIDE_KEYS rows and out 4 WIDE_KEYS floats, vector i's scores at
 * out + WIDE_KEYS i. */
#define WIDE_SCORES(s, S, q, qstep, qlen, STEP, ...)                                                                   \
  do {                                                                                                                 \
    const int32_t ahead_ = decode_rows_ahead(s, DECODE_AHEAD);                                                         \
    begin_scores(s, S, ahead_);                                                                                        \
    for (int32_t j_ = (s)->LO; j_ < (s)->HI; j_ += WIDE_KEYS) {                                                        \
      const int32_t keys_ = (s)->HI - j_ < WIDE_KEYS ? (s)->HI - j_ : WIDE_KEYS;                                       \
      const char *a_[WIDE_KEYS];                                                                                       \
      const int32_t na_ = ahead_rows(s, j_ + ahead_, j_ + ahead_ + WIDE_KEYS, a_);                                     \
      for (int32_t g_ = 0; g_ < (s)->heads; g_++) {                                                                    \
        prefetch_rows(s, a_, na_, g_);                                                                                 \
        const char *r_[WIDE_KEYS];                                                                                     \
        for (int x_ = 0; x_ < WIDE_KEYS; x_++)                                                                         \
          r_[x_] = decode_row(s, (s)->kb, j_ + (x_ < keys_ ? x_ : keys_ - 1)) + (size_t)g_ * (s)->head_step;           \
        for (int32_t b_ = 0; b_ < (s)->blocks; b_++) {                                                                 \
          _Alignas(32) float p_[4 * WIDE_KEYS];                                                                        \
          DECODE_BY_NB((s)->nb[b_], STEP, __VA_ARGS__, (q) + (size_t)g_ * (qstep) + (size_t)(s)->x0[b_] * (qlen), r_,  \
                       p_);                                                                                            \
          float *Sb_ = (S) + ((size_t)g_ * (s)->n + (s)->x0[b_]) * (s)->W + (j_ - (s)->j0);                            \
          for (int i_ = 0; i_ < (s)->nb[b_]; i_++)                                                                     \
            memcpy(Sb_ + (size_t)i_ * (s)->W, p_ + WIDE_KEYS * i_, sizeof(float) * (size_t)keys_);                     \
        }                                                                                                              \
      }                                                                                                                \
    }                                                                                                                  \
  } while (0)

/* U (<= 4; even with EO) 16-float parts of o_i += sum_{j in [lo, hi)} P[i][j] v_j for NB vectors (P[i][j] at
 * S + i * ld + j - j0, o_i at o + i * D, in the kernel's order), value j's row at v + j * step bytes; pf (0:
 * none) the bytes from each row's parts to where the walk reads next (avx512/decode.h's wide_fused), each
 * line asked for into L1. */
V16_INLINE void wide_pv_step(const int NB, const int U, const bool EO, uattn_dtype t, const float *S, int32_t ld,
                             int32_t j0, int32_t lo, int32_t hi, const char *v, size_t step, float *o, const int32_t D,
                             intptr_t pf) {
  const size_t esz = uattn_dtype_size(t);
  v16 a[4][4];
  for (int i = 0; i < NB; i++)
    for (int u = 0; u < U; u++) a[i][u] = v16_load(o + (size_t)i * D + 16 * u);
  for (int32_t j = lo; j < hi; j++) {
    const char *r = v + (size_t)j * step;
    for (size_t x = 0; pf && x < (size_t)(16 * U) * esz; x += 64)
      _mm_prefetch((const char *)((uintptr_t)r + (uintptr_t)pf) + x, _MM_HINT_T0);
    v16 w[4];
    for (int u = 0; u < U; u++) {
      if (!EO)
        w[u] = v16_widen(t, r + (size_t)(16 * u) * esz);
      else if (u % 2 == 0)
        v16_widen_bf16_eo(r + (size_t)(32 * u), &w[u], &w[u + 1]); /* 32 elements: parts u and u + 1 */
    }
    for (int i = 0; i < NB; i++) {
      const v16 p = v16_set1(S[(size_t)i * ld + (j - j0)]);
      for (int u = 0; u < U; u++) a[i][u] = v16_fmadd(p, w[u], a[i][u]);
    }
  }
  for (int i = 0; i < NB; i++)
    for (int u = 0; u < U; u++) v16_store(o + (size_t)i * D + 16 * u, a[i][u]);
}

/* One block's P V step p (keys [p->lo, p->hi) of NB vectors of one head into its outputs), 64 dims at a time. */
V16_INLINE void wide_pv_block(const int NB, const bool EO, const decode_shape *s, uattn_dtype t, const int32_t D,
                              const pv_step *p) {
  const size_t esz = uattn_dtype_size(t);
  int32_t d = 0;
  for (; d + 64 <= D; d += 64)
    wide_pv_step(NB, 4, EO, t, p->S, s->W, p->j0, p->lo, p->hi, p->v + (size_t)d * esz, s->step, p->o + d, D, 0);
  const char *vd = p->v + (size_t)d * esz;
  switch ((D - d) / 16) { /* EO: D is a multiple of 32, so 0 or 2 */
  case 1: wide_pv_step(NB, 1, false, t, p->S, s->W, p->j0, p->lo, p->hi, vd, s->step, p->o + d, D, 0); break;
  case 2: wide_pv_step(NB, 2, EO, t, p->S, s->W, p->j0, p->lo, p->hi, vd, s->step, p->o + d, D, 0); break;
  case 3: wide_pv_step(NB, 3, false, t, p->S, s->W, p->j0, p->lo, p->hi, vd, s->step, p->o + d, D, 0); break;
  default: break;
  }
}

/* P V of every head and block (DECODE_PV_TILES, decode_pv's walk). */
V16_INLINE void wide_pv(const bool EO, const uattn_panel_job *job, const decode_shape *s, uattn_dtype t, const float *S,
                        const int32_t D) {
  DECODE_PV_TILES(job, s, S, D, wide_pv_block, EO, s, t, D);
}

#endif
