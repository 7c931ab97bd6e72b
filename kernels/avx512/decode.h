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
 * Rows in natural order (f16, f32, fp8, bf16 at head dims that are not multiples of 32) take a fused walk
 * instead (wide_fused): avx512bf16/decode.h's bf16_fused with fp32 FMAs, each head's share of 16 rows scored
 * (wide_score4: 4 rows x up to 4 vectors, summed by v16_sum16's lane tree), through the online softmax
 * (wide_softmax_cols) and into P V (wide_pv_step) before the next share, each line asking for its place in
 * its stream's next share into L1; the tree, the softmax and the next share's distance are the bf16 walks'
 * too. f16 Llama-3-8B decodes on a Zen 5 core, phases against the walk (uattn-bench, three rounds
 * alternated): NHD 1 x 32k 10.1 -> 5.4 ms, HND 9.0 -> 6.5 (uattn-kernel-bench --decode-layouts, 1 row, ns a
 * key and KV head: hot 21.4 -> 16.7, NHD cold 32.1 -> 22.0, a plain read 17.7).
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

/* The scores of every head and block (WIDE_SCORES; q: head g's vectors at q + g * qstep). */
V16_INLINE void wide_scores(const bool EO, const decode_shape *s, uattn_dtype t, const float *q, size_t qstep, float *S,
                            const int32_t D) {
  WIDE_SCORES(s, S, q, qstep, D, wide_scores_step, EO, t, D);
}

/* U (<= 4; even with EO) 16-float parts of o_i += sum_{j in [lo, hi)} P[i][j] v_j for NB vectors (P[i][j] at
 * S + i * ld + j - j0, o_i at o + i * D, in the kernel's order), value j's row at v + j * step bytes; pf (0:
 * none) the bytes from each row's parts to where the walk reads next (wide_fused), each line asked for into
 * L1. */
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

/* The three phases in the kernel's order of dims (EO: [evens | odds] each 32). */
V16_INLINE void wide_decode_phases(const bool EO, const uattn_panel_job *job, const decode_shape *s, uattn_dtype t,
                                   float *scratch, const int32_t D) {
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
  wide_scores(EO, s, t, q, qstep, S, D);
  decode_softmax(job, s, S, D); /* s->order is DECODE_NATURAL: it only rescales the outputs, whatever their order */
  wide_pv(EO, job, s, t, S, D);
  if (EO)
    for (int32_t g = 0; g < heads; g++)
      for (int32_t x = 0; x < n; x++) eo32_order(job->o + g * s->hq + (size_t)x * D, D, false);
}

/* ---- the fused walk's parts (this set's and avx512bf16/decode.h's) ---------------------------------------- */

/* Keys of a head's share in the fused walks (a TILED tile's, decode_tiled.h); fp8 rows' walks take twice as
 * many (avx512bf16/decode.h's bf16_fused). */
enum { DECODE_SHARE_KEYS = 16 };

/* The 16 sums of a[0..15] as one vector: lane 4 q + l holds the sum of a[(0, 8, 4, 12)[q] + (0, 2, 1, 3)[l]]
 * (what the tree's moves give; the caller puts each accumulator where its sum should come out). Each level
 * halves the vectors: quarters, then halves of quarters, then pairs of lanes, added. At the first and third
 * levels one operand of each add is x's first half and y's second (halves of the vector, of each quarter): a
 * blend, where a shuffle took the shuffle units the rest of the tree is bound by. 12 of its 30 shuffles are
 * blends: the hot decode at GQA 4, 1 and 4 rows, 1.5-3.5% faster (alternated). */
V16_INLINE v16 v16_sum16(v16 a[16]) {
  v16 b[8], c[4], e[2];
  for (int k = 0; k < 8; k++) b[k] = v16_add(V16_BLEND(a[k], a[k + 8], 0xff00), V16_SHUF128(a[k], a[k + 8], 0x4e));
  for (int k = 0; k < 4; k++) c[k] = v16_add(V16_SHUF128(b[k], b[k + 4], 0x88), V16_SHUF128(b[k], b[k + 4], 0xdd));
  for (int k = 0; k < 2; k++) e[k] = v16_add(V16_BLEND(c[k], c[k + 2], 0xcccc), V16_SHUFPS(c[k], c[k + 2], 0x4e));
  return v16_add(V16_SHUFPS(e[0], e[1], 0x88), V16_SHUFPS(e[0], e[1], 0xdd));
}

/* Where the score steps (wide_score4, avx512bf16/decode.h's bf16_score4) put the accumulator of vector i
 * and row j, so that v16_sum16 gives vector i's 4 sums in quarter i, in the rows' order. */
static const int sum16_slot[4][4] = {{0, 2, 1, 3}, {8, 10, 9, 11}, {4, 6, 5, 7}, {12, 14, 13, 15}};

/* The 4-row score steps' sums (v16_sum16 of accumulators in sum16_slot) to NB vectors' S rows (vector i's at
 * S + i * ld): each quarter straight to its row, or (keys < 4: a ragged end) its first `keys`. */
V16_INLINE void sum16_store(const int NB, v16 sums, float *S, size_t ld, int32_t keys) {
  if (keys == 4) { /* each vector's quarter straight to its row */
    V16_STORE_QUARTER(S, sums, 0);
    if (NB > 1) V16_STORE_QUARTER(S + ld, sums, 1);
    if (NB > 2) V16_STORE_QUARTER(S + 2 * ld, sums, 2);
    if (NB > 3) V16_STORE_QUARTER(S + 3 * ld, sums, 3);
    return;
  }
  _Alignas(64) float p[16];
  v16_store(p, sums);
  for (int i = 0; i < NB; i++) memcpy(S + (size_t)i * ld, p + 4 * i, sizeof(float) * (size_t)keys);
}

/* The maximum of row s (columns [j0, j1), j0 and j1 multiples of 8 apart) after the rule v and the soft cap
 * (row_rules_max's, which masks the blocks of 8 that [lo, hi) cuts and writes back what a rule changed).
 * Without cap and slope only the cut blocks at the ends go through it; the whole blocks between take a
 * 16-lane max (a max is the same in any order), so a decode row takes half the max instructions. */
V16_INLINE float wide_row_max(float *s, int32_t j0, int32_t j1, const vec_rule *v, float cap) {
  const int32_t a = v->lo > j0 ? j0 + ((v->lo - j0 + 7) & ~7) : j0; /* the whole blocks: [a, b) */
  const int32_t b = v->hi < j1 ? j0 + ((v->hi - j0) & ~7) : j1;
  if (cap > 0.0f || v->slope != 0.0f || a >= b) return row_rules_max(s, j0, j1, v, cap);
  float mx = -INFINITY, x;
  if (a > j0 && (x = row_rules_max(s, j0, a, v, cap)) > mx) mx = x;
  if (b < j1 && (x = row_rules_max(s + (b - j0), b, j1, v, cap)) > mx) mx = x;
  v16 vmax = v16_set1(-INFINITY);
  int32_t j = a;
  for (; j + 16 <= b; j += 16) vmax = v16_max(vmax, v16_load(s + (j - j0)));
  if ((x = v16_hmax(vmax)) > mx) mx = x;
  if (j < b && (x = hmax8(_mm256_load_ps(s + (j - j0)))) > mx) mx = x;
  return mx;
}

/* One vector's S row (W floats from column j0; the keys [j0, j0 + W) a multiple of 8) to P, softmax_row's job
 * 16 lanes at a time (v16_exp: exp8's bits; l summed in another order): the rule, the max, then P = e^(s -
 * m_new) in one pass, in place; m and l updated, the factor o must be rescaled by returned. A last 8 keys go
 * through the same 16 lanes, padded with -inf (P 0, which adds nothing to l). */
V16_INLINE float wide_decode_row(float *s, int32_t j0, int32_t W, const vec_rule *v, float cap, float *m, float *l) {
  float alpha;
  const float m_new = row_new_max(wide_row_max(s, j0, j0 + W, v, cap), *m, &alpha);
  const v16 mv = v16_set1(m_new);
  v16 sum = v16_zero();
  int32_t j = 0;
  for (; j + 16 <= W; j += 16) {
    const v16 p = v16_exp(v16_sub(v16_load(s + j), mv));
    sum = v16_add(sum, p);
    v16_store(s + j, p);
  }
  if (j < W) {
    _Alignas(64) float t[16];
    _mm256_store_ps(t, _mm256_load_ps(s + j)), _mm256_store_ps(t + 8, _mm256_set1_ps(-INFINITY));
    const v16 p = v16_exp(v16_sub(v16_load(t), mv));
    sum = v16_add(sum, p);
    v16_store(t, p), _mm256_store_ps(s + j, _mm256_load_ps(t));
  }
  *l = *l * alpha + v16_hsum(sum);
  *m = m_new;
  return alpha;
}

/* o *= alpha, D floats (an output whose maximum grew). */
V16_INLINE void wide_rescale(float *o, float alpha, const int32_t D) {
  for (int32_t d = 0; d < D; d += 16) v16_store(o + d, v16_mul(v16_set1(alpha), v16_load(o + d)));
}

/* The softmax of head g's block b of vectors (rules rule, head 0's: the slopes are head g's) over one
 * share's columns [c0, c1) (scores in the S rows from Sb, column c0 at c0 - j0), a step of the online
 * softmax: wide_decode_row's rules, P in place of the scores, each output rescaled by its
 * alpha. [*plo, *phi): the keys of the share any vector sees (empty: none). A share of Z columns (the walk's
 * share size, a constant multiple of 16) that every vector sees whole, without cap or slopes (all but a
 * call's first and last), takes wide_decode_row's operations on them without the rules' branches: the same
 * bits. */
V16_INLINE void wide_softmax_cols(const uattn_panel_job *job, const decode_shape *s, int32_t g, int32_t b,
                                  const vec_rule *rule, float *Sb, int32_t c0, int32_t c1, int32_t *plo, int32_t *phi,
                                  const int32_t Z, const int32_t D) {
  const int nb = s->nb[b];
  const size_t st0 = (size_t)g * s->hv + (size_t)s->x0[b]; /* the block's first state */
  float *o0 = job->o + (size_t)g * s->hq + (size_t)s->x0[b] * D;
  bool whole = c1 - c0 == Z && !(job->soft_cap > 0.0f) && !job->alibi;
  for (int i = 0; whole && i < nb; i++) whole = rule[i].lo <= c0 && rule[i].hi >= c1;
  if (whole) {
    *plo = c0, *phi = c1;
    for (int i = 0; i < nb; i++) {
      float *row = Sb + (size_t)i * s->W + (c0 - s->j0), *m = &job->m[st0 + i], *l = &job->l[st0 + i];
      v16 mx = v16_load(row);
      for (int32_t j = 16; j < Z; j += 16) mx = v16_max(mx, v16_load(row + j));
      float alpha;
      const float m_new = row_new_max(v16_hmax(mx), *m, &alpha);
      const v16 mv = v16_set1(m_new);
      v16 sum = v16_exp(v16_sub(v16_load(row), mv));
      v16_store(row, sum);
      for (int32_t j = 16; j < Z; j += 16) {
        const v16 p = v16_exp(v16_sub(v16_load(row + j), mv));
        sum = v16_add(sum, p);
        v16_store(row + j, p);
      }
      *l = *l * alpha + v16_hsum(sum);
      *m = m_new;
      if (alpha != 1.0f) wide_rescale(o0 + (size_t)i * D, alpha, D);
    }
    return;
  }
  *plo = INT32_MAX, *phi = INT32_MIN;
  for (int i = 0; i < nb; i++) {
    float *pp = Sb + (size_t)i * s->W + (c0 - s->j0);
    vec_rule r = rule[i];
    if (r.lo < c0) r.lo = c0;
    if (r.hi > c1) r.hi = c1;
    if (r.lo >= r.hi) { /* this vector sees none of the tile: P 0, its state as it is */
      memset(pp, 0, sizeof(float) * (size_t)(c1 - c0));
      continue;
    }
    const size_t x = (size_t)s->x0[b] + (size_t)i;
    if (job->alibi) r.slope = job->alibi[(size_t)g * job->group + x % (size_t)job->group];
    const float alpha = wide_decode_row(pp, c0, c1 - c0, &r, job->soft_cap, &job->m[st0 + i], &job->l[st0 + i]);
    if (alpha != 1.0f) wide_rescale(o0 + (size_t)i * D, alpha, D);
    if (r.lo < *plo) *plo = r.lo;
    if (r.hi > *phi) *phi = r.hi;
  }
}

/* Bytes from each row of a piece of head g's share (keys from f on, of the share of keys [k0, k0 + Z); f's
 * row at x, in the call's blocks of keys or values) to its place in the walk's next share: head g + 1's, or
 * the next chunk's head 0 (key f + Z's row, in whichever block holds it), or (next: the next call's first
 * key row, whose first keys it reads) the next call's first share, whose first block is known; 0 past them
 * (a row of the next chunk past the call's keys, a piece past the next call's first block). A share further
 * on measured slower (bf16 NHD 1.0-1.1x, HND 1.3-1.7x: lines asked for into L1 that far are gone before they
 * are read). Other ways of asking, on a 2-vCPU Zen 5 (one NHD row at GQA 4, a cold walk, the two builds
 * alternated and pinned, ratios of speed): fp8 E4M3 two shares ahead 0.96-0.97x; into L2 (prefetcht1)
 * 0.78-0.80x; not asking at all 0.48-0.49x (bf16 0.36-0.38x: the hardware prefetchers do not follow NHD's
 * pieces of rows); the next chunk's rows in address order, an eighth of them during each head's share,
 * instead of each share's lines 0.57-0.62x into L1 or L2 (bf16 alike), and into L2 besides each share's
 * 0.93-0.94x. */
V16_INLINE intptr_t decode_next_share(const decode_shape *s, const void *const *blocks, const char *x, int32_t f,
                                      int32_t k0, int32_t g, int32_t Z, const char *next) {
  if (g + 1 < s->heads) return (intptr_t)s->head_step;
  if (k0 + Z < s->HI) /* the next chunk */
    next = f + Z < s->HI ? decode_row(s, blocks, f + Z) : NULL;
  else if (next && f - k0 < (1 << s->shift))
    next += (size_t)(f - k0) * s->step;
  else
    next = NULL;
  return next ? (intptr_t)((uintptr_t)next - (uintptr_t)x) : 0;
}

/* <q_i, k_j> for NB <= 4 vectors (q_i at q + i * D, in order) and the 4 rows r[j] of dtype t: vector i's 4
 * scores at S + i * ld, or (keys < 4: a ragged end) its first `keys`. 16 accumulators summed by v16_sum16;
 * each line of row j asks for its place pf[j] bytes on (pf NULL: none) into L1. */
V16_INLINE void wide_score4(const int NB, uattn_dtype t, const int32_t D, const float *q, const char *const *r,
                            const intptr_t *pf, float *S, size_t ld, int32_t keys) {
  const size_t esz = uattn_dtype_size(t);
  const int(*slot)[4] = sum16_slot;
  v16 a[16];
  for (int x = 0; x < 16; x++) a[x] = v16_zero();
  for (int32_t d = 0; d < D; d += 16) {
    v16 k[4];
    for (int j = 0; j < 4; j++) k[j] = v16_widen(t, r[j] + (size_t)d * esz);
    if (pf && ((size_t)d * esz) % 64 == 0)
      for (int j = 0; j < keys; j++)
        _mm_prefetch((const char *)((uintptr_t)r[j] + (uintptr_t)pf[j]) + d * esz, _MM_HINT_T0);
    for (int i = 0; i < NB; i++) {
      const v16 qv = v16_load(q + (size_t)i * D + d);
      for (int j = 0; j < 4; j++) a[slot[i][j]] = v16_fmadd(qv, k[j], a[slot[i][j]]);
    }
  }
  sum16_store(NB, v16_sum16(a), S, ld, keys);
}

/* A fused walk over a call's shares (this set's wide_fused, avx512bf16/decode.h's bf16_fused): chunk by chunk
 * (keys [Z c, Z c + Z) within [LO, HI), Z a multiple of 16: DECODE_SHARE_KEYS, or twice that on fp8 rows),
 * every head's share of the chunk in turn. decode_walk_begin takes the blocks' rules and asks for the first
 * shares; each decode_walk_next (given the same Z: each walk's is a constant, so the walk does not hold it)
 * moves to the next share and says where it is: its keys [lo, hi), its softmax columns [c0, c1) (whole 8s
 * within the call's [j0, j0 + W)), its head's S rows, and its pieces: the runs of its keys whose rows follow
 * each other (one block, or several adjacent ones: a share of a list of blocks smaller than Z has one a
 * block where they lie apart, so the walk takes a call's list of blocks as it is, any block size), each with
 * its rows and each stream's distance to its next share (decode_next_share; the keys' on into the next
 * call's first share). */
enum { WALK_PIECES = 4 }; /* a share's pieces at most: fp8's 32 keys over 8-key blocks, the smallest of a list */

typedef struct decode_walk {
  vec_rule rule[4][4]; /* each block's, head 0's: the heads differ in slopes alone (wide_softmax_cols) */
  int32_t c, g, C1;    /* the share: chunk c, head g; the chunks end at C1 */
  int32_t lo, hi, c0, c1;
  int32_t pieces;
  int32_t at[WALK_PIECES + 1]; /* piece x: keys [at[x], at[x + 1]) within [lo, hi), at[x] its first block's first key
                                * (at[pieces] is hi) */
  const char *kz[WALK_PIECES],
      *vz[WALK_PIECES]; /* key at[x]'s rows of head g: key j of piece x at kz[x] + (j - at[x]) step */
  intptr_t pk[WALK_PIECES], pv[WALK_PIECES]; /* decode_next_share of piece x's rows */
  float *Sg;                                 /* head g's S rows */
} decode_walk;

V16_INLINE void decode_walk_begin(decode_walk *w, const uattn_panel_job *job, const decode_shape *s, int32_t Z) {
  for (int32_t b = 0; b < s->blocks; b++) {
    int32_t klo, khi;
    block_rules(job, s->x0[b], s->nb[b], 0, job->num_keys, w->rule[b], &klo, &khi);
  }
  const int32_t C0 = s->LO / Z;
  /* the first shares, which no line asks for (the keys' are, where the call before was told of this one) */
  for (int32_t j = s->LO; j < s->HI && j < (C0 + 1) * Z; j++)
    prefetch_share(s, decode_row(s, s->kb, j), 0), prefetch_share(s, decode_row(s, s->vb, j), 0);
  w->c = C0 - 1, w->g = s->heads - 1; /* decode_walk_next's first step: chunk C0, head 0 */
  w->C1 = (s->HI + Z - 1) / Z;
}

V16_INLINE bool decode_walk_next(decode_walk *w, const uattn_panel_job *job, const decode_shape *s, float *S,
                                 const int32_t Z) {
  if (++w->g >= s->heads) w->g = 0, w->c++;
  if (w->c >= w->C1) return false;
  const int32_t k0 = w->c * Z, k1 = k0 + Z;
  w->lo = s->LO > k0 ? s->LO : k0, w->hi = s->HI < k1 ? s->HI : k1;
  w->c0 = k0 > s->j0 ? k0 : s->j0, w->c1 = k1 < s->j0 + s->W ? k1 : s->j0 + s->W;
  const size_t head = (size_t)w->g * s->head_step, block = ((size_t)1 << s->shift) * s->step; /* a block's rows */
  const char *kprev = NULL, *vprev = NULL;                                                    /* the last block's */
  w->pieces = 0;
  for (int32_t b = w->lo >> s->shift; b <= (w->hi - 1) >> s->shift; b++) {
    const char *k = (const char *)s->kb[b], *v = (const char *)s->vb[b];
    if (!(w->pieces && k == kprev + block && v == vprev + block)) /* a block that does not follow the last: a piece */
      w->at[w->pieces] = b << s->shift, w->kz[w->pieces] = k + head, w->vz[w->pieces] = v + head, w->pieces++;
    kprev = k, vprev = v;
  }
  w->at[w->pieces] = w->hi;
  for (int32_t x = 0; x < w->pieces; x++) {
    const int32_t f = w->at[x] > w->lo ? w->at[x] : w->lo; /* the piece's first key */
    const size_t first = (size_t)(f - w->at[x]) * s->step;
    w->pk[x] = decode_next_share(s, s->kb, w->kz[x] + first, f, k0, w->g, Z, job->next_k);
    w->pv[x] = decode_next_share(s, s->vb, w->vz[x] + first, f, k0, w->g, Z, job->next_v);
  }
  w->Sg = S + (size_t)w->g * s->n * s->W;
  return true;
}

/* The 4 rows from key j of head g's share (past hi, the last again) into r, and their decode_next_share
 * distances into pf; returns the keys among them. */
V16_INLINE int32_t decode_walk_rows(const decode_walk *w, const decode_shape *s, int32_t j, const char **r,
                                    intptr_t *pf) {
  const int32_t keys = w->hi - j < 4 ? w->hi - j : 4;
  int32_t x = 0;
  for (int i = 0; i < 4; i++) {
    const int32_t key = j + (i < keys ? i : keys - 1);
    while (key >= w->at[x + 1]) x++;
    r[i] = w->kz[x] + (size_t)(key - w->at[x]) * s->step, pf[i] = w->pk[x];
  }
  return keys;
}

/* Piece x of share w within keys [lo, hi) (a block of vectors' keys with P) as a P V run: its keys
 * [*lo_x, *hi_x) and share's first column *c0_x counted from its rows' first key (vz[x]); false when the
 * piece has none of them. */
V16_INLINE bool decode_walk_piece(const decode_walk *w, int32_t x, int32_t lo, int32_t hi, int32_t *c0_x, int32_t *lo_x,
                                  int32_t *hi_x) {
  const int32_t a = w->at[x] > lo ? w->at[x] : lo, b = w->at[x + 1] < hi ? w->at[x + 1] : hi;
  if (a >= b) return false;
  *c0_x = w->c0 - w->at[x], *lo_x = a - w->at[x], *hi_x = b - w->at[x];
  return true;
}

/* Decode on NHD and HND rows of any dtype in natural order (f16, f32, fp8; bf16 where the head dim is not a
 * multiple of 32), fused as avx512bf16/decode.h's bf16_fused (decode_walk): each head's share of 16 rows
 * scored (wide_score4, every block of vectors), through the online softmax (wide_softmax_cols) and into P V
 * (wide_pv_step, 64 dims at a time) before the next share, so the keys and the values are two streams read
 * side by side; each line asks for its place in its stream's next share into L1. */
V16_INLINE void wide_fused(const uattn_panel_job *job, const decode_shape *s, uattn_dtype t, float *S,
                           const int32_t D) {
  const size_t esz = uattn_dtype_size(t);
  decode_walk w;
  decode_walk_begin(&w, job, s, DECODE_SHARE_KEYS);
  while (decode_walk_next(&w, job, s, S, DECODE_SHARE_KEYS)) {
    const float *qg = job->q + (size_t)w.g * s->hq;
    for (int32_t j = w.lo; j < w.hi; j += 4) {
      const char *r[4];
      intptr_t pf[4];
      const int32_t keys = decode_walk_rows(&w, s, j, r, pf);
      for (int32_t b = 0; b < s->blocks; b++)
        DECODE_BY_NB(s->nb[b], wide_score4, t, D, qg + (size_t)s->x0[b] * D, r, b == 0 ? pf : NULL,
                     w.Sg + (size_t)s->x0[b] * s->W + (j - s->j0), (size_t)s->W, keys);
    }
    int32_t plo[4], phi[4];
    for (int32_t b = 0; b < s->blocks; b++)
      wide_softmax_cols(job, s, w.g, b, w.rule[b], w.Sg + (size_t)s->x0[b] * s->W, w.c0, w.c1, &plo[b], &phi[b],
                        DECODE_SHARE_KEYS, D);
    for (int32_t b = 0; b < s->blocks; b++) {
      const float *P = w.Sg + (size_t)s->x0[b] * s->W + (w.c0 - s->j0);
      float *o = job->o + (size_t)w.g * s->hq + (size_t)s->x0[b] * D;
      int32_t c0, lo, hi; /* in the piece's rows */
      for (int32_t x = 0; x < w.pieces; x++) {
        if (!decode_walk_piece(&w, x, plo[b], phi[b], &c0, &lo, &hi)) continue;
        const char *vg = w.vz[x];
        const intptr_t pf = b == 0 ? w.pv[x] : 0;
        int32_t d = 0;
        for (; d + 64 <= D; d += 64)
          DECODE_BY_NB(s->nb[b], wide_pv_step, 4, false, t, P, s->W, c0, lo, hi, vg + esz * d, s->step, o + d, D, pf);
        switch ((D - d) / 16) {
        case 1:
          DECODE_BY_NB(s->nb[b], wide_pv_step, 1, false, t, P, s->W, c0, lo, hi, vg + esz * d, s->step, o + d, D, pf);
          break;
        case 2:
          DECODE_BY_NB(s->nb[b], wide_pv_step, 2, false, t, P, s->W, c0, lo, hi, vg + esz * d, s->step, o + d, D, pf);
          break;
        case 3:
          DECODE_BY_NB(s->nb[b], wide_pv_step, 3, false, t, P, s->W, c0, lo, hi, vg + esz * d, s->step, o + d, D, pf);
          break;
        default: break;
        }
      }
    }
  }
}

/* decode in kernels.h (the arguments of avx2_decode_body). Either walk takes a call's list of blocks as it is
 * (the fused walk's shares in pieces where the blocks are smaller: decode_walk). */
V16_INLINE void avx512_decode_body(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype t,
                                   const uattn_decode_src *src, float *scratch, const int32_t D) {
  if (D % 16) { /* 16-float vectors need whole 16s of the head dim */
    avx2_decode_body(job, heads, head_vectors, t, src, scratch, D);
    return;
  }
  if (t == UATTN_BF16 && D % 32 == 0) {
    decode_shape s;
    if (!decode_shape_of(job, heads, head_vectors, t, src, D, &s)) return; /* no vector sees a key */
    s.order = DECODE_NATURAL; /* avx2/decode.h's 16-dim even/odd order: this kernel keeps its own */
    wide_decode_phases(true, job, &s, t, scratch, D);
    return;
  }
  decode_shape s;
  if (!decode_shape_of(job, heads, head_vectors, t, src, D, &s)) return; /* no vector sees a key */
  s.order = DECODE_NATURAL;
  wide_fused(job, &s, t, scratch + (size_t)heads * s.n * D, D);
}

#endif
