/* The dense attention oracle (support/dense_oracle.c) against things a reader can check by hand: one key,
 * equal scores, a 1:3 softmax, causal rows, windows, sinks, soft cap, ALiBi, GQA, layouts, encoder and cross
 * masks, the cache update slot by slot, and the fp16/bf16 conversions on their edge values and against a
 * brute-force nearest-value search. Then the oracle's tiled, threaded loops against a plain re-statement
 * written here (one row, one head, one key at a time) on random steps with every feature on. uattn_forward is
 * tested against the oracle elsewhere; this suite is what makes the oracle worth trusting. This header holds
 * the small step builder the suite's files share (env.c). */
#ifndef UATTN_TEST_ORACLE_ENV_H
#define UATTN_TEST_ORACLE_ENV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "support/dense_oracle.h"
#include "uattn.h"

/* No .timeout here: with timeouts and --jobs 2, Criterion 2.4.1's runner leaks in the parent process and
 * LeakSanitizer then fails the whole suite. ctest's own timeout catches a hang. */
/* ================================================================================================ */
/* a small step builder                                                                               */
/* ================================================================================================ */

enum { MAXR = 8, MAXCOL = 640 };

/* One step with its own buffers. Caches start as NaN everywhere, so a read of any slot the step does not
 * own poisons the answer; unused block-table columns are -1, so following one is an error. */
typedef struct env {
  uattn_layer L;
  int32_t R, bs, nb, stride, T;
  int32_t nc[MAXR], ns[MAXR], enc[MAXR], qs[MAXR + 1];
  int32_t bt[MAXR * MAXCOL], cbt[MAXR * MAXCOL];
  uattn_cross cross;
  oracle_step s;
  uattn_tensors t;
  size_t cache_elems;
  void *q, *k, *v, *kc, *vc; /* owned; t points at them unless a test breaks t */
  double *out, *lse;
} env;

uattn_layer layer(int32_t hq, int32_t hkv, int32_t d, uattn_dtype dtype);
/* enc may be NULL (no cross sequence). Blocks are handed out in a scrambled order, never shared. */
void env_init(env *e, uattn_layer L, int32_t R, const int32_t *nc, const int32_t *ns, const int32_t *enc, int32_t bs,
              uint64_t seed);
void env_free(env *e);

/* Element index of (slot, kv head g, dim d) in the key (v false) or value cache, written out here rather
 * than taken from the oracle. TILED from uattn.h's shapes: keys [nb, bs/16, Hkv, D/2, 16, 2] at (block,
 * tile, g, d/2, key in tile, d%2), values [nb, bs/16, Hkv, 8, D, 2] at (block, tile, g, key/2, d, key%2). */
size_t slot_index(const env *e, int64_t slot, int32_t g, int32_t d, bool v);
int64_t slot_of(const env *e, bool cross, int32_t r, int32_t j);
void set_q(env *e, int32_t row, int32_t h, const double *x);
/* This step's k/v of (row, kv head g). */
void set_kv(env *e, int32_t row, int32_t g, const double *k, const double *v);
/* Key j of request r, kv head g, already in the cache (the step's table, or the cross table). */
void set_cache(env *e, bool cross, int32_t r, int32_t j, int32_t g, const double *k, const double *v);
/* The cache update, then the attention, each of which must succeed. */
void env_run(env *e);
const double *out_at(const env *e, int32_t row, int32_t h);
double lse_at(const env *e, int32_t row, int32_t h);
void expect_out(const env *e, int32_t row, int32_t h, const double *want, double tol);
void expect_lse(const env *e, int32_t row, int32_t h, double want, double tol);

/* Zero keys make every visible score 0, so each row's answer is the mean of the values it sees and its lse
 * is log(number of keys it sees): the mask can be read straight off the output. v_j = (j, 10 + j). */
void zero_keys_step(env *e, int32_t r, bool cache_too);

#endif
