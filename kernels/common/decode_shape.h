/* One decode call's shape and its walk over the cache, which every decode kernel shares: the query vectors in
 * blocks of up to 4, the keys any of them sees, the call's list of cache blocks walked as one stretch of keys
 * (decode_row), the rows asked for ahead a head's share at a time, and the P V walk of PV_TILE rows. */
#ifndef UATTN_COMMON_DECODE_SHAPE_H
#define UATTN_COMMON_DECODE_SHAPE_H

#include "common/softmax.h"
#include "common/widen.h"

enum {
  DECODE_AHEAD = 8,                /* rows ahead of those being read that are asked for, in a call of 8 heads or more */
  PV_TILE = UATTN_DECODE_MIN_TILE, /* keys of a P V step: 8 rows of every head stay in L1 while each head reads its
                                    * part; every record's decode_tile is a multiple, so no step straddles two blocks */
  DECODE_EO_MAX_DIM = 256,         /* larger head dims: widen8 */
};

/* The order a call's query vectors and outputs take (decode_shape.order): natural, bf16's even/odd halves
 * of 16, fp8's quarters of 32; DECODE_EO8, the outputs alone in even/odd halves, folded as DECODE_Q4's (the
 * avx2 set's fp8 TILED values, avx2/decode_tiled.h). */
typedef enum { DECODE_NATURAL, DECODE_EO, DECODE_Q4, DECODE_EO8 } decode_order;

/* FN(NB, ...) with NB the constant 1, 2, 3 or 4 that n (a block's vectors) is: one instance of a step per
 * block size, each with its accumulators in registers. */
#define DECODE_BY_NB(n, FN, ...)                                                                                       \
  do {                                                                                                                 \
    switch (n) {                                                                                                       \
    case 1: FN(1, __VA_ARGS__); break;                                                                                 \
    case 2: FN(2, __VA_ARGS__); break;                                                                                 \
    case 3: FN(3, __VA_ARGS__); break;                                                                                 \
    default: FN(4, __VA_ARGS__); break;                                                                                \
    }                                                                                                                  \
  } while (0)

/* Half the rebias of fp8 dtype t, H: a code's exponent and mantissa moved under an f32's read as its value
 * times 2^-2H (E4M3's exponent bias 7 against f32's 127: H = 60; E5M2's 15: H = 56). The query vectors and
 * P are multiplied by 2^H, the scores and the P V sums (kept times 2^-H) by 2^H back: powers of two, exact
 * while nothing leaves f32's normal range (the call's queries are checked, q_fits_fold; a running output or a
 * partial score below 2^-66 in magnitude would lose low bits to f32's subnormals, far below fp8's). */
static inline int fp8_fold(uattn_dtype t) { return fp8_rebias(t) / 2; }

/* ---- one call's shape ---------------------------------------------------------------------------------- */

/* What every head of a call shares: the vectors' blocks (4 at a time, as even as they go: 6 = 3 + 3), the
 * keys each block sees (the rows, visible counts and window are the same for every head), and where the
 * heads' data lie. */
typedef struct decode_shape {
  int32_t heads, n, blocks, nb[4], x0[4], lo[4], hi[4];
  int32_t LO, HI, j0, W;             /* keys any vector sees, [LO, HI); score columns [j0, j0 + W), W a multiple of 8 */
  const void *const *kb, *const *vb; /* the call's cache blocks (uattn_decode_src), 2^shift keys each */
  int32_t shift;
  const void *next_k;           /* the next call's first key row (uattn_panel_job.next_k), or NULL */
  size_t step, head_step, span; /* bytes: key to key, head to head, of a row the heads read */
  size_t share;                 /* bytes of span each head asks for (whole lines) */
  size_t hv, hq;      /* vectors (states) and floats (query vectors, outputs) from a head's to the next head's */
  decode_order order; /* the query vectors' and outputs' (DECODE_Q4, DECODE_EO8: times 2^fp8_fold's H) */
  int fold;           /* DECODE_Q4, DECODE_EO8: fp8_fold */
} decode_shape;

/* Row j of the call (its first head's) in the call's blocks of keys (s->kb) or of values (s->vb). */
AVX2_INLINE const char *decode_row(const decode_shape *s, const void *const *blocks, int32_t j) {
  return (const char *)blocks[j >> s->shift] + (size_t)(j & ((1 << s->shift) - 1)) * s->step;
}

/* Asks for head g's share of a row the heads read, bytes [g share, (g + 1) share) of its span: a row read by
 * every head in turn is asked for a share at a time, as each head runs, so the requests go out in the row's
 * order and are spread over the step. Into L2 (prefetcht1), not L1: a line asked for into L1 holds one of
 * the core's few L1 miss buffers until it arrives, which caps the lines in flight below what the memory's
 * latency needs; into L2 the requests queue there. */
AVX2_INLINE void prefetch_share(const decode_shape *s, const char *row, int32_t g) {
  const size_t a = (size_t)g * s->share, b = a + s->share < s->span ? a + s->share : s->span;
  for (uintptr_t x = ((uintptr_t)row + a) & ~(uintptr_t)63; x < (uintptr_t)row + b; x += 64)
    _mm_prefetch((const char *)x, _MM_HINT_T1);
}

/* The call's shape; false when no vector sees a key. */
AVX2_INLINE bool decode_shape_of(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype t,
                                 const uattn_decode_src *src, const int32_t D, decode_shape *s) {
  const size_t esz = uattn_dtype_size(t);
  *s = (decode_shape){0}; /* whole, also where it returns false (GCC cannot tell the callers stop then) */
  s->heads = heads, s->n = job->rows * job->group;
  s->blocks = (s->n + 3) / 4;
  const int32_t small = s->n / s->blocks, big = s->n % s->blocks;
  s->LO = INT32_MAX, s->HI = INT32_MIN;
  for (int32_t b = 0, x0 = 0; b < s->blocks; b++) {
    vec_rule rule[4];
    s->nb[b] = small + (b < big), s->x0[b] = x0;
    block_rules(job, x0, s->nb[b], 0, job->num_keys, rule, &s->lo[b], &s->hi[b]);
    if (s->lo[b] < s->hi[b]) {
      if (s->lo[b] < s->LO) s->LO = s->lo[b];
      if (s->hi[b] > s->HI) s->HI = s->hi[b];
    }
    x0 += s->nb[b];
  }
  if (s->LO >= s->HI) return false;
  s->j0 = s->LO & ~7, s->W = ((s->HI + 7) & ~7) - s->j0;
  s->kb = src->k, s->vb = src->v, s->shift = __builtin_ctz((unsigned)src->block_keys), s->next_k = job->next_k;
  s->step = src->stride * esz, s->head_step = src->head_stride * esz;
  s->span = (size_t)(heads - 1) * s->head_step + (size_t)D * esz;
  s->share = ((s->span + (size_t)heads - 1) / (size_t)heads + 63) & ~(size_t)63;
  s->hv = head_vectors, s->hq = head_vectors * (size_t)D;
  s->fold = uattn_dtype_is_fp8(t) ? fp8_fold(t) : 0;
  s->order = t == UATTN_BF16 && D % 16 == 0 && D <= DECODE_EO_MAX_DIM ? DECODE_EO : DECODE_NATURAL; /* Q4: the body's */
  return true;
}

/* Rows ahead of those being read that are asked for: at least `rows`, and 64 heads' shares, so that a call
 * of one head (an HND unit, an MQA layer) asks 64 rows ahead (16 KB at head dim 128 in 16 bits, where 8 rows
 * were 2 KB) while an all-heads NHD call of 8 heads keeps `rows`. */
AVX2_INLINE int32_t decode_rows_ahead(const decode_shape *s, int32_t rows) {
  return 64 / s->heads > rows ? 64 / s->heads : rows;
}

/* The rows [x0, x1) of the walk the scores ask for ahead into r: the keys', past the last key the values',
 * past the last value the next call's first keys (where the call was told of them; their first rows, as
 * many as the walk reaches, whatever the next call's length: asking for a line never faults). Returns how
 * many. Found once a step, asked for a head's share at a time (prefetch_rows). */
AVX2_INLINE int32_t ahead_rows(const decode_shape *s, int32_t x0, int32_t x1, const char **r) {
  int32_t n = 0;
  for (int32_t x = x0; x < x1; x++) {
    const int32_t y = x - s->HI + s->LO; /* past the keys: the value row */
    if (x < s->HI)
      r[n++] = decode_row(s, s->kb, x);
    else if (y < s->HI)
      r[n++] = decode_row(s, s->vb, y);
    else if (s->next_k)
      r[n++] = (const char *)((uintptr_t)s->next_k + (uintptr_t)(y - s->HI) * s->step);
  }
  return n;
}

/* Head g's share of the n rows r. */
AVX2_INLINE void prefetch_rows(const decode_shape *s, const char *const *r, int32_t n, int32_t g) {
  for (int32_t i = 0; i < n; i++) prefetch_share(s, r[i], g);
}

/* The score columns softmax_row reads outside [LO, HI): masked there, but set. Then the walk's first
 * `ahead` rows asked for (ahead_rows: a call of fewer keys asks for its values, and the next call's keys, at
 * once). */
AVX2_INLINE void begin_scores(const decode_shape *s, float *S, int32_t ahead) {
  for (size_t x = 0; x < (size_t)s->heads * s->n; x++) {
    float *row = S + x * s->W;
    for (int32_t j = s->j0; j < s->LO; j++) row[j - s->j0] = 0.0f;
    for (int32_t j = s->HI; j < s->j0 + s->W; j++) row[j - s->j0] = 0.0f;
  }
  for (int32_t x = s->LO; x < s->LO + ahead; x++) {
    const char *r[1];
    if (ahead_rows(s, x, x + 1, r))
      for (int32_t g = 0; g < s->heads; g++) prefetch_share(s, r[0], g);
  }
}

/* What block b of head g does in the P V tile of keys from jt: keys [lo, hi) (false when none), its P and
 * outputs, the head's values: value j's row at v + j * step and its P at column j - j0, j counted from the
 * start of the cache block that holds the tile. */
typedef struct pv_step {
  int32_t lo, hi, j0;
  const float *S;
  const char *v;
  float *o;
} pv_step;

AVX2_INLINE bool pv_step_of(const uattn_panel_job *job, const decode_shape *s, const float *S, int32_t jt, int32_t g,
                            int32_t b, const int32_t D, pv_step *p) {
  const int32_t lo = jt > s->lo[b] ? jt : s->lo[b], hi = jt + PV_TILE < s->hi[b] ? jt + PV_TILE : s->hi[b];
  if (lo >= hi) return false;                    /* (a block that sees no key has lo INT32_MAX, hi INT32_MIN) */
  const int32_t at = jt >> s->shift << s->shift; /* the tile's block's first key */
  p->lo = lo - at, p->hi = hi - at, p->j0 = s->j0 - at;
  p->S = S + ((size_t)g * s->n + s->x0[b]) * s->W;
  p->v = (const char *)s->vb[jt >> s->shift] + (size_t)g * s->head_step;
  p->o = job->o + (size_t)g * s->hq + (size_t)s->x0[b] * D;
  return true;
}

/* The rows of the P V tile decode_rows_ahead rows after the one from jt, into r (the scores asked for the
 * values' first rows that far); returns how many. */
AVX2_INLINE int32_t next_tile_rows(const decode_shape *s, int32_t jt, const char **r) {
  const int32_t ahead = decode_rows_ahead(s, DECODE_AHEAD);
  int32_t n = 0;
  for (int32_t x = jt + ahead; x < jt + ahead + PV_TILE && x < s->HI; x++) r[n++] = decode_row(s, s->vb, x);
  return n;
}

/* The P V walk of the phased decode kernels: PV_TILE rows at a time from j0 (a multiple of PV_TILE), every head in
 * turn (the next tile asked for a head's share at a time), every block with keys in the tile: STEP(NB, ...,
 * &p), p the block's pv_step and NB its vectors, a constant. */
#define DECODE_PV_TILES(job, s, S, D, STEP, ...)                                                                       \
  do {                                                                                                                 \
    for (int32_t jt_ = (s)->j0; jt_ < (s)->HI; jt_ += PV_TILE) {                                                       \
      const char *next_[PV_TILE];                                                                                      \
      const int32_t nn_ = next_tile_rows(s, jt_, next_);                                                               \
      for (int32_t g_ = 0; g_ < (s)->heads; g_++) {                                                                    \
        prefetch_rows(s, next_, nn_, g_);                                                                              \
        for (int32_t b_ = 0; b_ < (s)->blocks; b_++) {                                                                 \
          pv_step p_;                                                                                                  \
          if (pv_step_of(job, s, S, jt_, g_, b_, D, &p_)) DECODE_BY_NB((s)->nb[b_], STEP, __VA_ARGS__, &p_);           \
        }                                                                                                              \
      }                                                                                                                \
    }                                                                                                                  \
  } while (0)

#endif
