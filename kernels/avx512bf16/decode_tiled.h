/* The avx512bf16 set's decode kernel on uattn's own cache layout (UATTN_LAYOUT_TILED, uattn.h): decode.h's
 * jobs, phases and softmax (bf16_decode_softmax), with the products taken in the layout's order.
 *
 * Each block is tiles of 16 keys, each tile every KV head in turn, so an all-heads call reads its blocks in
 * address order, as on NHD. Within a tile and head:
 *   keys    one 64-byte line a dim pair of the 16 keys (bf16): vdpbf16ps of the line with the query's pair
 *           broadcast adds that pair's products to 16 scores at once, a lane a key. No reduction tree (NHD's
 *           bf16_sum16: 45 moves and adds for 16 scores) and no store of quarters: 16 scores are one vector.
 *           TILED_CHAINS partial sums over the pairs keep enough vdpbf16ps in flight for its latency.
 *   values  one line 16 dims of a key pair: vdpbf16ps with the pair's two P broadcast adds both keys to 16
 *           dims of the output, in the dims' order (NHD interleaves two rows by unpacks and keeps the output
 *           permuted during P V).
 * fp8 caches keep one code an element: a 64-byte line is two dim pairs of keys (or 32 dims of a key pair of
 * values), widened exactly into the bf16 lines above by vpermi2b lookups: keys by v16i_fp8_widen_in_order
 * (words in the codes' order, each vector one pair), values by v16i_fp8_widen (in-lane unpacks, cheaper than
 * vpermt2b), whose order of the dims (decode.h's unpack32_to) the outputs are put in for P V and back after.
 * Taking the keys by unpacks too (each vector then half one pair, half the next, the query's two pairs blended
 * into one vector) measured no faster: the blends cost what the permutes did.
 * Keys past a vector's visible ones inside a tile: their scores are computed but not stored (lanes outside
 * [LO, HI)) or masked by the softmax rules (P exactly 0); their values are zeroed before P V, since a
 * slot never written may hold NaN, and 0 x NaN would reach the output.
 * Against this set's NHD kernel on the Zen 4 VM (uattn-kernel-bench --decode-layouts, GQA 4, one row, ns a key
 * and KV head, three alternations): hot 13.4-14.7 against 15.4-15.8 on bf16, 14.9-15.7 against 17.7-17.9 on
 * fp8; on a cold walk fp8 19.0-20.6 against 19.8-21.8, and bf16 23.3-23.9 against 27.3-27.5 (24.9-25.9 against
 * 26.1-29.6 before the next paragraph's change) since its P V reads each head's share
 * of a tile in address order (tiled_pv_in_order; 31.9-32.8 before, the values then read in two interleaved
 * passes, 30% of the cold time on their loads).
 * The keys are a stream in address order already. With more vectors a head than one decode row at GQA 4 (two
 * rows: 17 ns a key and KV head with, 24-27 without), and with fp8 (whose arithmetic leaves the hardware
 * behind), the scores ask for each head's share TILED_AHEAD tiles on. One bf16 row asks for the walk's next
 * share (TILED_ROW_AHEAD: 4 KB on at head dim 128), and takes each query pair's broadcast inside its
 * vdpbf16ps ({1to16}: one instruction a product, not a load and a product): with fewer instructions a line of
 * keys the core's window holds more lines in flight. Measured (probes not kept: the kernel cut after its
 * scores, cold, one row, ns a key and KV head, where the keys' half of the plain read took 6.3-6.5): the
 * scores 10.4-11.2 against 4.0 hot, the memory and the arithmetic not overlapped at all; the same walk with
 * a plain add for the products 8.7-9.1 (the read's rate is not reached even without arithmetic), 7.7-7.9
 * asking for the next share; the scores asking for it 9.4-10.1. The whole walk (uattn-kernel-bench
 * --decode-layouts, 10-12 alternated runs, medians, TILED cold over the plain read): 1.60-1.69 -> 1.53
 * (22.9-23.9 -> 21.7 ns); the broadcasts alone 1.60 -> 1.57; two rows and fp8 unchanged. (Until then one
 * row's keys were left to the hardware prefetchers, with the scores asking only for the values' first tiles:
 * 13.7-14.5 ns with the tile-ahead prefetches against 11-11.7 without, when the broadcasts were loads.)
 * Where the cold walk's time went before (rdtsc around the phases, one row, a probe not kept): scores 11.5-13
 * ns a key and KV head, softmax 1.4, P V 9.5-10.5, where the bytes at the plain read's rate take 8.3 a phase.
 * Tried on the scores and not kept: sharing each broadcast between two tiles of a head (two streams 32 KB
 * apart) was no faster (13.3-14.1 against 12.2-13.8); asking for 2-8 lines of the next 4 KB page only (the
 * hardware's streams may stop at pages) bought about 1 ns, the whole share 1-3. Needs a head dim that is a
 * multiple of 32 and P in bf16 (not probs_fp32): kernels.h's
 * uattn_decode_tiled_fits; the forward gathers the blocks into rows for decode.h otherwise. */
#ifndef UATTN_AVX512BF16_DECODE_TILED_H
#define UATTN_AVX512BF16_DECODE_TILED_H

#include "avx512bf16/decode.h"
#include "avx512bf16/vec.h"

enum {
  TILED_KEYS = UATTN_TILED_KEYS, /* keys a tile (the layout's) */
  TILED_PV_KEYS = 32,            /* keys of an fp8 P V step: two tiles of every head, as decode.h's BF16_PV_TILE */
  TILED_AHEAD = 2,       /* tiles ahead of the one being scored that are asked for (past the last, the values) */
  TILED_ROW_AHEAD = 1,   /* shares of the walk ahead of the one being scored that one bf16 row asks for */
  TILED_PV_AHEAD = 8192, /* bytes of values ahead of the share bf16 P V reads that are asked for */
};

/* Where one call's tiles are (bytes) and which hold its keys. */
typedef struct tiled_src {
  const char *k, *v;           /* the block's first tile, the call's first head */
  size_t tile_step, head_step; /* from a tile to the next, from a head's share of a tile to the next head's */
  int32_t T0, T1;              /* tiles [T0, T1) hold the keys [LO, HI) */
} tiled_src;

/* Head g's share of tile x of the keys, or past the keys' last tile the values' (x - T1 + T0), to ask for
 * ahead; NULL past both. */
BF16_INLINE const char *tiled_ahead(const tiled_src *t, int32_t x, int32_t g) {
  if (x >= t->T1)
    x += t->T0 - t->T1;
  else
    return t->k + (size_t)x * t->tile_step + (size_t)g * t->head_step;
  return x < t->T1 ? t->v + (size_t)x * t->tile_step + (size_t)g * t->head_step : NULL;
}

/* Share y of the call's walk: the heads' shares of the keys' tiles in turn, then the values' likewise. */
BF16_INLINE const char *tiled_walk_share(const tiled_src *t, int32_t heads, int32_t y) {
  return tiled_ahead(t, t->T0 + y / heads, y % heads);
}

/* Whether the scores ask for the walk's share TILED_ROW_AHEAD on (one bf16 row: 4 vectors a head or fewer)
 * rather than each head's share TILED_AHEAD tiles on (more vectors, fp8). */
BF16_INLINE bool tiled_row_walk(const decode_shape *s, const uint8_t *tab) { return !tab && s->n <= 4; }

/* scale <q_i, k_j> for NB <= 4 vectors (bf16 pairs at q + i * Dh) and the 16 keys of one head's share of a
 * tile (kt), C partial sums over the pairs, into vector i's S row from column col, the lanes in `lanes`
 * only. pf: a share of a tile to ask for, a line per line read (NULL: none). tab: fp8 codes. */
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
      if (pf) _mm_prefetch(pf + 32 * (size_t)(p + c), _MM_HINT_T1);
    }
    for (int c = 0; !tab && c < C; c++) {
      k[c] = v16i_load(kt + 64 * (size_t)(p + c));
      if (pf) _mm_prefetch(pf + 64 * (size_t)(p + c), _MM_HINT_T1);
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
 * 4-8 accumulators, enough for vdpbf16ps's latency). */
#define TILED_SCORE(nb, ...)                                                                                           \
  do {                                                                                                                 \
    switch (nb) {                                                                                                      \
    case 1: tiled_score_tile(1, 4, __VA_ARGS__); break;                                                                \
    case 2: tiled_score_tile(2, 4, __VA_ARGS__); break;                                                                \
    case 3: tiled_score_tile(3, 2, __VA_ARGS__); break;                                                                \
    default: tiled_score_tile(4, 2, __VA_ARGS__); break;                                                               \
    }                                                                                                                  \
  } while (0)

/* The scores of every head and block, a tile at a time, every head in turn: S[g][x][j - j0] for keys
 * [LO, HI), the other columns zero. */
BF16_INLINE void tiled_scores(const decode_shape *s, const tiled_src *t, const uint32_t *q, const uint8_t *tab,
                              float scale, float *S, const int32_t D) {
  const int32_t Dh = D / 2;
  for (size_t x = 0; x < (size_t)s->heads * s->n; x++) memset(S + x * s->W, 0, sizeof(float) * (size_t)s->W);
  /* the shares the first scores ask past: the walk's first TILED_ROW_AHEAD, or the keys' first TILED_AHEAD tiles */
  const int32_t tiles = t->T1 - t->T0 < TILED_AHEAD ? t->T1 - t->T0 : TILED_AHEAD;
  const int32_t first = tiled_row_walk(s, tab) ? TILED_ROW_AHEAD : tiles * s->heads;
  for (int32_t y = 0; y < first; y++) {
    const char *share = tiled_walk_share(t, s->heads, y);
    for (size_t b = 0; share && b < (size_t)TILED_KEYS * D * (tab ? 1 : 2); b += 64)
      _mm_prefetch(share + b, _MM_HINT_T1);
  }
  for (int32_t T = t->T0; T < t->T1; T++) {
    const int32_t k0 = T * TILED_KEYS;
    const int32_t lo = s->LO > k0 ? s->LO : k0, hi = s->HI < k0 + TILED_KEYS ? s->HI : k0 + TILED_KEYS;
    const uint32_t lanes = ((1u << (hi - k0)) - 1) & ~((1u << (lo - k0)) - 1);
    for (int32_t g = 0; g < s->heads; g++) {
      const char *kt = t->k + (size_t)T * t->tile_step + (size_t)g * t->head_step;
      const char *pf = tiled_row_walk(s, tab)
                           ? tiled_walk_share(t, s->heads, (T - t->T0) * s->heads + g + TILED_ROW_AHEAD)
                           : tiled_ahead(t, T + TILED_AHEAD, g);
      for (int32_t b = 0; b < s->blocks; b++) /* column k0 - j0 >= -7: only lanes at or past LO >= j0 stored */
        TILED_SCORE(s->nb[b], Dh, tab, scale, q + ((size_t)g * s->n + s->x0[b]) * Dh, kt, b == 0 ? pf : NULL,
                    S + ((size_t)g * s->n + s->x0[b]) * s->W, (size_t)s->W, k0 - s->j0, lanes);
    }
  }
}

/* bf16 P V over one head's share of one tile: o_i += sum over keys [lo, hi) (within the tile) of P[i][j] v_j
 * for NB vectors and U x 16 dims (NB U <= 16 accumulators), keys in pairs from lo rounded down to even, each
 * pair's row of values (the share's next 64 U bytes) read whole: with U x 16 the head dim, the share is read
 * in address order. Otherwise as tiled_pv_fp8_run (pp, ld, j0, the mask of a pair's unseen key; o_i at o + i * D). */
BF16_INLINE void tiled_pv_share(const int NB, const int U, const uint32_t *pp, size_t ld, int32_t j0, int32_t lo,
                                int32_t hi, const char *v, const int32_t D, float *o) {
  v16 a[16];
  for (int i = 0; i < NB; i++)
    for (int u = 0; u < U; u++) a[i * U + u] = v16_load(o + (size_t)i * D + 16 * u);
  for (int32_t j = lo & ~1; j < hi; j += 2) {
    const char *r = v + (size_t)(j % TILED_KEYS / 2) * 4 * (size_t)D;
    v16i w[16];
    for (int u = 0; u < U; u++) w[u] = v16i_load(r + 64 * u);
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

/* bf16 P V of every head and block a tile at a time, every head in turn: each head's share of a tile (4 KB at
 * head dim 128) read in address order by its first pass of vectors (2 of 4 at head dim 128; the next pass
 * finds it in L1), heads up to 256 dims at once (beyond, in 256-dim pieces), so the values are one ascending
 * stream, which the hardware prefetchers follow. As a share starts, the share TILED_PV_AHEAD bytes on in the
 * walk (the heads' shares in turn, tile after tile) is asked for into L2 (prefetcht2): 8 KB ahead is what the
 * second pass, which reads L1 while the hardware waits, needs on this Zen 4 VM, at every head dim (rdtsc
 * around the phase, cold, 1 / 2 rows, ns a key and KV head: head dim 128 the next share 10.1-11.6 / 16.2-17.0,
 * 2 ahead 9.5-9.7 / 14.6-14.9, 3 and 4 ahead (12-16 KB) 16.3-16.9, worse than the next; head dim 64 the next
 * 6.7-7.1, 4 ahead 4.2; head dim 256 the next (8 KB) 32.7-33.0, 2 ahead 36.2-38.0). The walk, four
 * alternations with the next share's prefetch: 1 row 24.4-25.6 -> 23.0-23.7, 2 rows 34.2-37.9 -> 34.7-36.0;
 * head dim 64 14.6-15.2 -> 11.4-11.8.
 * Against tiled_pv_fp8's order (two tiles a step in 64-dim pieces: each share read in two interleaved
 * passes), uattn-kernel-bench --decode-layouts on the Zen 4 VM, four alternations, ns a key and KV head, 1 / 2
 * rows: cold 31.9-32.8 / 40.2-44.8 -> 24.9-25.9 / 34.2-35.1, hot 12.7-12.9 / 24.5-25.2 -> 13.5-13.7 /
 * 26.1-27.1. The P V phase alone (rdtsc around it, a probe not kept), cold: without the prefetch the two rows'
 * (the second pass reading from L1 while the hardware waits) took 25-27 ns against 15-19; prefetcht1 11.3-11.4
 * / 18.0-20.3 against prefetcht2's 10.3-12.4 / 15.0-18.8. Not for fp8: two passes would widen each line twice,
 * which costs more than the order buys there (its kernel is bound by its arithmetic: hot 16.4 -> 18.0); nor
 * did widening each fp8 share once into bf16 lines on the stack for the passes to read pay (hot 14.8 -> 17.9,
 * cold 18.8 -> 21.2; uattn-bench fp8 TILED decode 1 x 32k 4.9-5.0 / 2.7-2.9 -> 5.5-5.6 / 2.9-3.3 ms). */
BF16_INLINE void tiled_pv_in_order(const uattn_panel_job *job, const decode_shape *s, const tiled_src *t,
                                   const float *S, const int32_t D) {
  const size_t share = (size_t)TILED_KEYS * D * 2;
  /* shares ahead asked for, and how many of the values' first shares the scores asked for */
  const int32_t ahead = share < TILED_PV_AHEAD ? (int32_t)(TILED_PV_AHEAD / share) : 1;
  const int32_t asked = tiled_row_walk(s, NULL)        ? TILED_ROW_AHEAD
                        : t->T1 - t->T0 >= TILED_AHEAD ? TILED_AHEAD * s->heads
                                                       : 0;
  for (int32_t T = t->T0; T < t->T1; T++)
    for (int32_t g = 0; g < s->heads; g++) {
      const char *vt = t->v + (size_t)T * t->tile_step + (size_t)g * t->head_step;
      const int32_t x = (T - t->T0) * s->heads + g; /* this share's place in the walk */
      for (int32_t y = x > 0 ? x + ahead : asked > 1 ? asked : 1; y <= x + ahead; y++) {
        const char *next = tiled_walk_share(t, s->heads, (t->T1 - t->T0) * s->heads + y); /* the values' share y */
        if (!next) break;
        for (size_t b = 0; b < share; b += 64) _mm_prefetch(next + b, _MM_HINT_T2);
      }
      for (int32_t b = 0; b < s->blocks; b++) {
        const int32_t lo = T * TILED_KEYS > s->lo[b] ? T * TILED_KEYS : s->lo[b];
        const int32_t hi = (T + 1) * TILED_KEYS < s->hi[b] ? (T + 1) * TILED_KEYS : s->hi[b];
        if (lo >= hi) continue;
        const uint32_t *pp = (const uint32_t *)(S + ((size_t)g * s->n + s->x0[b]) * s->W);
        float *o = job->o + (size_t)g * s->hq + (size_t)s->x0[b] * D;
        for (int32_t d = 0; d < D; d += 256) {
          const int32_t U = (D - d < 256 ? D - d : 256) / 16;
          const char *vd = vt + 4 * (size_t)d;
          for (int32_t i = 0; i < s->nb[b];) {
            const int32_t nb = tiled_share_vectors(U, s->nb[b] - i);
            const uint32_t *pi = pp + (size_t)i * s->W;
            float *oi = o + (size_t)i * D + d;
            switch (U) {
            case 2: TILED_PV_SHARE(2, nb, pi, (size_t)s->W, s->j0, lo, hi, vd, D, oi); break;
            case 4: TILED_PV_SHARE(4, nb, pi, (size_t)s->W, s->j0, lo, hi, vd, D, oi); break;
            case 6: TILED_PV_SHARE(6, nb, pi, (size_t)s->W, s->j0, lo, hi, vd, D, oi); break;
            case 8: TILED_PV_SHARE(8, nb, pi, (size_t)s->W, s->j0, lo, hi, vd, D, oi); break;
            case 10: TILED_PV_SHARE(10, nb, pi, (size_t)s->W, s->j0, lo, hi, vd, D, oi); break;
            case 12: TILED_PV_SHARE(12, nb, pi, (size_t)s->W, s->j0, lo, hi, vd, D, oi); break;
            case 14: TILED_PV_SHARE(14, nb, pi, (size_t)s->W, s->j0, lo, hi, vd, D, oi); break;
            default: TILED_PV_SHARE(16, nb, pi, (size_t)s->W, s->j0, lo, hi, vd, D, oi); break;
            }
            i += nb;
          }
        }
      }
    }
}

/* fp8 P V: 16 U dims (U = 2 or 4) of o_i += sum over keys [lo, hi) of P[i][j] v_j for NB vectors, keys in
 * pairs from lo rounded down to even (a key of a pair outside [lo, hi) zeroed), each 32 dims of a pair widened
 * from one 32-byte piece of its row. pp: P as bf16 pairs, vector i's pair of keys (j, j + 1) at
 * pp[i * ld + (j - j0) / 2]; v: head g's share of the block's first tile, dims from d0; o_i at o + i * D, in
 * the dims' order of v16i_fp8_widen (unpack32_to). */
BF16_INLINE void tiled_pv_fp8_run(const int NB, const int U, const uint8_t *tab, const uint32_t *pp, size_t ld,
                                  int32_t j0, int32_t lo, int32_t hi, const char *v, size_t tile_step, const int32_t D,
                                  float *o) {
  v16 a[4][4];
  for (int i = 0; i < NB; i++)
    for (int u = 0; u < U; u++) a[i][u] = v16_load(o + (size_t)i * D + 16 * u);
  for (int32_t j = lo & ~1; j < hi; j += 2) {
    const char *r = v + (size_t)(j / TILED_KEYS) * tile_step + (size_t)(j % TILED_KEYS / 2) * 2 * D;
    v16i w[4];
    for (int u = 0; u < U; u += 2) v16i_fp8_widen(v16i_load(r + 32 * u), tab, &w[u], &w[u + 1]);
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

/* fp8 P V of every head and block, TILED_PV_KEYS keys at a time, every head in turn (the next step's tiles
 * asked for as a head starts this one), each line widened once; P as bf16 pairs, each S row's first W / 2
 * words. */
BF16_INLINE void tiled_pv_fp8(const uattn_panel_job *job, const decode_shape *s, const tiled_src *t, const uint8_t *tab,
                              const float *S, const int32_t D) {
  const size_t share = (size_t)TILED_KEYS * D;
  const int32_t first = s->LO / TILED_PV_KEYS * TILED_PV_KEYS, per = TILED_PV_KEYS / TILED_KEYS;
  for (int32_t jt = first; jt < s->HI; jt += TILED_PV_KEYS)
    for (int32_t g = 0; g < s->heads; g++) {
      /* the next step's tiles; in the first, those the scores did not ask for */
      for (int32_t x = jt / TILED_KEYS + (jt == first ? t->T0 + TILED_AHEAD - jt / TILED_KEYS : per);
           x < jt / TILED_KEYS + 2 * per && x < t->T1; x++)
        for (size_t b = 0; b < share; b += 64)
          _mm_prefetch(t->v + (size_t)x * t->tile_step + (size_t)g * t->head_step + b, _MM_HINT_T1);
      for (int32_t b = 0; b < s->blocks; b++) {
        const int32_t lo = jt > s->lo[b] ? jt : s->lo[b];
        const int32_t hi = jt + TILED_PV_KEYS < s->hi[b] ? jt + TILED_PV_KEYS : s->hi[b];
        if (lo >= hi) continue;
        const uint32_t *pp = (const uint32_t *)(S + ((size_t)g * s->n + s->x0[b]) * s->W);
        const char *vg = t->v + (size_t)g * t->head_step;
        float *o = job->o + (size_t)g * s->hq + (size_t)s->x0[b] * D;
        int32_t d = 0;
        for (; d + 64 <= D; d += 64)
          DECODE_BY_NB(s->nb[b], tiled_pv_fp8_run, 4, tab, pp, (size_t)s->W, s->j0, lo, hi, vg + 2 * d, t->tile_step, D,
                       o + d);
        if (d < D)
          DECODE_BY_NB(s->nb[b], tiled_pv_fp8_run, 2, tab, pp, (size_t)s->W, s->j0, lo, hi, vg + 2 * d, t->tile_step, D,
                       o + d);
      }
    }
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
  if (!bf16_decode_begin(job, heads, head_vectors, t, stride, head_stride, scratch, D, &s, &q, &S)) return;
  const tiled_src src = {k_src, v_src, s.step, s.head_step, s.LO / TILED_KEYS, (s.HI + TILED_KEYS - 1) / TILED_KEYS};
  if (uattn_dtype_is_fp8(t)) {
    _Alignas(64) uint8_t tab[256];
    fp8_bf16_tables(t, tab);
    tiled_scores(&s, &src, q, tab, job->scale, S, D);
    bf16_decode_softmax(true, job, &s, S, unpack32_to, D); /* the outputs rescaled and into P V's order */
    tiled_pv_fp8(job, &s, &src, tab, S, D);
    for (int32_t g = 0; g < heads; g++)
      for (int32_t x = 0; x < s.n; x++) unpack32_apply(job->o + g * s.hq + (size_t)x * D, D, unpack32_from);
    return;
  }
  tiled_scores(&s, &src, q, NULL, job->scale, S, D); /* a constant NULL: the bf16 instance has no fp8 branch */
  bf16_decode_softmax(true, job, &s, S, NULL, D);
  tiled_pv_in_order(job, &s, &src, S, D);
}

#endif
