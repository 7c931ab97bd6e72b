/* The fused decode walks' parts (avx512/decode.h's wide_fused, avx512bf16/decode.h's bf16_fused): each head's
 * share of a chunk of keys scored, through the online softmax and into P V before the next, the keys and the
 * values two streams read side by side, each line asking for its place in its stream's next share; and the
 * lane tree that sums the 4-row score steps. Include after common/vec16.h's decision (AVX512_VEC_ZMM or not). */
#ifndef UATTN_COMMON_DECODE_WALK_H
#define UATTN_COMMON_DECODE_WALK_H

#include "common/decode_shape.h"
#include "common/vec16.h"

/* Keys of a head's share in the fused walks (a TILED tile's, decode_tiled.h); fp8 rows' walks take twice as
 * many (avx512bf16/decode.h's bf16_fused). */
enum { DECODE_SHARE_KEYS = 16 };

/* The 16 sums of a[0..15] as one vector: lane 4 q + l holds the sum of a[(0, 8, 4, 12)[q] + (0, 2, 1, 3)[l]]
 * (what the tree's moves give; the caller puts each accumulator where its sum should come out). Each level
 * halves the vectors: quarters, then halves of quarters, then pairs of lanes, added. At the first and third
 * levels one operand of each add is x's first half and y's second (halves of the vector, of each quarter): a
 * blend, where a shuffle took the shuffle units the rest of the tree is bound by. */
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

/* Bytes from each row of a piece of head g's share (keys from f on, of the share of keys [k0, k0 + Z); f's
 * row at x, in the call's blocks of keys or values) to its place in the walk's next share: head g + 1's, or
 * the next chunk's head 0 (key f + Z's row, in whichever block holds it), or (next: the next call's first
 * key row, whose first keys it reads) the next call's first share, whose first block is known; 0 past them
 * (a row of the next chunk past the call's keys, a piece past the next call's first block). The next share,
 * into L1: lines asked for further ahead are gone before they are read (docs/performance.md). */
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

/* A fused walk over a call's shares (avx512/decode.h's wide_fused, avx512bf16/decode.h's bf16_fused): chunk by chunk
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

#endif
