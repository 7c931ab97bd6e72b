/* The avx512bf16 set's decode kernel on uattn's own cache layout (UATTN_LAYOUT_TILED, uattn.h): decode.h's
 * jobs and softmax rules, with the products taken in the layout's order.
 *
 * Each block is tiles of 16 keys, each tile every KV head in turn, so an all-heads call reads its blocks in
 * address order, as on NHD. Within a tile and head:
 *   keys    one 64-byte line a dim pair of the 16 keys (bf16): vdpbf16ps of the line with the query's pair
 *           broadcast adds that pair's products to 16 scores at once, a lane a key. No reduction tree (NHD's
 *           v16_sum16: 45 moves and adds for 16 scores) and no store of quarters: 16 scores are one vector.
 *           TILED_SCORE's partial sums over the pairs keep vdpbf16ps in flight; the query pair's broadcast
 *           is inside the bf16 vdpbf16ps ({1to16}: one instruction a product).
 *   values  one line 16 dims of a key pair: vdpbf16ps with the pair's two P broadcast adds both keys to 16
 *           dims of the output, in the dims' order (NHD interleaves two rows by unpacks and keeps the output
 *           permuted during P V).
 * Keys past a vector's visible ones inside a tile: their scores are computed but not stored (lanes outside
 * [LO, HI)) or masked by the softmax rules (P exactly 0); their values are zeroed before P V, since a
 * slot never written may hold NaN, and 0 x NaN would reach the output.
 *
 * bf16 caches: the walk fused (tiled_fused). Each head's share of a tile (4 KB of keys and 4 KB of values
 * at head dim 128) is scored, its columns go through the online softmax (bf16_softmax_cols), and its values are
 * added, before the next share: the keys and the values are two streams read side by side, each line asking
 * for its place in the stream's next share, into L1, so the memory and the products overlap (in phases they
 * did not); past the call's last keys the keys' stream goes on into the next call's block where the forward
 * names it (uattn_panel_job.next_k). The online rescale a tile at a time is the softmax rules' own order
 * (P against a maximum that grows tile by tile), held to the tests' tolerances like every kernel's.
 *
 * fp8 caches take the same walk, a share being two tiles (4 KB of each stream at head dim 128, as bf16's one;
 * decode.h's bf16_fused gives fp8 rows 32 keys a share for the same reason): one code an element, a 64-byte
 * line is two dim pairs of keys (or 32 dims of a key pair of values), widened exactly into the bf16 lines
 * above by vpermi2b lookups: keys by v16i_fp8_widen_in_order (words in the codes' order, each vector one
 * pair), values by v16i_fp8_widen (in-lane unpacks, cheaper than vpermt2b) a share at a time in 64-dim pieces
 * (tiled_pv_fp8_run), whose order of the dims (decode.h's unpack32_to) the outputs are in from the start of
 * the call to its end.
 * The choices (fused walk against phases, the share's size, how far ahead to ask) were timed with
 * uattn-kernel-bench --decode-layouts and uattn-bench --layout tiled; the figures are in docs/performance.md.
 *
 * Needs a head dim that is a multiple of 32 and P in bf16 (not probs_fp32): kernels.h's
 * uattn_decode_tiled_fits; the forward gathers the blocks into rows for decode.h otherwise. */
#ifndef UATTN_AVX512BF16_DECODE_TILED_H
#define UATTN_AVX512BF16_DECODE_TILED_H

#include "avx512bf16/decode.h"
#include "avx512bf16/vec.h"

enum { TILED_KEYS = UATTN_TILED_KEYS }; /* keys a tile (the layout's) */

/* Where one call's tiles are (bytes) and which hold its keys. */
typedef struct tiled_src {
  const char *k, *v;           /* the block's first tile, the call's first head */
  size_t tile_step, head_step; /* from a tile to the next, from a head's share of a tile to the next head's */
  int32_t T0, T1;              /* tiles [T0, T1) hold the keys [LO, HI) */
  const char *next_k, *next_v; /* the next call's keys and values (its block's first tile, the same heads), or NULL */
} tiled_src;

/* Share y of the fused walk's keys (the heads' shares of P tiles from T0, then of the P tiles after, ... in
 * turn; just past the last, the next call's first), or of its values (vals); NULL past them. */
BF16_INLINE const char *tiled_stream_share(const tiled_src *t, int32_t heads, int32_t y, int32_t P, bool vals) {
  const int32_t x = t->T0 + y / heads * P, g = y % heads;
  if (x < t->T1) return (vals ? t->v : t->k) + (size_t)x * t->tile_step + (size_t)g * t->head_step;
  return x >= t->T1 && x < t->T1 + P && g == 0 ? (vals ? t->next_v : t->next_k) : NULL;
}

/* scale <q_i, k_j> for NB <= 4 vectors (bf16 pairs at q + i * Dh) and the 16 keys of one head's share of a
 * tile (kt), C partial sums over the pairs, into vector i's S row from column col, the lanes in `lanes`
 * only. pf: a share to ask for, a line per line read (NULL: none), into L1 (the fused walk's next share).
 * tab: fp8 codes. */
BF16_INLINE void tiled_score_tile(const int NB, const int C, const int32_t Dh, const uint8_t *tab, float scale,
                                  const uint32_t *q, const char *kt, const char *pf, float *S, size_t ld, int32_t col,
                                  uint32_t lanes) {
  v16 a[4][4];
  for (int i = 0; i < NB; i++)
    for (int c = 0; c < C; c++) a[i][c] = v16_zero();
  for (int32_t p = 0; p < Dh; p += C) {
    v16i k[4];
    for (int c = 0; tab && c < C; c += 2) { /* a line: pairs p + c and p + c + 1 */
      v16i_fp8_widen_in_order(v16i_load(kt + 32 * (size_t)(p + c)), tab, &k[c], &k[c + 1]);
      if (pf) _mm_prefetch(pf + 32 * (size_t)(p + c), _MM_HINT_T0);
    }
    for (int c = 0; !tab && c < C; c++) {
      k[c] = v16i_load(kt + 64 * (size_t)(p + c));
      if (pf) _mm_prefetch(pf + 64 * (size_t)(p + c), _MM_HINT_T0);
    }
    for (int i = 0; i < NB; i++)
      for (int c = 0; c < C; c++)
        a[i][c] = tab ? v16_dpbf16(a[i][c], v16i_set1(q[(size_t)i * Dh + p + c]), k[c])
                      : v16_dpbf16_bcast(a[i][c], k[c], q + (size_t)i * Dh + p + c);
  }
  const v16 sc = v16_set1(scale);
  for (int i = 0; i < NB; i++) {
    const v16 sum = C == 4 ? v16_add(v16_add(a[i][0], a[i][1]), v16_add(a[i][2], a[i][3])) : v16_add(a[i][0], a[i][1]);
    v16_store_lanes(S + (size_t)i * ld + col, v16_mul(sum, sc), lanes);
  }
}

/* TILED_SCORE(nb, ...): tiled_score_tile with the partial sums for nb vectors (4 for 1-2 vectors, 2 for 3-4:
 * 4-8 accumulators): filling vdpbf16ps from registers would take about 12 chains, but more partial sums timed
 * no faster, since the scores wait on their cache lines, not on the chains. */
#define TILED_SCORE(nb, ...)                                                                                           \
  do {                                                                                                                 \
    switch (nb) {                                                                                                      \
    case 1: tiled_score_tile(1, 4, __VA_ARGS__); break;                                                                \
    case 2: tiled_score_tile(2, 4, __VA_ARGS__); break;                                                                \
    case 3: tiled_score_tile(3, 2, __VA_ARGS__); break;                                                                \
    default: tiled_score_tile(4, 2, __VA_ARGS__); break;                                                               \
    }                                                                                                                  \
  } while (0)

/* bf16 P V over one head's share of one tile: o_i += sum over keys [lo, hi) (within the tile) of P[i][j] v_j
 * for NB vectors and U x 16 dims (NB U <= 16 accumulators), keys in pairs from lo rounded down to even, each
 * pair's row of values (the share's next 64 U bytes) read whole: with U x 16 the head dim, the share is read
 * in address order, each line asking for its place in share pf into L1 (NULL: none). Otherwise as
 * tiled_pv_fp8_run (pp, ld, j0, the mask of a pair's unseen key; o_i at o + i * D). */
BF16_INLINE void tiled_pv_share(const int NB, const int U, const uint32_t *pp, size_t ld, int32_t j0, int32_t lo,
                                int32_t hi, const char *v, const int32_t D, float *o, const char *pf) {
  v16 a[16];
  for (int i = 0; i < NB; i++)
    for (int u = 0; u < U; u++) a[i * U + u] = v16_load(o + (size_t)i * D + 16 * u);
  for (int32_t j = lo & ~1; j < hi; j += 2) {
    const size_t r = (size_t)(j % TILED_KEYS / 2) * 4 * (size_t)D; /* the pair's row in the share */
    v16i w[16];
    for (int u = 0; u < U; u++) w[u] = v16i_load(v + r + 64 * u);
    for (int u = 0; pf && u < U; u++) _mm_prefetch(pf + r + 64 * u, _MM_HINT_T0);
    if (j < lo || j + 1 >= hi) { /* as tiled_pv_fp8_run */
      const uint32_t m = (j < lo ? 0xffff0000u : 0xffffffffu) & (j + 1 >= hi ? 0x0000ffffu : 0xffffffffu);
      for (int u = 0; u < U; u++) w[u] = v16i_and32(w[u], m);
    }
    for (int i = 0; i < NB; i++) {
      const v16i p = v16i_set1(pp[(size_t)i * ld + (size_t)(j - j0) / 2]);
      for (int u = 0; u < U; u++) a[i * U + u] = v16_dpbf16(a[i * U + u], p, w[u]);
    }
  }
  for (int i = 0; i < NB; i++)
    for (int u = 0; u < U; u++) v16_store(o + (size_t)i * D + 16 * u, a[i * U + u]);
}

/* The vectors tiled_pv_share takes at once for U 16-dim units: as many of nb as 16 accumulators hold, at
 * most 4 (decode_shape's blocks of vectors). */
BF16_INLINE int32_t tiled_share_vectors(int32_t U, int32_t nb) {
  const int32_t most = 16 / U < 4 ? 16 / U : 4;
  return nb < most ? nb : most;
}

/* tiled_pv_share with U = u (a constant) for nb = tiled_share_vectors(u, ...) vectors (the other instances,
 * never taken, are kept within 16 accumulators). */
#define TILED_PV_SHARE(u, nb, ...)                                                                                     \
  do {                                                                                                                 \
    switch (nb) {                                                                                                      \
    case 4: tiled_pv_share(4 * (u) <= 16 ? 4 : 1, u, __VA_ARGS__); break;                                              \
    case 3: tiled_pv_share(3 * (u) <= 16 ? 3 : 1, u, __VA_ARGS__); break;                                              \
    case 2: tiled_pv_share(2 * (u) <= 16 ? 2 : 1, u, __VA_ARGS__); break;                                              \
    default: tiled_pv_share(1, u, __VA_ARGS__); break;                                                                 \
    }                                                                                                                  \
  } while (0)

/* bf16 P V of one head's share of a tile (vt) for nbs vectors (P rows pp + i * ld, outputs o + i * D, as
 * tiled_pv_share's), keys [lo, hi) of the tile: each pass up to 256 dims of as many vectors as 16
 * accumulators hold (2 of 4 at head dim 128: the first pass reads the share in address order, asking for
 * share pf as tiled_pv_share, the next finds it in L1), beyond 256 dims in pieces. */
BF16_INLINE void tiled_pv_vectors(int32_t nbs, const uint32_t *pp, size_t ld, int32_t j0, int32_t lo, int32_t hi,
                                  const char *vt, const int32_t D, float *o, const char *pf) {
  for (int32_t d = 0; d < D; d += 256) {
    const int32_t U = (D - d < 256 ? D - d : 256) / 16;
    const char *vd = vt + 4 * (size_t)d;
    for (int32_t i = 0; i < nbs;) {
      const int32_t nb = tiled_share_vectors(U, nbs - i);
      const uint32_t *pi = pp + (size_t)i * ld;
      float *oi = o + (size_t)i * D + d;
      const char *p = pf && i == 0 ? pf + 4 * (size_t)d : NULL;
      switch (U) {
      case 2: TILED_PV_SHARE(2, nb, pi, ld, j0, lo, hi, vd, D, oi, p); break;
      case 4: TILED_PV_SHARE(4, nb, pi, ld, j0, lo, hi, vd, D, oi, p); break;
      case 6: TILED_PV_SHARE(6, nb, pi, ld, j0, lo, hi, vd, D, oi, p); break;
      case 8: TILED_PV_SHARE(8, nb, pi, ld, j0, lo, hi, vd, D, oi, p); break;
      case 10: TILED_PV_SHARE(10, nb, pi, ld, j0, lo, hi, vd, D, oi, p); break;
      case 12: TILED_PV_SHARE(12, nb, pi, ld, j0, lo, hi, vd, D, oi, p); break;
      case 14: TILED_PV_SHARE(14, nb, pi, ld, j0, lo, hi, vd, D, oi, p); break;
      default: TILED_PV_SHARE(16, nb, pi, ld, j0, lo, hi, vd, D, oi, p); break;
      }
      i += nb;
    }
  }
}

/* fp8 P V: 16 U dims (U = 2 or 4) of o_i += sum over keys [lo, hi) of P[i][j] v_j for NB vectors, keys in
 * pairs from lo rounded down to even (a key of a pair outside [lo, hi) zeroed), each 32 dims of a pair widened
 * from one 32-byte piece of its row. pp: P as bf16 pairs, vector i's pair of keys (j, j + 1) at
 * pp[i * ld + (j - j0) / 2]; v: head g's share of the block's first tile, dims from d0; o_i at o + i * D, in
 * the dims' order of v16i_fp8_widen (unpack32_to). Each line read asks for its place pf bytes on (0: none)
 * into L1. */
BF16_INLINE void tiled_pv_fp8_run(const int NB, const int U, const uint8_t *tab, const uint32_t *pp, size_t ld,
                                  int32_t j0, int32_t lo, int32_t hi, const char *v, size_t tile_step, const int32_t D,
                                  float *o, intptr_t pf) {
  v16 a[4][4];
  for (int i = 0; i < NB; i++)
    for (int u = 0; u < U; u++) a[i][u] = v16_load(o + (size_t)i * D + 16 * u);
  for (int32_t j = lo & ~1; j < hi; j += 2) {
    const char *r = v + (size_t)(j / TILED_KEYS) * tile_step + (size_t)(j % TILED_KEYS / 2) * 2 * D;
    v16i w[4];
    for (int u = 0; u < U; u += 2) {
      v16i_fp8_widen(v16i_load(r + 32 * u), tab, &w[u], &w[u + 1]);
      if (pf) _mm_prefetch((const char *)((uintptr_t)r + (uintptr_t)pf) + 32 * u, _MM_HINT_T0);
    }
    if (j < lo || j + 1 >= hi) { /* key j (the low halves) or j + 1 (the high) not seen */
      const uint32_t m = (j < lo ? 0xffff0000u : 0xffffffffu) & (j + 1 >= hi ? 0x0000ffffu : 0xffffffffu);
      for (int u = 0; u < U; u++) w[u] = v16i_and32(w[u], m);
    }
    for (int i = 0; i < NB; i++) {
      const v16i p = v16i_set1(pp[(size_t)i * ld + (size_t)(j - j0) / 2]);
      for (int u = 0; u < U; u++) a[i][u] = v16_dpbf16(a[i][u], p, w[u]);
    }
  }
  for (int i = 0; i < NB; i++)
    for (int u = 0; u < U; u++) v16_store(o + (size_t)i * D + 16 * u, a[i][u]);
}

/* One share of tiled_fused's walk (y: its place, P tiles from T0 + y / heads P, head y % heads): each tile's
 * keys' lanes (0 past the call's last tile), its softmax columns (whole 8s within the call's [j0, j0 + W)),
 * its head's S rows and its keys' and values' place. */
typedef struct tiled_share {
  int32_t y, g, k0, c0, c1;
  uint32_t lanes[2];
  size_t at;
  float *Sg;
} tiled_share;

BF16_INLINE void tiled_share_at(const decode_shape *s, const tiled_src *t, float *S, int32_t y, const int32_t P,
                                tiled_share *h) {
  const int32_t T = t->T0 + y / s->heads * P;
  h->y = y, h->g = y % s->heads, h->k0 = T * TILED_KEYS;
  for (int32_t x = 0; x < P; x++) {
    const int32_t k0 = h->k0 + x * TILED_KEYS, lo = s->LO > k0 ? s->LO : k0;
    const int32_t hi = s->HI < k0 + TILED_KEYS ? s->HI : k0 + TILED_KEYS;
    h->lanes[x] = lo < hi ? ((1u << (hi - k0)) - 1) & ~((1u << (lo - k0)) - 1) : 0;
  }
  h->c0 = h->k0 > s->j0 ? h->k0 : s->j0;
  h->c1 = h->k0 + P * TILED_KEYS < s->j0 + s->W ? h->k0 + P * TILED_KEYS : s->j0 + s->W;
  h->at = (size_t)T * t->tile_step + (size_t)h->g * t->head_step;
  h->Sg = S + (size_t)h->g * s->n * s->W;
}

/* Every block's scores of share h (P tiles), each line asking for its place in the keys' next share. */
BF16_INLINE void tiled_share_scores(const uattn_panel_job *job, const decode_shape *s, const tiled_src *t,
                                    const uint8_t *tab, const uint32_t *q, const tiled_share *h, const int32_t P,
                                    const int32_t Dh) {
  const char *kn = tiled_stream_share(t, s->heads, h->y + 1, P, false);
  for (int32_t x = 0; x < P; x++) {
    if (!h->lanes[x]) continue; /* past the call's last tile, or none of its keys */
    const size_t at = h->at + (size_t)x * t->tile_step;
    for (int32_t b = 0; b < s->blocks; b++) /* column k0 - j0 >= -7: only lanes at or past LO >= j0 stored */
      TILED_SCORE(s->nb[b], Dh, tab, job->scale, q + ((size_t)h->g * s->n + s->x0[b]) * Dh, t->k + at,
                  b == 0 && kn ? kn + (size_t)x * t->tile_step : NULL, h->Sg + (size_t)s->x0[b] * s->W, (size_t)s->W,
                  h->k0 + x * TILED_KEYS - s->j0, h->lanes[x]);
  }
}

/* Decode on a TILED cache of bf16 or fp8 (tab: the widening tables), fused (the header): each head's share of
 * P tiles (1 of bf16, 2 of fp8) scored (every block of vectors), through the online softmax and into P V, each
 * stream's lines asking for their place in its next share; fp8's outputs in P V's order (unpack32_to) for the
 * call. In a call of more than one head and one block of vectors (at most 4: a GQA-4 decode row) the next
 * share's scores are taken before a share's softmax and P V (decode.h's bf16_fused says why); with two blocks
 * (Qwen2-7B's 7 vectors) that order timed slower (uattn-bench --layout tiled), so they keep each share's order. */
BF16_INLINE void tiled_fused(const uattn_panel_job *job, const decode_shape *s, const tiled_src *t, const uint8_t *tab,
                             const uint32_t *q, float *S, const int32_t D) {
  const int32_t Dh = D / 2, P = tab ? 2 : 1;                   /* tiles a share: 4 KB of each stream at head dim 128 */
  const size_t share = (size_t)TILED_KEYS * D * (tab ? 1 : 2); /* bytes of a head's share of a tile */
  vec_rule rule[4][4]; /* head 0's: the heads differ in slopes alone (bf16_softmax_cols) */
  for (int32_t b = 0; b < s->blocks; b++) {
    int32_t klo, khi;
    block_rules(job, s->x0[b], s->nb[b], 0, job->num_keys, rule[b], &klo, &khi);
  }
  /* the first shares, which no line asks for (the keys' are, where the call before was told of this one) */
  const char *k = tiled_stream_share(t, s->heads, 0, P, false), *v = tiled_stream_share(t, s->heads, 0, P, true);
  for (int32_t x = 0; x < P && t->T0 + x < t->T1; x++) /* its tiles' shares, a tile apart */
    for (size_t o = 0; o < share; o += 64) {
      _mm_prefetch(k + (size_t)x * t->tile_step + o, _MM_HINT_T1);
      _mm_prefetch(v + (size_t)x * t->tile_step + o, _MM_HINT_T1);
    }
  const int32_t shares = (t->T1 - t->T0 + P - 1) / P * s->heads;
  if (shares <= 0) return;
  if (tab) bf16_fused_order(job, s, NULL, unpack32_to, D); /* fp8: P V's order (tiled_pv_fp8_run) */
  tiled_share h, n;
  tiled_share_at(s, t, S, 0, P, &n);
  tiled_share_scores(job, s, t, tab, q, &n, P, Dh);
  const bool ahead = s->heads > 1 && s->blocks == 1; /* the next share's scores first (above) */
  for (int32_t y = 0; y < shares; y++) {
    h = n;
    if (y + 1 < shares) tiled_share_at(s, t, S, y + 1, P, &n);
    if (y + 1 < shares && ahead) tiled_share_scores(job, s, t, tab, q, &n, P, Dh);
    int32_t plo[4], phi[4];
    for (int32_t b = 0; b < s->blocks; b++)
      bf16_softmax_cols(job, s, h.g, b, rule[b], h.Sg + (size_t)s->x0[b] * s->W, h.c0, h.c1, &plo[b], &phi[b],
                        P * TILED_KEYS, D);
    const char *vn = tiled_stream_share(t, s->heads, y + 1, P, true);
    for (int32_t b = 0; tab && b < s->blocks; b++) {
      if (plo[b] >= phi[b]) continue;
      const uint32_t *pp = (const uint32_t *)(h.Sg + (size_t)s->x0[b] * s->W + (h.c0 - s->j0));
      const char *vg = t->v + (size_t)h.g * t->head_step;
      float *o = job->o + (size_t)h.g * s->hq + (size_t)s->x0[b] * D;
      const intptr_t pf = b == 0 && vn ? (intptr_t)((uintptr_t)vn - (uintptr_t)(t->v + h.at)) : 0;
      int32_t d = 0;
      for (; d + 64 <= D; d += 64)
        DECODE_BY_NB(s->nb[b], tiled_pv_fp8_run, 4, tab, pp, (size_t)s->W, h.c0, plo[b], phi[b], vg + 2 * d,
                     t->tile_step, D, o + d, pf);
      if (d < D)
        DECODE_BY_NB(s->nb[b], tiled_pv_fp8_run, 2, tab, pp, (size_t)s->W, h.c0, plo[b], phi[b], vg + 2 * d,
                     t->tile_step, D, o + d, pf);
    }
    for (int32_t b = 0; !tab && b < s->blocks; b++)
      if (plo[b] < phi[b])
        tiled_pv_vectors(s->nb[b], (const uint32_t *)(h.Sg + (size_t)s->x0[b] * s->W + (h.c0 - s->j0)), (size_t)s->W,
                         h.c0, plo[b], phi[b], t->v + h.at, D, job->o + (size_t)h.g * s->hq + (size_t)s->x0[b] * D,
                         b == 0 ? vn : NULL);
    if (y + 1 < shares && !ahead) tiled_share_scores(job, s, t, tab, q, &n, P, Dh);
  }
  if (tab) bf16_fused_order(job, s, NULL, unpack32_from, D);
}

/* kernels.h's decode_tiled: decode's job on a TILED cache (k_src, v_src: the block's first tile, the call's
 * first head; stride: elements from a tile to the next; head_stride: from a head's share of a tile to the
 * next head's); bf16 or fp8 codes, D a multiple of 32, P in bf16. */
BF16_INLINE void bf16_decode_tiled_body(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype t,
                                        const void *k_src, const void *v_src, size_t stride, size_t head_stride,
                                        float *scratch, const int32_t D) {
  decode_shape s;
  uint32_t *q;
  float *S;
  const uattn_decode_src tiles = uattn_decode_one_block(&k_src, &v_src, stride, head_stride); /* steps: a tile's */
  if (!bf16_decode_begin(job, heads, head_vectors, t, &tiles, scratch, D, &s, &q, &S)) return;
  const tiled_src src = {
      k_src,       v_src,      s.step, s.head_step, s.LO / TILED_KEYS, (s.HI + TILED_KEYS - 1) / TILED_KEYS,
      job->next_k, job->next_v};
  if (!uattn_dtype_is_fp8(t)) {
    tiled_fused(job, &s, &src, NULL, q, S, D);
    return;
  }
  tiled_fused(job, &s, &src, fp8_bf16_table(t), q, S, D);
}

#endif
