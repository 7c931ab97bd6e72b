/* The avx512 set's decode kernel: the jobs, phases and rules of avx2/decode.h (scores of every head, the
 * softmax, P V; rows in the cache's order, every head in turn; the same prefetches), with the score and
 * P V loops in 16-float vectors (avx512/vec.h), where AVX-512's width and 32 registers halve the
 * instructions a key and give the FMAs twice the independent chains:
 *   scores  WIDE_KEYS keys at a time against up to 4 query vectors: 16 accumulators of 16 lanes over the
 *           head dim, folded to 8 lanes and summed by avx2/decode.h's hadd tree;
 *   softmax avx2/decode.h's (block_softmax: mask, soft cap, ALiBi, online rescale), per head and block;
 *   P V     register tiles of up to 4 vectors x 64 dims, each value row widened as it is used.
 * bf16 rows with a head dim a multiple of 32 are widened 32 elements at a time into even/odd halves (a
 * shift and a mask), so the query vectors and outputs are kept in that order, [evens | odds] for each 32
 * dims, through the call; every dot product and sum has the same terms as in natural order.
 * Needs a head dim that is a multiple of 16; other multiples of 8 take the avx2 kernel. Include after
 * avx512/vec.h, which decides whether this is the AVX-512 kernel or its twin. */
#ifndef UATTN_AVX512_DECODE_H
#define UATTN_AVX512_DECODE_H

#include "avx2/decode.h"
#include "avx512/vec.h"

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

/* <q_i, k_j> for NB <= 4 vectors (q_i at q + i * D) and the WIDE_KEYS rows r[j], as out[4 i + j]. EO: bf16
 * rows widened into even/odd halves, the vectors in that order; else each 16 elements in order. */
V16_INLINE void wide_scores_step(const int NB, const bool EO, uattn_dtype t, const int32_t D, const float *q,
                                 const char *const *r, float *out) {
  const size_t esz = uattn_dtype_size(t);
  v16 a[4][WIDE_KEYS];
  for (int i = 0; i < NB; i++)
    for (int j = 0; j < WIDE_KEYS; j++) a[i][j] = v16_zero();
  int32_t d = 0;
  for (; d + 32 <= D; d += 32) {
    v16 k0[WIDE_KEYS], k1[WIDE_KEYS];
    for (int j = 0; j < WIDE_KEYS; j++) {
      if (EO)
        v16_widen_bf16_eo(r[j] + 2 * (size_t)d, &k0[j], &k1[j]);
      else
        k0[j] = v16_widen(t, r[j] + (size_t)d * esz), k1[j] = v16_widen(t, r[j] + (size_t)(d + 16) * esz);
    }
    for (int i = 0; i < NB; i++) {
      const v16 q0 = v16_load(q + (size_t)i * D + d), q1 = v16_load(q + (size_t)i * D + d + 16);
      for (int j = 0; j < WIDE_KEYS; j++) a[i][j] = v16_fmadd(q1, k1[j], v16_fmadd(q0, k0[j], a[i][j]));
    }
  }
  if (d < D) { /* the last 16 dims (never with EO) */
    v16 k0[WIDE_KEYS];
    for (int j = 0; j < WIDE_KEYS; j++) k0[j] = v16_widen(t, r[j] + (size_t)d * esz);
    for (int i = 0; i < NB; i++) {
      const v16 q0 = v16_load(q + (size_t)i * D + d);
      for (int j = 0; j < WIDE_KEYS; j++) a[i][j] = v16_fmadd(q0, k0[j], a[i][j]);
    }
  }
  __m256 f[4 * WIDE_KEYS];
  for (int x = 0; x < 4 * WIDE_KEYS; x++)
    f[x] = x / WIDE_KEYS < NB ? v16_fold(a[x / WIDE_KEYS][x % WIDE_KEYS]) : _mm256_setzero_ps();
  _mm256_store_ps(out, hsum8x8(f));
  if (NB > 2) _mm256_store_ps(out + 8, hsum8x8(f + 8));
}

/* The score walk of the wide decode kernels (this one's and avx512bf16/body.h's; decode_scores' order, with
 * WIDE_KEYS rows a step): S[g][x][j - j0] for keys [LO, HI), WIDE_KEYS rows at a time (past the last key, the
 * last again), every head in turn (the rows ahead asked for a head's share at a time), every block:
 * STEP(NB, ..., qb, r, out) with NB the block's vectors (a constant), qb its query vectors (head g's block
 * at q + g qstep + x0 qlen elements), r the WIDE_KEYS rows and out 4 WIDE_KEYS floats, vector i's scores at
 * out + WIDE_KEYS i. */
#define WIDE_SCORES(s, k, v, S, q, qstep, qlen, STEP, ...)                                                             \
  do {                                                                                                                 \
    const int32_t ahead_ = decode_rows_ahead(s, DECODE_AHEAD);                                                         \
    begin_scores(s, k, S, ahead_);                                                                                     \
    for (int32_t j_ = (s)->LO; j_ < (s)->HI; j_ += WIDE_KEYS) {                                                        \
      const int32_t keys_ = (s)->HI - j_ < WIDE_KEYS ? (s)->HI - j_ : WIDE_KEYS;                                       \
      for (int32_t g_ = 0; g_ < (s)->heads; g_++) {                                                                    \
        prefetch_ahead(s, k, v, j_ + ahead_, j_ + ahead_ + WIDE_KEYS, g_);                                             \
        const char *r_[WIDE_KEYS];                                                                                     \
        for (int x_ = 0; x_ < WIDE_KEYS; x_++)                                                                         \
          r_[x_] = (k) + (size_t)(j_ + (x_ < keys_ ? x_ : keys_ - 1)) * (s)->step + (size_t)g_ * (s)->head_step;       \
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

/* The scores of every head and block (WIDE_SCORES; q: head g's vectors at q + g * qstep). */
V16_INLINE void wide_scores(const bool EO, const decode_shape *s, uattn_dtype t, const float *q, size_t qstep,
                            const char *k, const char *v, float *S, const int32_t D) {
  WIDE_SCORES(s, k, v, S, q, qstep, D, wide_scores_step, EO, t, D);
}

/* U (<= 4; even with EO) 16-float parts of o_i += sum_{j in [lo, hi)} P[i][j] v_j for NB vectors (P[i][j] at
 * S + i * ld + j - j0, o_i at o + i * D, in the kernel's order), value j's row at v + j * step bytes. */
V16_INLINE void wide_pv_step(const int NB, const int U, const bool EO, uattn_dtype t, const float *S, int32_t ld,
                             int32_t j0, int32_t lo, int32_t hi, const char *v, size_t step, float *o,
                             const int32_t D) {
  const size_t esz = uattn_dtype_size(t);
  v16 a[4][4];
  for (int i = 0; i < NB; i++)
    for (int u = 0; u < U; u++) a[i][u] = v16_load(o + (size_t)i * D + 16 * u);
  for (int32_t j = lo; j < hi; j++) {
    const char *r = v + (size_t)j * step;
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
    wide_pv_step(NB, 4, EO, t, p->S, s->W, s->j0, p->lo, p->hi, p->v + (size_t)d * esz, s->step, p->o + d, D);
  const char *vd = p->v + (size_t)d * esz;
  switch ((D - d) / 16) { /* EO: D is a multiple of 32, so 0 or 2 */
  case 1: wide_pv_step(NB, 1, false, t, p->S, s->W, s->j0, p->lo, p->hi, vd, s->step, p->o + d, D); break;
  case 2: wide_pv_step(NB, 2, EO, t, p->S, s->W, s->j0, p->lo, p->hi, vd, s->step, p->o + d, D); break;
  case 3: wide_pv_step(NB, 3, false, t, p->S, s->W, s->j0, p->lo, p->hi, vd, s->step, p->o + d, D); break;
  default: break;
  }
}

/* P V of every head and block (DECODE_PV_TILES, decode_pv's walk). */
V16_INLINE void wide_pv(const bool EO, const uattn_panel_job *job, const decode_shape *s, uattn_dtype t, const char *v,
                        const float *S, const int32_t D) {
  DECODE_PV_TILES(job, s, v, S, D, wide_pv_block, EO, s, t, D);
}

/* The three phases in the kernel's order of dims (EO: [evens | odds] each 32). */
V16_INLINE void wide_decode_phases(const bool EO, const uattn_panel_job *job, const decode_shape *s, uattn_dtype t,
                                   const void *k_src, const void *v_src, float *scratch, const int32_t D) {
  /* scratch: the query vectors in the kernel's order [heads][n][D] (EO), then the scores S [heads][n][W] */
  const int32_t heads = s->heads, n = s->n;
  float *S = scratch + (size_t)heads * n * D;
  const float *q = job->q;
  size_t qstep = s->hq;
  if (EO) {
    for (int32_t g = 0; g < heads; g++)
      for (int32_t x = 0; x < n; x++) {
        float *qx = scratch + ((size_t)g * n + x) * D;
        memcpy(qx, job->q + g * s->hq + (size_t)x * D, sizeof(float) * (size_t)D);
        eo32_order(qx, D, true);
        eo32_order(job->o + g * s->hq + (size_t)x * D, D, true);
      }
    q = scratch, qstep = (size_t)n * D;
  }
  wide_scores(EO, s, t, q, qstep, k_src, v_src, S, D);
  decode_softmax(job, s, S, D); /* s->eo is false: it only rescales the outputs, whatever their order */
  wide_pv(EO, job, s, t, v_src, S, D);
  if (EO)
    for (int32_t g = 0; g < heads; g++)
      for (int32_t x = 0; x < n; x++) eo32_order(job->o + g * s->hq + (size_t)x * D, D, false);
}

/* decode in kernels.h (the arguments of avx2_decode_body). */
V16_INLINE void avx512_decode_body(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype t,
                                   const void *k_src, const void *v_src, size_t stride, size_t head_stride,
                                   float *scratch, const int32_t D) {
  if (D % 16) { /* 16-float vectors need whole 16s of the head dim */
    avx2_decode_body(job, heads, head_vectors, t, k_src, v_src, stride, head_stride, scratch, D);
    return;
  }
  decode_shape s;
  if (!decode_shape_of(job, heads, head_vectors, t, stride, head_stride, D, &s)) return; /* no vector sees a key */
  s.eo = false; /* avx2/decode.h's 16-dim even/odd order: this kernel keeps its own */
  if (t == UATTN_BF16 && D % 32 == 0)
    wide_decode_phases(true, job, &s, t, k_src, v_src, scratch, D);
  else
    wide_decode_phases(false, job, &s, t, k_src, v_src, scratch, D);
}

#endif
