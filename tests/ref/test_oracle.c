/* The dense attention oracle (support/dense_oracle.c) against things a reader can check by hand: one key,
 * equal scores, a 1:3 softmax, causal rows, windows, sinks, soft cap, ALiBi, GQA, layouts, encoder and cross
 * masks, the cache update slot by slot, and the fp16/bf16 conversions on their edge values and against a
 * brute-force nearest-value search. Then the oracle's tiled, threaded loops against a plain re-statement
 * written here (one row, one head, one key at a time) on random steps with every feature on. uattn_forward is
 * tested against the oracle elsewhere; this suite is what makes the oracle worth trusting. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/dense_oracle.h"
#include "common/support.h"

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

static uattn_layer layer(int32_t hq, int32_t hkv, int32_t d, uattn_dtype dtype) {
  return (uattn_layer){.num_q_heads = hq,
                       .num_kv_heads = hkv,
                       .head_dim = d,
                       .scale = 1.0f,
                       .dtype = dtype,
                       .cache_dtype = dtype,
                       .kv_layout = UATTN_LAYOUT_NHD,
                       .attn_type = UATTN_ATTENTION_DECODER};
}

static int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }

/* enc may be NULL (no cross sequence). Blocks are handed out in a scrambled order, never shared. */
static void env_init(env *e, uattn_layer L, int32_t R, const int32_t *nc, const int32_t *ns, const int32_t *enc,
                     int32_t bs, uint64_t seed) {
  memset(e, 0, sizeof *e);
  e->L = L;
  e->R = R;
  e->bs = bs;
  int32_t cols = 1;
  for (int32_t r = 0; r < R; r++) {
    e->nc[r] = nc[r];
    e->ns[r] = ns[r];
    e->enc[r] = enc ? enc[r] : 0;
    e->qs[r + 1] = e->qs[r] + ns[r];
    if (ceil_div(nc[r] + ns[r], bs) > cols) cols = ceil_div(nc[r] + ns[r], bs);
    if (ceil_div(e->enc[r], bs) > cols) cols = ceil_div(e->enc[r], bs);
  }
  cr_assert(R <= MAXR && cols + 1 <= MAXCOL, "test step too large");
  e->T = e->qs[R];
  e->stride = cols + 1;
  e->nb = 2 * R * e->stride + 3;
  int32_t *perm = malloc((size_t)e->nb * sizeof *perm);
  for (int32_t i = 0; i < e->nb; i++) perm[i] = i;
  test_rng rng = {seed};
  for (int32_t i = e->nb - 1; i > 0; i--) {
    int32_t j = test_rng_range(&rng, 0, i), x = perm[i];
    perm[i] = perm[j];
    perm[j] = x;
  }
  int32_t next = 0;
  for (int32_t r = 0; r < R; r++) {
    for (int32_t c = 0; c < e->stride; c++) {
      e->bt[r * e->stride + c] = c < ceil_div(nc[r] + ns[r], bs) ? perm[next++] : -1;
      e->cbt[r * e->stride + c] = c < ceil_div(e->enc[r], bs) ? perm[next++] : -1;
    }
  }
  free(perm);
  const size_t hq = (size_t)L.num_q_heads, hkv = (size_t)L.num_kv_heads, D = (size_t)L.head_dim;
  const size_t es = oracle_dtype_size(L.dtype), ces = oracle_dtype_size(L.cache_dtype), T = (size_t)e->T;
  e->cache_elems = (size_t)e->nb * (size_t)bs * hkv * D;
  e->t.q = e->q = calloc(T * hq * D + 1, es);
  e->t.k = e->k = calloc(T * hkv * D + 1, es);
  e->t.v = e->v = calloc(T * hkv * D + 1, es);
  e->t.key_cache = e->kc = malloc(e->cache_elems * ces);
  e->t.value_cache = e->vc = malloc(e->cache_elems * ces);
  for (size_t i = 0; i < e->cache_elems; i++) {
    oracle_store(e->t.key_cache, L.cache_dtype, i, NAN);
    oracle_store(e->t.value_cache, L.cache_dtype, i, NAN);
  }
  e->t.num_blocks = e->nb;
  e->cross = (uattn_cross){.encoder_lens = e->enc, .block_table = e->cbt, .block_table_stride = e->stride};
  e->t.cross = &e->cross;
  e->s = (oracle_step){.num_reqs = R,
                       .block_size = bs,
                       .num_computed = e->nc,
                       .num_scheduled = e->ns,
                       .num_prompt = NULL,
                       .block_table = e->bt,
                       .block_table_stride = e->stride};
  e->out = malloc((T * hq * D + 1) * sizeof *e->out);
  e->lse = malloc((T * hq + 1) * sizeof *e->lse);
}

static void env_free(env *e) {
  free(e->q);
  free(e->k);
  free(e->v);
  free(e->kc);
  free(e->vc);
  free(e->out);
  free(e->lse);
}

/* Element index of (slot, kv head g, dim d) in the key (v false) or value cache, written out here rather
 * than taken from the oracle. TILED from uattn.h's shapes: keys [nb, bs/16, Hkv, D/2, 16, 2] at (block,
 * tile, g, d/2, key in tile, d%2), values [nb, bs/16, Hkv, 8, D, 2] at (block, tile, g, key/2, d, key%2). */
static size_t slot_index(const env *e, int64_t slot, int32_t g, int32_t d, bool v) {
  const size_t hkv = (size_t)e->L.num_kv_heads, D = (size_t)e->L.head_dim, bs = (size_t)e->bs;
  const size_t block = (size_t)slot / bs, off = (size_t)slot % bs;
  if (e->L.kv_layout == UATTN_LAYOUT_HND) return ((block * hkv + (size_t)g) * bs + off) * D + (size_t)d;
  if (e->L.kv_layout == UATTN_LAYOUT_TILED) {
    const size_t tiles = bs / 16, tile = off / 16, key = off % 16;
    const size_t head = (block * tiles + tile) * hkv + (size_t)g; /* the (block, tile, head) group of 16 keys */
    if (v) return head * 16 * D + (key / 2) * 2 * D + (size_t)d * 2 + key % 2;
    return head * 16 * D + ((size_t)d / 2) * 32 + key * 2 + (size_t)d % 2;
  }
  return (block * bs * hkv + off * hkv + (size_t)g) * D + (size_t)d;
}

static int64_t slot_of(const env *e, bool cross, int32_t r, int32_t j) {
  const int32_t *table = cross ? e->cbt : e->bt;
  return (int64_t)table[r * e->stride + j / e->bs] * e->bs + j % e->bs;
}

static void set_q(env *e, int32_t row, int32_t h, const double *x) {
  const size_t D = (size_t)e->L.head_dim;
  for (size_t d = 0; d < D; d++)
    oracle_store(e->q, e->L.dtype, ((size_t)row * (size_t)e->L.num_q_heads + (size_t)h) * D + d, x[d]);
}

/* This step's k/v of (row, kv head g). */
static void set_kv(env *e, int32_t row, int32_t g, const double *k, const double *v) {
  const size_t D = (size_t)e->L.head_dim, off = ((size_t)row * (size_t)e->L.num_kv_heads + (size_t)g) * D;
  for (size_t d = 0; d < D; d++) {
    oracle_store(e->k, e->L.dtype, off + d, k[d]);
    oracle_store(e->v, e->L.dtype, off + d, v[d]);
  }
}

/* Key j of request r, kv head g, already in the cache (the step's table, or the cross table). */
static void set_cache(env *e, bool cross, int32_t r, int32_t j, int32_t g, const double *k, const double *v) {
  const int64_t slot = slot_of(e, cross, r, j);
  for (int32_t d = 0; d < e->L.head_dim; d++) {
    oracle_store(e->t.key_cache, e->L.cache_dtype, slot_index(e, slot, g, d, false), k[d]);
    oracle_store(e->t.value_cache, e->L.cache_dtype, slot_index(e, slot, g, d, true), v[d]);
  }
}

static void env_run(env *e) {
  cr_assert_eq(oracle_write_cache(&e->s, &e->L, &e->t), 0, "write_cache: %s", oracle_last_error());
  cr_assert_eq(oracle_attention(&e->s, &e->L, &e->t, e->out, e->lse), 0, "attention: %s", oracle_last_error());
}

static const double *out_at(const env *e, int32_t row, int32_t h) {
  return e->out + ((size_t)row * (size_t)e->L.num_q_heads + (size_t)h) * (size_t)e->L.head_dim;
}
static double lse_at(const env *e, int32_t row, int32_t h) { return e->lse[row * e->L.num_q_heads + h]; }

static void expect_out(const env *e, int32_t row, int32_t h, const double *want, double tol) {
  const double *got = out_at(e, row, h);
  for (int32_t d = 0; d < e->L.head_dim; d++)
    cr_assert(fabs(got[d] - want[d]) <= tol, "row %d head %d out[%d] = %.17g, expected %.17g", row, h, d, got[d],
              want[d]);
}

static void expect_lse(const env *e, int32_t row, int32_t h, double want, double tol) {
  const double got = lse_at(e, row, h);
  if (isinf(want))
    cr_assert(got == want, "row %d head %d lse = %.17g, expected %g", row, h, got, want);
  else
    cr_assert(fabs(got - want) <= tol, "row %d head %d lse = %.17g, expected %.17g", row, h, got, want);
}

/* ================================================================================================ */
/* hand-checkable attention                                                                           */
/* ================================================================================================ */

Test(hand, one_key_gives_its_value_and_score) {
  /* <q, k> = 0.5 * (1 - 3 + 8) = 3, scale 0.25: score 0.75; softmax of one logit is 1 */
  env e;
  uattn_layer L = layer(1, 1, 4, UATTN_F32);
  L.scale = 0.25f;
  env_init(&e, L, 1, (int32_t[]){0}, (int32_t[]){1}, NULL, 4, 1);
  set_q(&e, 0, 0, (double[]){0.5, 1, 1.5, 2});
  set_kv(&e, 0, 0, (double[]){1, 0, -1, 2}, (double[]){5, -6, 7, 0.125});
  env_run(&e);
  expect_out(&e, 0, 0, (double[]){5, -6, 7, 0.125}, 0);
  expect_lse(&e, 0, 0, 0.75, 0);
  env_free(&e);
}

Test(hand, two_equal_scores_average_cache_and_step_key) {
  /* key 0 from the cache, key 1 from this step; both score 2 */
  env e;
  env_init(&e, layer(1, 1, 4, UATTN_F32), 1, (int32_t[]){1}, (int32_t[]){1}, NULL, 4, 2);
  set_q(&e, 0, 0, (double[]){1, 0, 0, 0});
  set_cache(&e, false, 0, 0, 0, (double[]){2, 5, 0, 0}, (double[]){1, 2, 3, 4});
  set_kv(&e, 0, 0, (double[]){2, -3, 1, 1}, (double[]){3, 2, 1, 0});
  env_run(&e);
  expect_out(&e, 0, 0, (double[]){2, 2, 2, 2}, 1e-15);
  expect_lse(&e, 0, 0, 2 + log(2), 1e-15);
  env_free(&e);
}

Test(hand, known_two_by_two_softmax) {
  /* A 2-token prefill. Row 0 sees key 0 only. Row 1 scores 0 and ln 3: weights 1/4 and 3/4, lse ln 4. */
  env e;
  env_init(&e, layer(1, 1, 2, UATTN_F32), 1, (int32_t[]){0}, (int32_t[]){2}, NULL, 2, 3);
  const double ln3 = (double)(float)log(3.0); /* what an f32 input holds */
  set_q(&e, 0, 0, (double[]){7, 7});
  set_q(&e, 1, 0, (double[]){ln3, 0});
  set_kv(&e, 0, 0, (double[]){0, 0}, (double[]){1, 0});
  set_kv(&e, 1, 0, (double[]){1, 0}, (double[]){0, 1});
  env_run(&e);
  expect_out(&e, 0, 0, (double[]){1, 0}, 0);
  expect_lse(&e, 0, 0, 0, 0);
  expect_out(&e, 1, 0, (double[]){0.25, 0.75}, 1e-7); /* ln 3 rounded to f32: within 1e-7 */
  expect_out(&e, 1, 0, (double[]){1 / (1 + exp(ln3)), exp(ln3) / (1 + exp(ln3))}, 1e-15);
  expect_lse(&e, 1, 0, log(4), 1e-7);
  expect_lse(&e, 1, 0, log1p(exp(ln3)), 1e-15);
  env_free(&e);
}

/* Zero keys make every visible score 0, so each row's answer is the mean of the values it sees and its lse
 * is log(number of keys it sees): the mask can be read straight off the output. v_j = (j, 10 + j). */
static void zero_keys_step(env *e, int32_t r, bool cache_too) {
  const int32_t D = e->L.head_dim;
  double zero[8] = {0}, v[8] = {0};
  for (int32_t j = 0; j < e->nc[r] + e->ns[r]; j++) {
    v[0] = j;
    v[1] = 10 + j;
    for (int32_t g = 0; g < e->L.num_kv_heads; g++) {
      if (j < e->nc[r]) {
        if (cache_too) set_cache(e, false, r, j, g, zero, v);
      } else {
        set_kv(e, e->qs[r] + j - e->nc[r], g, zero, v);
      }
    }
  }
  for (int32_t i = 0; i < e->ns[r]; i++)
    for (int32_t h = 0; h < e->L.num_q_heads; h++) set_q(e, e->qs[r] + i, h, (double[]){1, -2, 3, 4, 5, 6, 7, 8});
  (void)D;
}

/* The mean of v_j over j in [lo, hi) and its lse. */
static void expect_mean(const env *e, int32_t row, int32_t h, int32_t lo, int32_t hi) {
  const double n = hi - lo, mean = (lo + hi - 1) / 2.0;
  expect_out(e, row, h, (double[]){mean, 10 + mean}, 1e-13);
  expect_lse(e, row, h, log(n), 1e-14);
}

Test(hand, causal_rows_and_requests) {
  /* request 0: a 4-token prefill; request 1: 3 tokens -- which must not see request 0's keys */
  env e;
  env_init(&e, layer(1, 1, 2, UATTN_F32), 2, (int32_t[]){0, 0}, (int32_t[]){4, 3}, NULL, 2, 4);
  zero_keys_step(&e, 0, true);
  zero_keys_step(&e, 1, true);
  env_run(&e);
  for (int32_t i = 0; i < 4; i++) expect_mean(&e, i, 0, 0, i + 1);
  for (int32_t i = 0; i < 3; i++) expect_mean(&e, 4 + i, 0, 0, i + 1);
  env_free(&e);
}

Test(hand, causal_with_cache_chunked_prefill_decode_and_drafts) {
  /* request 0: 3 cached + 2 new (chunked prefill); request 1: 5 cached + 1 (decode);
   * request 2: 2 cached + 3 (a decode with two drafts: draft i sees keys <= its own position only) */
  env e;
  env_init(&e, layer(1, 1, 2, UATTN_F32), 3, (int32_t[]){3, 5, 2}, (int32_t[]){2, 1, 3}, NULL, 4, 5);
  for (int32_t r = 0; r < 3; r++) zero_keys_step(&e, r, true);
  env_run(&e);
  expect_mean(&e, 0, 0, 0, 4);
  expect_mean(&e, 1, 0, 0, 5);
  expect_mean(&e, 2, 0, 0, 6);
  expect_mean(&e, 3, 0, 0, 3);
  expect_mean(&e, 4, 0, 0, 4);
  expect_mean(&e, 5, 0, 0, 5);
  env_free(&e);
}

Test(hand, sliding_window) {
  /* w = 2: the query at p sees p - 1 and p (only 0 at p = 0); w = 1: only itself; w = 0: no window */
  for (int32_t w = 0; w <= 2; w++) {
    env e;
    uattn_layer L = layer(1, 1, 2, UATTN_F32);
    L.sliding_window = w;
    env_init(&e, L, 2, (int32_t[]){0, 4}, (int32_t[]){3, 2}, NULL, 2, 6 + (uint64_t)w);
    zero_keys_step(&e, 0, true);
    zero_keys_step(&e, 1, true);
    env_run(&e);
    for (int32_t row = 0; row < 5; row++) {
      const int32_t p = row < 3 ? row : 4 + (row - 3);
      const int32_t lo = w > 0 && p - w + 1 > 0 ? p - w + 1 : 0;
      expect_mean(&e, row, 0, lo, p + 1);
    }
    env_free(&e);
  }
}

Test(hand, sinks_enter_the_denominator_only) {
  /* one key scoring 0; head 0 sink 0: out v/2, lse ln 2; head 1 sink ln 3 (as f32): out v/(1+3), lse ln 4;
   * head 2 sink -inf: as if none; head 3 sink 1000: out ~ 0, lse 1000, and no overflow */
  env e;
  uattn_layer L = layer(4, 1, 2, UATTN_F32);
  const float sinks[4] = {0, (float)log(3.0), -INFINITY, 1000};
  L.sinks = sinks;
  env_init(&e, L, 1, (int32_t[]){0}, (int32_t[]){1}, NULL, 2, 7);
  for (int32_t h = 0; h < 4; h++) set_q(&e, 0, h, (double[]){1, 1});
  set_kv(&e, 0, 0, (double[]){0, 0}, (double[]){8, -4});
  env_run(&e);
  expect_out(&e, 0, 0, (double[]){4, -2}, 1e-15);
  expect_lse(&e, 0, 0, log(2), 1e-15);
  const double s1 = sinks[1];
  expect_out(&e, 0, 1, (double[]){8 / (1 + exp(s1)), -4 / (1 + exp(s1))}, 1e-14);
  expect_out(&e, 0, 1, (double[]){2, -1}, 1e-6);
  expect_lse(&e, 0, 1, log1p(exp(s1)), 1e-15);
  expect_out(&e, 0, 2, (double[]){8, -4}, 0);
  expect_lse(&e, 0, 2, 0, 0);
  expect_out(&e, 0, 3, (double[]){8 * exp(-1000.0), -4 * exp(-1000.0)}, 1e-300);
  expect_lse(&e, 0, 3, 1000, 1e-12);
  env_free(&e);
}

Test(hand, rows_with_no_key) {
  /* Cross attention with an empty encoder sequence is the one way a row sees nothing: out 0 and lse -inf,
   * or lse = sink with a sink. The other request (3 encoder keys scoring 0) still gets its mean. */
  for (int with_sink = 0; with_sink < 2; with_sink++) {
    env e;
    uattn_layer L = layer(2, 1, 2, UATTN_F32);
    L.attn_type = UATTN_ATTENTION_ENCODER_DECODER;
    const float sinks[2] = {-1.5f, 2.0f};
    if (with_sink) L.sinks = sinks;
    env_init(&e, L, 2, (int32_t[]){0, 1}, (int32_t[]){1, 1}, (int32_t[]){0, 3}, 2, 8);
    for (int32_t h = 0; h < 2; h++) {
      set_q(&e, 0, h, (double[]){1, 1});
      set_q(&e, 1, h, (double[]){1, 1});
    }
    for (int32_t j = 0; j < 3; j++) set_cache(&e, true, 1, j, 0, (double[]){0, 0}, (double[]){j, 10 + j});
    env_run(&e);
    for (int32_t h = 0; h < 2; h++) {
      expect_out(&e, 0, h, (double[]){0, 0}, 0);
      cr_assert(!signbit(out_at(&e, 0, h)[0]) && !isnan(out_at(&e, 0, h)[1]));
      expect_lse(&e, 0, h, with_sink ? sinks[h] : -INFINITY, 0);
      if (!with_sink) {
        expect_mean(&e, 1, h, 0, 3);
      } else {
        /* three logits 0 and the sink: out = mean * 3 / (3 + e^sink), lse = ln(3 + e^sink) */
        const double z = 3 + exp((double)sinks[h]);
        expect_out(&e, 1, h, (double[]){3 * 1.0 / z, 3 * 11.0 / z}, 1e-14);
        expect_lse(&e, 1, h, log(z), 1e-14);
      }
    }
    env_free(&e);
  }
}

Test(hand, soft_cap) {
  /* scores 0 and 10 with cap 5: the second becomes 5 tanh(2) = 4.8201...; one-key row: lse = capped score */
  env e;
  uattn_layer L = layer(1, 1, 2, UATTN_F32);
  L.soft_cap = 5;
  env_init(&e, L, 1, (int32_t[]){0}, (int32_t[]){2}, NULL, 2, 9);
  set_q(&e, 0, 0, (double[]){0, 10});
  set_q(&e, 1, 0, (double[]){10, 0});
  set_kv(&e, 0, 0, (double[]){0, 1}, (double[]){1, 0});
  set_kv(&e, 1, 0, (double[]){1, 0}, (double[]){0, 1});
  env_run(&e);
  const double c = 5 * tanh(2.0);
  expect_out(&e, 0, 0, (double[]){1, 0}, 0);
  expect_lse(&e, 0, 0, c, 1e-15);
  expect_out(&e, 1, 0, (double[]){1 / (1 + exp(c)), exp(c) / (1 + exp(c))}, 1e-15);
  expect_lse(&e, 1, 0, log1p(exp(c)), 1e-14);
  cr_assert(fabs(lse_at(&e, 1, 0) - log1p(exp(10))) > 0.1, "the cap was not applied");
  env_free(&e);
}

Test(hand, alibi) {
  /* zero keys: logit_j = slope * (j - p). Head 0 slope 0.5, head 1 slope 0.25. A 3-token prefill's last row
   * (p = 2) weighs keys 0, 1, 2 as e^(-2s), e^(-s), 1; a decode at p = 5 after 5 cached keys likewise. */
  env e;
  uattn_layer L = layer(2, 1, 2, UATTN_F32);
  const float slopes[2] = {0.5f, 0.25f};
  L.alibi_slopes = slopes;
  env_init(&e, L, 2, (int32_t[]){0, 5}, (int32_t[]){3, 1}, NULL, 4, 10);
  zero_keys_step(&e, 0, true);
  zero_keys_step(&e, 1, true);
  env_run(&e);
  for (int32_t h = 0; h < 2; h++) {
    const struct { int32_t row, p; } rows[2] = {{2, 2}, {3, 5}};
    for (int k = 0; k < 2; k++) {
      double z = 0, o0 = 0, o1 = 0;
      for (int32_t j = 0; j <= rows[k].p; j++) {
        const double w = exp(slopes[h] * (j - rows[k].p));
        z += w;
        o0 += w * j;
        o1 += w * (10 + j);
      }
      expect_out(&e, rows[k].row, h, (double[]){o0 / z, o1 / z}, 1e-14);
      expect_lse(&e, rows[k].row, h, log(z), 1e-14);
    }
  }
  /* p = 2 head 0 by hand: weights e^-1, e^-0.5, 1 */
  const double a = exp(-1.0), b = exp(-0.5);
  expect_out(&e, 2, 0, (double[]){(b + 2) / (a + b + 1), (10 * a + 11 * b + 12) / (a + b + 1)}, 1e-14);
  env_free(&e);
}

Test(hand, gqa_head_mapping) {
  /* Hq 6, Hkv 2 (groups of 3) and Hq 4, Hkv 1 (MQA). One key: out[h] = v of KV head h / (Hq / Hkv) and
   * lse[h] = <q_h, k_g> = (h + 1) * (g + 1). */
  const int32_t shapes[2][2] = {{6, 2}, {4, 1}};
  for (int c = 0; c < 2; c++) {
    const int32_t hq = shapes[c][0], hkv = shapes[c][1];
    env e;
    env_init(&e, layer(hq, hkv, 2, UATTN_F32), 1, (int32_t[]){0}, (int32_t[]){1}, NULL, 2, 11);
    for (int32_t h = 0; h < hq; h++) set_q(&e, 0, h, (double[]){h + 1, 0});
    for (int32_t g = 0; g < hkv; g++) set_kv(&e, 0, g, (double[]){g + 1, 0}, (double[]){100 + g, -g});
    env_run(&e);
    for (int32_t h = 0; h < hq; h++) {
      const int32_t g = h / (hq / hkv);
      expect_out(&e, 0, h, (double[]){100 + g, -g}, 0);
      expect_lse(&e, 0, h, (h + 1) * (g + 1), 0);
    }
    env_free(&e);
  }
}

Test(hand, encoder_sees_every_key_of_its_request) {
  /* encoder and encoder-only: bidirectional; the window (1) and the causal mask do not apply; request 1's
   * 2 cached keys are part of its sequence, request 0's keys are not */
  const int32_t types[2] = {UATTN_ATTENTION_ENCODER, UATTN_ATTENTION_ENCODER_ONLY};
  for (int c = 0; c < 2; c++) {
    env e;
    uattn_layer L = layer(1, 1, 2, UATTN_F32);
    L.attn_type = types[c];
    L.sliding_window = 1;
    env_init(&e, L, 2, (int32_t[]){0, 2}, (int32_t[]){3, 2}, NULL, 2, 12);
    zero_keys_step(&e, 0, true);
    zero_keys_step(&e, 1, true);
    env_run(&e);
    for (int32_t i = 0; i < 3; i++) expect_mean(&e, i, 0, 0, 3);
    for (int32_t i = 3; i < 5; i++) expect_mean(&e, i, 0, 0, 4);
    env_free(&e);
  }
}

Test(hand, cross_attention_reads_the_encoder_sequence_only) {
  /* The step's own k/v are NaN: they must be neither read nor written. Request 0 has 3 encoder keys,
   * request 1 has 5; queries see all of them whatever their position, window or not. */
  env e;
  uattn_layer L = layer(1, 1, 2, UATTN_F32);
  L.attn_type = UATTN_ATTENTION_ENCODER_DECODER;
  L.sliding_window = 1;
  env_init(&e, L, 2, (int32_t[]){0, 7}, (int32_t[]){2, 1}, (int32_t[]){3, 5}, 2, 13);
  for (int32_t row = 0; row < 3; row++) {
    set_q(&e, row, 0, (double[]){1, 2});
    set_kv(&e, row, 0, (double[]){NAN, NAN}, (double[]){NAN, NAN});
  }
  for (int32_t r = 0; r < 2; r++)
    for (int32_t j = 0; j < e.enc[r]; j++) set_cache(&e, true, r, j, 0, (double[]){0, 0}, (double[]){j, 10 + j});
  /* one key of request 1 with a real score: 1 * 1 + 2 * 0.5 = 2 */
  set_cache(&e, true, 1, 4, 0, (double[]){1, 0.5}, (double[]){4, 14});
  const size_t bytes = e.cache_elems * oracle_dtype_size(L.cache_dtype);
  void *kc = malloc(bytes), *vc = malloc(bytes);
  memcpy(kc, e.t.key_cache, bytes);
  memcpy(vc, e.t.value_cache, bytes);
  env_run(&e);
  cr_assert(memcmp(kc, e.t.key_cache, bytes) == 0 && memcmp(vc, e.t.value_cache, bytes) == 0,
            "cross attention wrote to the caches");
  expect_mean(&e, 0, 0, 0, 3);
  expect_mean(&e, 1, 0, 0, 3);
  const double z = 4 + exp(2.0);
  expect_out(&e, 2, 0, (double[]){(0 + 1 + 2 + 3 + 4 * exp(2.0)) / z, (10 + 11 + 12 + 13 + 14 * exp(2.0)) / z}, 1e-14);
  expect_lse(&e, 2, 0, log(z), 1e-14);
  free(kc);
  free(vc);
  env_free(&e);
}

Test(hand, every_key_as_the_cache_holds_it) {
  /* f16 inputs, bf16 cache. k = 1 + 2^-9 is exact in f16 and rounds to 1 in bf16. Step 1 (a 1-token prefill)
   * scores its own key as the cache holds it: 1, not the input's 1 + 2^-9. Step 2 (decode at p = 1) reads
   * key 0 from the cache: 1 again. */
  env e;
  uattn_layer L = layer(1, 1, 1, UATTN_F16);
  L.cache_dtype = UATTN_BF16;
  const double k0 = 1 + 0x1p-9;
  env_init(&e, L, 1, (int32_t[]){0}, (int32_t[]){1}, NULL, 2, 14);
  set_q(&e, 0, 0, (double[]){1});
  set_kv(&e, 0, 0, (double[]){k0}, (double[]){3});
  env_run(&e);
  expect_lse(&e, 0, 0, 1.0, 0);
  cr_assert_eq(((const uint16_t *)e.t.key_cache)[slot_index(&e, slot_of(&e, false, 0, 0), 0, 0, false)], 0x3F80);

  /* step 2 on the same caches: one more token at p = 1, key 2 (exact in both) */
  e.nc[0] = 1;
  set_q(&e, 0, 0, (double[]){1});
  set_kv(&e, 0, 0, (double[]){2}, (double[]){5});
  env_run(&e);
  expect_lse(&e, 0, 0, log(exp(1.0) + exp(2.0)), 1e-15);
  expect_out(&e, 0, 0, (double[]){(3 * exp(1.0) + 5 * exp(2.0)) / (exp(1.0) + exp(2.0))}, 1e-15);
  env_free(&e);
}

Test(hand, a_masked_infinite_value_does_not_leak) {
  /* v_2 = inf: rows 0 and 1 do not see key 2 and must stay finite; row 2 sees it */
  env e;
  env_init(&e, layer(1, 1, 2, UATTN_F32), 1, (int32_t[]){0}, (int32_t[]){3}, NULL, 4, 15);
  zero_keys_step(&e, 0, true);
  set_kv(&e, 2, 0, (double[]){0, 0}, (double[]){INFINITY, 12});
  env_run(&e);
  expect_mean(&e, 0, 0, 0, 1);
  expect_mean(&e, 1, 0, 0, 2);
  cr_assert(isinf(out_at(&e, 2, 0)[0]));
  env_free(&e);
}

/* The same random history and step in each layout: bit-identical out and lse. */
static void check_layouts_agree(const uattn_kv_layout *layouts, int num_layouts, int32_t bs, int32_t D,
                                const int32_t *nc) {
  const uattn_dtype cdt[3] = {UATTN_F32, UATTN_BF16, UATTN_F16};
  const int32_t ns[3] = {1, 5, 3}, T = 9, Hq = 4;
  for (int c = 0; c < 3; c++) {
    double *outs[3], *lses[3];
    for (int lay = 0; lay < num_layouts; lay++) {
      env e;
      uattn_layer L = layer(Hq, 2, D, UATTN_F32);
      L.cache_dtype = cdt[c];
      L.kv_layout = layouts[lay];
      L.scale = 0.3f;
      env_init(&e, L, 3, nc, ns, NULL, bs, 16);
      test_rng rng = {99};
      double k[8], v[8];
      for (int32_t r = 0; r < 3; r++)
        for (int32_t j = 0; j < e.nc[r]; j++)
          for (int32_t g = 0; g < 2; g++) {
            for (int d = 0; d < D; d++) k[d] = test_rng_unit(&rng) * 2 - 1, v[d] = test_rng_unit(&rng) * 2 - 1;
            set_cache(&e, false, r, j, g, k, v);
          }
      for (int32_t row = 0; row < e.T; row++) {
        for (int32_t g = 0; g < 2; g++) {
          for (int d = 0; d < D; d++) k[d] = test_rng_unit(&rng) * 2 - 1, v[d] = test_rng_unit(&rng) * 2 - 1;
          set_kv(&e, row, g, k, v);
        }
        for (int32_t h = 0; h < Hq; h++) {
          for (int d = 0; d < D; d++) k[d] = test_rng_unit(&rng) * 4 - 2;
          set_q(&e, row, h, k);
        }
      }
      env_run(&e);
      cr_assert_eq(e.T, T);
      outs[lay] = malloc((size_t)T * Hq * D * sizeof(double));
      lses[lay] = malloc((size_t)T * Hq * sizeof(double));
      memcpy(outs[lay], e.out, (size_t)T * Hq * D * sizeof(double));
      memcpy(lses[lay], e.lse, (size_t)T * Hq * sizeof(double));
      for (int32_t i = 0; i < T * Hq * D; i++) cr_assert(isfinite(e.out[i]));
      env_free(&e);
    }
    for (int lay = 1; lay < num_layouts; lay++) {
      cr_assert(memcmp(outs[0], outs[lay], (size_t)T * Hq * D * sizeof(double)) == 0,
                "layouts %d and %d: outputs differ", layouts[0], layouts[lay]);
      cr_assert(memcmp(lses[0], lses[lay], (size_t)T * Hq * sizeof(double)) == 0, "layouts %d and %d: lse differs",
                layouts[0], layouts[lay]);
    }
    for (int lay = 0; lay < num_layouts; lay++) {
      free(outs[lay]);
      free(lses[lay]);
    }
  }
}

Test(hand, layouts_give_identical_answers) {
  const uattn_kv_layout all[3] = {UATTN_LAYOUT_NHD, UATTN_LAYOUT_HND, UATTN_LAYOUT_TILED};
  /* block 4, an odd head dim: NHD and HND only; block 16 (so TILED is allowed) with contexts across tiles
   * and blocks: all three */
  check_layouts_agree(all, 2, 4, 5, (int32_t[]){7, 0, 4});
  check_layouts_agree(all, 3, 16, 6, (int32_t[]){37, 0, 20});
}

/* ================================================================================================ */
/* the cache update                                                                                   */
/* ================================================================================================ */

/* Two requests, bs 4, Hkv 2, D 3: request 0 has 3 cached tokens and writes p = 3..6 (block 5 slot 3, then
 * block 1 slots 0..2: slots 23, 4, 5, 6); request 1 writes p = 0, 1 to block 2 (slots 8, 9). Every other
 * element of both caches must keep its sentinel. f32 in, the given cache dtype out. */
static void check_cache_write(uattn_kv_layout layout, uattn_dtype cache_dtype) {
  uattn_layer L = layer(2, 2, 3, UATTN_F32);
  L.cache_dtype = cache_dtype;
  L.kv_layout = layout;
  const int32_t bs = 4, nb = 6, hkv = 2, D = 3, T = 6;
  const int32_t nc[2] = {3, 0}, ns[2] = {4, 2};
  const int32_t bt[2 * 3] = {5, 1, -1, 2, -1, -1};
  const int64_t want_slot[6] = {23, 4, 5, 6, 8, 9};
  float k[6 * 2 * 3], v[6 * 2 * 3];
  for (int32_t i = 0; i < T * hkv * D; i++) {
    k[i] = (float)(i + 1) * 1.25f;
    v[i] = -(float)(i + 1) * 0.5f;
  }
  /* round-to-nearest-even ties in bf16 (1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6) and f16 (1 + 2^-11 -> 1) */
  k[0] = 1 + 0x1p-8f;
  k[1] = 1 + 0x1.8p-7f;
  k[2] = 1 + 0x1p-11f;
  const size_t es = oracle_dtype_size(cache_dtype), elems = (size_t)nb * bs * hkv * D;
  unsigned char *kc = malloc(elems * es), *vc = malloc(elems * es);
  memset(kc, 0xA5, elems * es);
  memset(vc, 0xA5, elems * es);
  oracle_step s = {.num_reqs = 2,
                   .block_size = bs,
                   .num_computed = nc,
                   .num_scheduled = ns,
                   .block_table = bt,
                   .block_table_stride = 3};
  uattn_tensors t = {.q = NULL, .k = k, .v = v, .key_cache = kc, .value_cache = vc, .num_blocks = nb};
  cr_assert_eq(oracle_write_cache(&s, &L, &t), 0, "%s", oracle_last_error());

  unsigned char *want_k = malloc(elems * es), *want_v = malloc(elems * es);
  memset(want_k, 0xA5, elems * es);
  memset(want_v, 0xA5, elems * es);
  for (int32_t row = 0; row < T; row++) {
    const int64_t block = want_slot[row] / bs, off = want_slot[row] % bs;
    for (int32_t g = 0; g < hkv; g++) {
      for (int32_t d = 0; d < D; d++) {
        const size_t at = layout == UATTN_LAYOUT_HND ? (size_t)(((block * hkv + g) * bs + off) * D + d)
                                                     : (size_t)((want_slot[row] * hkv + g) * D + d);
        const size_t src = (size_t)(row * hkv + g) * D + (size_t)d;
        oracle_store(want_k, cache_dtype, at, k[src]);
        oracle_store(want_v, cache_dtype, at, v[src]);
        cr_assert_eq(oracle_cache_index(&L, bs, want_slot[row], g, d, false), at);
        cr_assert_eq(oracle_cache_index(&L, bs, want_slot[row], g, d, true), at);
      }
    }
  }
  for (size_t i = 0; i < elems * es; i++) {
    cr_assert_eq(kc[i], want_k[i], "key cache byte %zu: %#x, expected %#x", i, kc[i], want_k[i]);
    cr_assert_eq(vc[i], want_v[i], "value cache byte %zu: %#x, expected %#x", i, vc[i], want_v[i]);
  }
  /* the ties, by hand: slot 23, head 0, d 0..2 */
  const size_t at = layout == UATTN_LAYOUT_HND ? (size_t)(((5 * hkv + 0) * bs + 3) * D) : (size_t)(23 * hkv * D);
  if (cache_dtype == UATTN_BF16) {
    const uint16_t *c = (const uint16_t *)kc;
    cr_assert(c[at] == 0x3F80 && c[at + 1] == 0x3F82, "bf16 ties: %#x %#x", c[at], c[at + 1]);
  } else if (cache_dtype == UATTN_F16) {
    const uint16_t *c = (const uint16_t *)kc;
    cr_assert(c[at] == 0x3C04 && c[at + 1] == 0x3C0C && c[at + 2] == 0x3C00, "f16: %#x %#x %#x", c[at], c[at + 1],
              c[at + 2]);
  } else {
    cr_assert(((const float *)kc)[at] == k[0]);
  }
  free(kc);
  free(vc);
  free(want_k);
  free(want_v);
}

Test(cache, write_at_the_right_slots_nhd) {
  check_cache_write(UATTN_LAYOUT_NHD, UATTN_F32);
  check_cache_write(UATTN_LAYOUT_NHD, UATTN_BF16);
  check_cache_write(UATTN_LAYOUT_NHD, UATTN_F16);
}

Test(cache, write_at_the_right_slots_hnd) {
  check_cache_write(UATTN_LAYOUT_HND, UATTN_F32);
  check_cache_write(UATTN_LAYOUT_HND, UATTN_BF16);
  check_cache_write(UATTN_LAYOUT_HND, UATTN_F16);
}

/* TILED's index is a bijection onto [0, num_blocks * bs * Hkv * D), keys and values each: every (slot, head,
 * dim) has its own element and no element is left over. Block sizes of one tile and several, Hkv 1 and 3,
 * head dims from one dim pair up. */
Test(cache, tiled_index_is_a_bijection) {
  const int32_t shapes[][4] = {
      /* bs, Hkv, D, num_blocks */
      {16, 1, 2, 1}, {16, 3, 6, 3}, {32, 2, 4, 2}, {64, 1, 80, 2}, {48, 3, 10, 3}, {256, 2, 64, 2}};
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    const int32_t bs = shapes[i][0], hkv = shapes[i][1], D = shapes[i][2], nb = shapes[i][3];
    uattn_layer L = layer(hkv, hkv, D, UATTN_F32);
    L.kv_layout = UATTN_LAYOUT_TILED;
    const size_t n = (size_t)nb * (size_t)bs * (size_t)hkv * (size_t)D;
    unsigned char *hit = malloc(n);
    for (int v = 0; v < 2; v++) {
      memset(hit, 0, n);
      for (int64_t slot = 0; slot < (int64_t)nb * bs; slot++)
        for (int32_t g = 0; g < hkv; g++)
          for (int32_t d = 0; d < D; d++) {
            const size_t at = oracle_cache_index(&L, bs, slot, g, d, v);
            cr_assert(at < n, "bs %d Hkv %d D %d %s: slot %lld head %d dim %d at %zu, past %zu", bs, hkv, D,
                      v ? "values" : "keys", (long long)slot, g, d, at, n);
            cr_assert(!hit[at], "bs %d Hkv %d D %d %s: element %zu reached twice (slot %lld head %d dim %d)", bs, hkv,
                      D, v ? "values" : "keys", at, (long long)slot, g, d);
            hit[at] = 1;
          }
      /* n distinct indices below n: every element is reached */
    }
    free(hit);
  }
}

/* Elements of bs 32, Hkv 2, D 4 worked out by hand from uattn.h's shapes: keys [nb, 2, 2, 2, 16, 2] (strides
 * 256, 128, 64, 32, 2, 1), values [nb, 2, 2, 8, 4, 2] (strides 256, 128, 64, 8, 2, 1). Slot s is block s / 32,
 * tile s % 32 / 16, key s % 16 of the tile. */
Test(cache, tiled_index_by_hand) {
  uattn_layer L = layer(2, 2, 4, UATTN_F32);
  L.kv_layout = UATTN_LAYOUT_TILED;
  const struct {
    int64_t slot;
    int32_t head, dim;
    size_t key, value;
  } want[] = {
      {0, 0, 0, 0, 0},
      {0, 0, 1, 1, 2},      /* key: dim 1 is e 1 of pair 0; value: dims are stride 2 */
      {1, 0, 0, 2, 1},      /* key 1: keys stride 2; value: key 1 is the odd one of pair 0 */
      {0, 0, 2, 32, 4},     /* key: dim pair 1 */
      {5, 0, 2, 42, 21},    /* key: 32 + 5 * 2; value: pair 2 (16) + dim 2 (4) + odd key (1) */
      {0, 1, 0, 64, 64},    /* the second head of tile 0 */
      {16, 0, 0, 128, 128}, /* tile 1 of block 0 */
      {17, 1, 3, 64 + 128 + 32 + 2 + 1, 64 + 128 + 6 + 1},
      {32, 0, 0, 256, 256}, /* block 1 */
      {95, 1, 3, 767, 767}, /* the last element of 3 blocks: block 2, tile 1, key 15, head 1, dim 3 */
      {94, 1, 2, 2 * 256 + 128 + 64 + 32 + 14 * 2, 2 * 256 + 128 + 64 + 7 * 8 + 2 * 2},
  };
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    const size_t k = oracle_cache_index(&L, 32, want[i].slot, want[i].head, want[i].dim, false);
    const size_t v = oracle_cache_index(&L, 32, want[i].slot, want[i].head, want[i].dim, true);
    cr_assert_eq(k, want[i].key, "slot %lld head %d dim %d: key index %zu, want %zu", (long long)want[i].slot,
                 want[i].head, want[i].dim, k, want[i].key);
    cr_assert_eq(v, want[i].value, "slot %lld head %d dim %d: value index %zu, want %zu", (long long)want[i].slot,
                 want[i].head, want[i].dim, v, want[i].value);
  }
  /* NHD and HND, same slots: one row of D per (slot, head) in both caches */
  L.kv_layout = UATTN_LAYOUT_NHD;
  cr_assert_eq(oracle_cache_index(&L, 32, 17, 1, 3, false), (size_t)(17 * 2 + 1) * 4 + 3);
  cr_assert_eq(oracle_cache_index(&L, 32, 17, 1, 3, true), (size_t)(17 * 2 + 1) * 4 + 3);
  L.kv_layout = UATTN_LAYOUT_HND;
  cr_assert_eq(oracle_cache_index(&L, 32, 49, 1, 2, false), (size_t)((1 * 2 + 1) * 32 + 17) * 4 + 2);
  cr_assert_eq(oracle_cache_index(&L, 32, 49, 1, 2, true), (size_t)((1 * 2 + 1) * 32 + 17) * 4 + 2);
}

/* The cache update on TILED, bs 32, Hkv 2, D 4, 3 blocks: request 0 has 30 cached tokens and writes p = 30..33
 * (block 2 keys 30, 31 (tile 1), then block 0 keys 0, 1: slots 94, 95, 0, 1); request 1 writes p = 15..17
 * across tiles 0 and 1 of block 1 (slots 47, 48, 49). Every element lands where test_oracle's own index puts
 * it, the rest keep their sentinel; the first key's elements by hand. */
static void check_tiled_cache_write(uattn_dtype cache_dtype) {
  uattn_layer L = layer(2, 2, 4, UATTN_F32);
  L.cache_dtype = cache_dtype;
  L.kv_layout = UATTN_LAYOUT_TILED;
  if (oracle_is_fp8(cache_dtype)) L.k_scale = 0.5f, L.v_scale = 2.0f;
  const int32_t bs = 32, nb = 3, hkv = 2, D = 4, T = 7;
  const int32_t nc[2] = {30, 15}, ns[2] = {4, 3}, np[2] = {34, 18}; /* prompts: fp8 caches ask */
  const int32_t bt[2 * 2] = {2, 0, 1, -1};
  const int64_t want_slot[7] = {94, 95, 0, 1, 47, 48, 49};
  float k[7 * 2 * 4], v[7 * 2 * 4];
  for (int32_t i = 0; i < T * hkv * D; i++) {
    k[i] = (float)(i + 1) * 0.25f;
    v[i] = -(float)(i + 1) * 0.125f;
  }
  const size_t es = oracle_dtype_size(cache_dtype), elems = (size_t)nb * bs * hkv * D;
  unsigned char *kc = malloc(elems * es), *vc = malloc(elems * es);
  memset(kc, 0xA5, elems * es);
  memset(vc, 0xA5, elems * es);
  oracle_step s = {.num_reqs = 2,
                   .block_size = bs,
                   .num_computed = nc,
                   .num_scheduled = ns,
                   .num_prompt = np,
                   .block_table = bt,
                   .block_table_stride = 2};
  uattn_tensors t = {.q = NULL, .k = k, .v = v, .key_cache = kc, .value_cache = vc, .num_blocks = nb};
  cr_assert_eq(oracle_write_cache(&s, &L, &t), 0, "%s", oracle_last_error());

  env e; /* only for slot_index: its layer, block size and nothing else */
  memset(&e, 0, sizeof e);
  e.L = L;
  e.bs = bs;
  unsigned char *want_k = malloc(elems * es), *want_v = malloc(elems * es);
  memset(want_k, 0xA5, elems * es);
  memset(want_v, 0xA5, elems * es);
  for (int32_t row = 0; row < T; row++)
    for (int32_t g = 0; g < hkv; g++)
      for (int32_t d = 0; d < D; d++) {
        const size_t src = (size_t)(row * hkv + g) * D + (size_t)d;
        const size_t ak = slot_index(&e, want_slot[row], g, d, false), av = slot_index(&e, want_slot[row], g, d, true);
        if (oracle_is_fp8(cache_dtype)) {
          want_k[ak] = oracle_quantize_fp8(cache_dtype, k[src], L.k_scale);
          want_v[av] = oracle_quantize_fp8(cache_dtype, v[src], L.v_scale);
        } else {
          oracle_store(want_k, cache_dtype, ak, k[src]);
          oracle_store(want_v, cache_dtype, av, v[src]);
        }
      }
  for (size_t i = 0; i < elems * es; i++) {
    cr_assert_eq(kc[i], want_k[i], "key cache byte %zu: %#x, expected %#x", i, kc[i], want_k[i]);
    cr_assert_eq(vc[i], want_v[i], "value cache byte %zu: %#x, expected %#x", i, vc[i], want_v[i]);
  }
  /* row 0 (slot 94: block 2, tile 1, key 14), head 0: keys at 640 + 28 + {0, 1, 32, 33}, values at
   * 640 + 56 + {0, 2, 4, 6} (key 14 is the even one of pair 7) */
  const size_t kat[4] = {668, 669, 700, 701}, vat[4] = {696, 698, 700, 702};
  for (int32_t d = 0; d < D && !oracle_is_fp8(cache_dtype); d++) {
    cr_assert_eq(oracle_load(kc, cache_dtype, kat[d]), oracle_round(cache_dtype, k[d]), "slot 94 key dim %d", d);
    cr_assert_eq(oracle_load(vc, cache_dtype, vat[d]), oracle_round(cache_dtype, v[d]), "slot 94 value dim %d", d);
  }
  free(kc);
  free(vc);
  free(want_k);
  free(want_v);
}

Test(cache, write_at_the_right_slots_tiled) {
  check_tiled_cache_write(UATTN_F32);
  check_tiled_cache_write(UATTN_BF16);
  check_tiled_cache_write(UATTN_F16);
  check_tiled_cache_write(UATTN_FP8_E4M3);
  check_tiled_cache_write(UATTN_FP8_E5M2);
}

Test(cache, equal_dtypes_copy_bits_and_cross_writes_nothing) {
  /* f32 -> f32 keeps a signalling NaN's exact bits; bf16 -> bf16 keeps its pattern */
  uattn_layer L = layer(1, 1, 1, UATTN_F32);
  uint32_t snan = 0x7F800001u, kc[4], vc[4];
  float k, v = 1;
  memcpy(&k, &snan, sizeof k);
  memset(kc, 0, sizeof kc);
  memset(vc, 0, sizeof vc);
  const int32_t nc = 2, ns = 1, bt[1] = {0};
  oracle_step s = {.num_reqs = 1,
                   .block_size = 4,
                   .num_computed = &nc,
                   .num_scheduled = &ns,
                   .block_table = bt,
                   .block_table_stride = 1};
  uattn_tensors t = {.k = &k, .v = &v, .key_cache = kc, .value_cache = vc, .num_blocks = 1};
  cr_assert_eq(oracle_write_cache(&s, &L, &t), 0, "%s", oracle_last_error());
  cr_assert(kc[2] == snan && kc[0] == 0 && kc[1] == 0 && kc[3] == 0);

  L.attn_type = UATTN_ATTENTION_ENCODER_DECODER;
  memset(kc, 0, sizeof kc);
  const int32_t enc = 1;
  uattn_cross cross = {.encoder_lens = &enc, .block_table = bt, .block_table_stride = 1};
  t.cross = &cross;
  cr_assert_eq(oracle_write_cache(&s, &L, &t), 0, "%s", oracle_last_error());
  for (int i = 0; i < 4; i++) cr_assert(kc[i] == 0 && vc[i] == (i == 2 ? 0x3F800000u : 0u));
}

Test(cache, encoder_self_attention_writes_like_the_decoder) {
  uattn_layer L = layer(1, 1, 1, UATTN_F32);
  L.attn_type = UATTN_ATTENTION_ENCODER;
  float k[2] = {3, 4}, v[2] = {5, 6}, kc[8] = {0}, vc[8] = {0};
  const int32_t nc = 3, ns = 2, bt[2] = {1, 0};
  oracle_step s = {.num_reqs = 1,
                   .block_size = 4,
                   .num_computed = &nc,
                   .num_scheduled = &ns,
                   .block_table = bt,
                   .block_table_stride = 2};
  uattn_tensors t = {.k = k, .v = v, .key_cache = kc, .value_cache = vc, .num_blocks = 2};
  cr_assert_eq(oracle_write_cache(&s, &L, &t), 0, "%s", oracle_last_error());
  /* p = 3 -> block 1 slot 7; p = 4 -> block 0 slot 0 */
  for (int i = 0; i < 8; i++)
    cr_assert(kc[i] == (i == 7 ? 3.0f : i == 0 ? 4.0f : 0.0f) && vc[i] == (i == 7 ? 5.0f : i == 0 ? 6.0f : 0.0f));
}

/* ================================================================================================ */
/* conversions                                                                                        */
/* ================================================================================================ */

static void expect_bf16(double x, uint16_t want) {
  const uint16_t got = oracle_double_to_bf16(x);
  cr_assert_eq(got, want, "bf16(%a) = %#06x, expected %#06x", x, got, want);
}

static void expect_f16(double x, uint16_t want) {
  const uint16_t got = oracle_double_to_f16(x);
  cr_assert_eq(got, want, "f16(%a) = %#06x, expected %#06x", x, got, want);
}

static float float_of_bits(uint32_t b) {
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}

Test(convert, bf16_edge_values) {
  expect_bf16(0.0, 0x0000);
  expect_bf16(-0.0, 0x8000);
  expect_bf16(1.0, 0x3F80);
  expect_bf16(-2.0, 0xC000);
  /* ties go to even; anything past the tie goes up */
  expect_bf16(1 + 0x1p-8, 0x3F80);
  expect_bf16(1 + 0x1.8p-7, 0x3F82);
  expect_bf16(1 + 0x1p-8 + 0x1p-40, 0x3F81);
  expect_bf16(1 + 0x1p-8 - 0x1p-40, 0x3F80);
  /* largest finite (2 - 2^-7) 2^127; the tie above it (odd mantissa) and FLT_MAX round to inf */
  expect_bf16(0x1.FEp127, 0x7F7F);
  expect_bf16(0x1.FFp127, 0x7F80);
  expect_bf16(0x1.FEFFFFp127, 0x7F7F);
  expect_bf16((double)float_of_bits(0x7F7FFFFF), 0x7F80);
  expect_bf16(-1e300, 0xFF80);
  /* subnormals: 2^-133 is the smallest; 2^-134 is a tie with 0 (even); 3 * 2^-134 a tie between 1 and 2 */
  expect_bf16(0x1p-133, 0x0001);
  expect_bf16(0x1p-134, 0x0000);
  expect_bf16(0x1.8p-134, 0x0001);
  expect_bf16(0x3p-134, 0x0002);
  expect_bf16(127 * 0x1p-133, 0x007F);
  expect_bf16(0x1p-126, 0x0080);
  expect_bf16(0x1p-126 - 0x1p-134, 0x0080); /* tie between 0x7F and 0x80: the even one, the smallest normal */
  expect_bf16(-0x1p-133, 0x8001);
  expect_bf16(0x1p-149, 0x0000);  /* the smallest float subnormal */
  expect_bf16(-1e-300, 0x8000);   /* underflow keeps the sign */
  expect_bf16(0x1p-1074, 0x0000); /* a double subnormal */
  expect_bf16(INFINITY, 0x7F80);
  expect_bf16(-INFINITY, 0xFF80);
  /* NaN stays NaN (quiet), whatever its payload: a low-bits-only payload must not turn into inf */
  cr_assert_eq(oracle_double_to_bf16(NAN) & 0x7FC0, 0x7FC0);
  cr_assert_eq(oracle_float_to_bf16(float_of_bits(0x7F800001)), 0x7FC0);
  cr_assert_eq(oracle_float_to_bf16(float_of_bits(0xFF800001)), 0xFFC0);
  cr_assert_eq(oracle_float_to_bf16(float_of_bits(0x7FA00000)), 0x7FE0); /* sNaN: payload kept, quieted */
  cr_assert_eq(oracle_float_to_bf16(float_of_bits(0x3F808000)), 0x3F80); /* the f32 tie, once rounded */
  cr_assert_eq(oracle_float_to_bf16(float_of_bits(0x3F818000)), 0x3F82);

  cr_assert(oracle_bf16_to_double(0x0001) == 0x1p-133);
  cr_assert(oracle_bf16_to_double(0x7F7F) == 0x1.FEp127);
  cr_assert(oracle_bf16_to_double(0x3F81) == 1 + 0x1p-7);
  cr_assert(oracle_bf16_to_double(0xFF80) == -INFINITY);
  cr_assert(isnan(oracle_bf16_to_double(0x7FC0)) && isnan(oracle_bf16_to_double(0x7F81)));
  const double mz = oracle_bf16_to_double(0x8000);
  cr_assert(mz == 0 && signbit(mz));
}

Test(convert, f16_edge_values) {
  expect_f16(0.0, 0x0000);
  expect_f16(-0.0, 0x8000);
  expect_f16(1.0, 0x3C00);
  expect_f16(-2.0, 0xC000);
  expect_f16(0.1, 0x2E66);
  expect_f16(1.0 / 3, 0x3555);
  expect_f16(3.14159265358979, 0x4248);
  /* ties to even in the normal range */
  expect_f16(1 + 0x1p-11, 0x3C00);
  expect_f16(1 + 0x3p-11, 0x3C02);
  expect_f16(1 + 0x1p-11 + 0x1p-40, 0x3C01);
  /* 65504 is the largest; 65519.99 rounds down; 65520 is the tie with 2^16 (odd mantissa): inf */
  expect_f16(65504, 0x7BFF);
  expect_f16(65519.99, 0x7BFF);
  expect_f16(65520, 0x7C00);
  expect_f16(65536, 0x7C00);
  expect_f16(-1e10, 0xFC00);
  /* subnormals: 2^-24 the smallest, 2^-25 a tie with 0, 3 * 2^-25 a tie between 1 and 2 */
  expect_f16(0x1p-24, 0x0001);
  expect_f16(0x1p-25, 0x0000);
  expect_f16(0x1p-25 + 0x1p-50, 0x0001);
  expect_f16(0x3p-25, 0x0002);
  expect_f16(1023 * 0x1p-24, 0x03FF);
  expect_f16(0x1p-14, 0x0400);
  expect_f16(0x1p-14 - 0x1p-25, 0x0400); /* tie between 0x3FF and 0x400: the even one */
  expect_f16(0x1p-14 - 0x3p-26, 0x03FF);
  expect_f16(-0x1p-24, 0x8001);
  expect_f16(-1e-30, 0x8000);
  expect_f16(INFINITY, 0x7C00);
  expect_f16(-INFINITY, 0xFC00);
  const uint16_t n = oracle_double_to_f16(-NAN);
  cr_assert((n & 0x7E00) == 0x7E00 && (n & 0x8000), "-NaN -> %#x", n);
  cr_assert_eq(oracle_float_to_f16(float_of_bits(0x7F800001)), 0x7E00);
  cr_assert_eq(oracle_float_to_f16(float_of_bits(0x477FF000)), 0x7C00); /* 65520.0f */

  cr_assert(oracle_f16_to_double(0x0001) == 0x1p-24);
  cr_assert(oracle_f16_to_double(0x03FF) == 1023 * 0x1p-24);
  cr_assert(oracle_f16_to_double(0x0400) == 0x1p-14);
  cr_assert(oracle_f16_to_double(0x7BFF) == 65504);
  cr_assert(oracle_f16_to_double(0x3555) == 0.333251953125);
  cr_assert(oracle_f16_to_double(0xFC00) == -INFINITY);
  cr_assert(isnan(oracle_f16_to_double(0x7E00)) && isnan(oracle_f16_to_double(0x7C01)));
  const double mz = oracle_f16_to_double(0x8000);
  cr_assert(mz == 0 && signbit(mz));
}

/* Every pattern: widening is strictly increasing over the finite positives and narrowing undoes it. */
static void check_exhaustive(double (*widen)(uint16_t), uint16_t (*narrow)(double), uint16_t max_finite) {
  for (uint32_t h = 0; h < 0x10000; h++) {
    const double x = widen((uint16_t)h);
    if (isnan(x)) {
      cr_assert((h & 0x7FFF) > (uint32_t)max_finite + 1, "%#x widened to NaN", h);
      cr_assert(isnan(widen(narrow(x))), "NaN %#x did not stay NaN", h);
      continue;
    }
    cr_assert_eq(narrow(x), h, "%#x -> %a -> %#x", h, x, narrow(x));
    if ((h & 0x7FFF) < max_finite && h < 0x8000) cr_assert(widen((uint16_t)(h + 1)) > x, "not increasing at %#x", h);
  }
}

Test(convert, exhaustive_round_trips) {
  check_exhaustive(oracle_bf16_to_double, oracle_double_to_bf16, 0x7F7F);
  check_exhaustive(oracle_f16_to_double, oracle_double_to_f16, 0x7BFF);
}

/* Narrowing against its definition: the nearest of all finite values plus 2^(emax+1) (which stands for
 * inf), ties to the even pattern, searched in the sorted table -- no bit manipulation. Inputs: random
 * magnitudes over the whole range, every exact midpoint of a neighbour pair, and the doubles next to it. */
static void check_nearest(double (*widen)(uint16_t), uint16_t (*narrow)(double), uint16_t max_finite, double beyond,
                          uint64_t seed) {
  const int n = max_finite + 2;
  double *val = malloc((size_t)n * sizeof *val);
  for (int i = 0; i <= max_finite; i++) val[i] = widen((uint16_t)i);
  val[max_finite + 1] = beyond; /* the pattern after max_finite is inf */
  test_rng rng = {seed};
  for (int trial = 0; trial < 60000; trial++) {
    double x;
    const int kind = trial % 3;
    const int i = test_rng_range(&rng, 0, n - 2);
    const double mid = (val[i] + val[i + 1]) / 2; /* exact: one bit more than the format */
    if (kind == 0)
      x = mid;
    else if (kind == 1)
      x = nextafter(mid, test_rng_next(&rng) & 1 ? INFINITY : 0);
    else
      x = val[i] + (val[i + 1] - val[i]) * test_rng_unit(&rng);
    /* nearest by search */
    int lo = 0, hi = n - 1;
    while (hi - lo > 1) {
      const int m = (lo + hi) / 2;
      if (val[m] <= x)
        lo = m;
      else
        hi = m;
    }
    int want = x - val[lo] < val[hi] - x ? lo : x - val[lo] > val[hi] - x ? hi : (lo % 2 == 0 ? lo : hi);
    if (x >= val[n - 1]) want = n - 1;
    for (int sgn = 0; sgn < 2; sgn++) {
      const double y = sgn ? -x : x;
      const uint16_t w = (uint16_t)(want | (sgn ? 0x8000 : 0)), got = narrow(y);
      cr_assert_eq(got, w, "%a -> %#x, nearest is %#x", y, got, w);
    }
  }
  free(val);
}

Test(convert, narrowing_is_the_nearest_value_ties_to_even) {
  check_nearest(oracle_bf16_to_double, oracle_double_to_bf16, 0x7F7F, 0x1p128, 17);
  check_nearest(oracle_f16_to_double, oracle_double_to_f16, 0x7BFF, 0x1p16, 18);
}

Test(convert, load_store_round) {
  unsigned char buf[16];
  oracle_store(buf, UATTN_F32, 1, 1 + 0x1p-24); /* tie: to 1.0f */
  cr_assert(((const float *)buf)[1] == 1.0f && oracle_load(buf, UATTN_F32, 1) == 1.0);
  oracle_store(buf, UATTN_BF16, 3, 0x1.FFp127);
  cr_assert(isinf(oracle_load(buf, UATTN_BF16, 3)));
  oracle_store(buf, UATTN_F16, 2, 0x1p-25 * 3);
  cr_assert(oracle_load(buf, UATTN_F16, 2) == 0x1p-23);
  cr_assert(oracle_round(UATTN_BF16, 1 + 0x1p-8) == 1 && oracle_round(UATTN_F16, 1 + 0x1p-8) == 1 + 0x1p-8);
  cr_assert(oracle_dtype_size(UATTN_F32) == 4 && oracle_dtype_size(UATTN_BF16) == 2 &&
            oracle_dtype_size(UATTN_F16) == 2 && oracle_dtype_size((uattn_dtype)7) == 0);
}

/* ================================================================================================ */
/* a plain re-statement, against the oracle's tiled and threaded loops                               */
/* ================================================================================================ */

/* Key (or value) j of request r as the cache holds it after the step: every key, this step's too. */
static double key_elem(const env *e, bool v, int32_t r, int32_t j, int32_t g, int32_t d) {
  const bool cross = e->L.attn_type == UATTN_ATTENTION_ENCODER_DECODER;
  const size_t at = slot_index(e, slot_of(e, cross, r, j), g, d, v);
  return oracle_load(v ? e->t.value_cache : e->t.key_cache, e->L.cache_dtype, at);
}

/* docs/design.md's semantics, one (row, head, key) at a time. */
static void plain_attention(const env *e, double *out, double *lse) {
  const uattn_layer *L = &e->L;
  const int32_t Hq = L->num_q_heads, D = L->head_dim, group = Hq / L->num_kv_heads;
  double *logit = malloc(4096 * sizeof *logit);
  for (int32_t r = 0; r < e->R; r++) {
    for (int32_t i = 0; i < e->ns[r]; i++) {
      const int32_t row = e->qs[r] + i, p = e->nc[r] + i;
      for (int32_t h = 0; h < Hq; h++) {
        const int32_t g = h / group;
        int32_t lo = 0, hi;
        if (L->attn_type == UATTN_ATTENTION_ENCODER_DECODER)
          hi = e->enc[r];
        else if (L->attn_type != UATTN_ATTENTION_DECODER)
          hi = e->nc[r] + e->ns[r];
        else {
          hi = p + 1;
          if (L->sliding_window > 0) lo = p - L->sliding_window + 1 > 0 ? p - L->sliding_window + 1 : 0;
        }
        cr_assert(hi - lo <= 4096);
        double m = L->sinks ? (double)L->sinks[h] : -INFINITY;
        for (int32_t j = lo; j < hi; j++) {
          double dot = 0;
          for (int32_t d = 0; d < D; d++)
            dot += oracle_load(e->t.q, L->dtype, ((size_t)row * (size_t)Hq + (size_t)h) * (size_t)D + (size_t)d) *
                   key_elem(e, false, r, j, g, d);
          double x = (double)L->scale * dot;
          if (L->soft_cap > 0) x = (double)L->soft_cap * tanh(x / (double)L->soft_cap);
          if (L->alibi_slopes) x += (double)L->alibi_slopes[h] * (double)(j - p);
          logit[j - lo] = x;
          if (x > m) m = x;
        }
        double *o = out + ((size_t)row * (size_t)Hq + (size_t)h) * (size_t)D;
        double z = 0;
        for (int32_t d = 0; d < D; d++) o[d] = 0;
        if (m != -INFINITY) {
          for (int32_t j = lo; j < hi; j++) {
            const double w = exp(logit[j - lo] - m);
            z += w;
            for (int32_t d = 0; d < D; d++) o[d] += w * key_elem(e, true, r, j, g, d);
          }
          if (L->sinks) z += exp((double)L->sinks[h] - m);
        }
        for (int32_t d = 0; d < D; d++) o[d] = z == 0 ? 0 : o[d] / z;
        lse[(size_t)row * (size_t)Hq + (size_t)h] = z == 0 ? m : m + log(z);
      }
    }
  }
  free(logit);
}

/* A random step: up to 6 requests mixing decodes, drafts, chunked prefills, fresh prefills and empty ones;
 * random heads, head_dim (not only multiples of 16), dtypes, layout (TILED where the block size and head dim
 * allow it), window, cap, ALiBi, sinks, type. */
static void random_env(env *e, test_rng *rng, int32_t max_len, float *sinks, float *slopes) {
  const int32_t hkv = test_rng_range(rng, 1, 3), group = test_rng_range(rng, 1, 4);
  const int32_t D = (int32_t[]){1, 3, 8, 16, 20, 33}[test_rng_range(rng, 0, 5)];
  uattn_layer L = layer(hkv * group, hkv, D, (uattn_dtype)test_rng_range(rng, 0, 2));
  L.cache_dtype = (uattn_dtype)test_rng_range(rng, 0, 2);
  L.kv_layout = (uattn_kv_layout)test_rng_range(rng, 0, 1);
  const int32_t bs = (int32_t[]){1, 2, 4, 16}[test_rng_range(rng, 0, 3)];
  if (bs % 16 == 0 && D % 2 == 0 && test_rng_range(rng, 0, 2) > 0) L.kv_layout = UATTN_LAYOUT_TILED;
  L.scale = (float)(0.3 + test_rng_unit(rng));
  const int32_t type = test_rng_range(rng, 0, 5);
  L.attn_type = type <= 2 ? UATTN_ATTENTION_DECODER : type - 2; /* decoder half the time */
  if (test_rng_range(rng, 0, 2) == 0) L.sliding_window = test_rng_range(rng, 1, 40);
  if (test_rng_range(rng, 0, 2) == 0) L.soft_cap = (float)(1 + 10 * test_rng_unit(rng));
  for (int32_t h = 0; h < L.num_q_heads; h++) {
    sinks[h] = (float)(4 * test_rng_unit(rng) - 2);
    slopes[h] = (float)(0.5 * test_rng_unit(rng));
  }
  if (test_rng_range(rng, 0, 2) == 0) L.sinks = sinks;
  if (test_rng_range(rng, 0, 2) == 0) L.alibi_slopes = slopes;
  const int32_t R = test_rng_range(rng, 1, 6);
  int32_t nc[MAXR] = {0}, ns[MAXR] = {0}, enc[MAXR] = {0};
  for (int32_t r = 0; r < R; r++) {
    const int kind = test_rng_range(rng, 0, 4);
    nc[r] = kind == 0 ? 0 : test_rng_range(rng, 0, max_len);
    ns[r] = kind == 1            ? 1
            : kind == 2          ? test_rng_range(rng, 2, 4)
            : kind == 4 && r > 0 ? 0
                                 : test_rng_range(rng, 1, max_len);
    enc[r] = test_rng_range(rng, 0, max_len);
  }
  env_init(e, L, R, nc, ns, enc, bs, test_rng_next(rng));
  /* history in the caches, this step's q/k/v; NaN in the caches wherever nothing was placed */
  double x[64], y[64];
  for (int32_t r = 0; r < R; r++) {
    const bool cross = L.attn_type == UATTN_ATTENTION_ENCODER_DECODER;
    for (int32_t j = 0; j < (cross ? enc[r] : nc[r]); j++)
      for (int32_t g = 0; g < hkv; g++) {
        for (int32_t d = 0; d < D; d++) x[d] = 2 * test_rng_unit(rng) - 1, y[d] = 4 * test_rng_unit(rng) - 2;
        set_cache(e, cross, r, j, g, x, y);
      }
  }
  for (int32_t row = 0; row < e->T; row++) {
    for (int32_t g = 0; g < hkv; g++) {
      for (int32_t d = 0; d < D; d++) x[d] = 2 * test_rng_unit(rng) - 1, y[d] = 4 * test_rng_unit(rng) - 2;
      set_kv(e, row, g, x, y);
    }
    for (int32_t h = 0; h < L.num_q_heads; h++) {
      for (int32_t d = 0; d < D; d++) x[d] = 3 * test_rng_unit(rng) - 1.5;
      set_q(e, row, h, x);
    }
  }
}

static void compare_with_plain(const env *e, int case_no) {
  const size_t n = (size_t)e->T * (size_t)e->L.num_q_heads;
  double *out = malloc((n * (size_t)e->L.head_dim + 1) * sizeof *out), *lse = malloc((n + 1) * sizeof *lse);
  plain_attention(e, out, lse);
  for (size_t i = 0; i < n * (size_t)e->L.head_dim; i++)
    cr_assert(fabs(e->out[i] - out[i]) <= 1e-13 * (1 + fabs(out[i])), "case %d: out[%zu] = %.17g, plain %.17g", case_no,
              i, e->out[i], out[i]);
  for (size_t i = 0; i < n; i++) {
    if (isinf(lse[i]))
      cr_assert(e->lse[i] == lse[i], "case %d: lse[%zu] = %g, plain %g", case_no, i, e->lse[i], lse[i]);
    else
      cr_assert(fabs(e->lse[i] - lse[i]) <= 1e-13 * (1 + fabs(lse[i])), "case %d: lse[%zu] = %.17g, plain %.17g",
                case_no, i, e->lse[i], lse[i]);
  }
  free(out);
  free(lse);
}

/* num_cases random steps of requests up to max_len long, drawn from seed, each against the plain loops. */
static void random_steps_against_plain(uint64_t seed, int num_cases, int32_t max_len) {
  test_rng rng = {seed};
  float sinks[16], slopes[16];
  for (int c = 0; c < num_cases; c++) {
    env e;
    random_env(&e, &rng, max_len, sinks, slopes);
    env_run(&e);
    compare_with_plain(&e, c);
    env_free(&e);
  }
}

Test(plain, random_steps_small) { random_steps_against_plain(2024, 150, 20); }

Test(plain, random_steps_past_tiles_and_key_blocks) {
  /* long enough that rows span several 16-item tiles, 32-key blocks and 1024-item units */
  random_steps_against_plain(77, 6, 300);
}

Test(plain, row_samples_and_thread_counts_change_no_bit) {
  test_rng rng = {5};
  float sinks[16], slopes[16];
  for (int c = 0; c < 10; c++) {
    env e;
    random_env(&e, &rng, 120, sinks, slopes);
    if (e.T == 0) {
      env_free(&e);
      continue;
    }
    oracle_set_num_threads(1);
    env_run(&e);
    const size_t hq = (size_t)e.L.num_q_heads, D = (size_t)e.L.head_dim, n = (size_t)e.T * hq;
    const size_t cap = (size_t)(e.T > 8 ? e.T : 8) * hq; /* the full answer, or 8 sampled rows */
    double *out = malloc(cap * D * sizeof *out), *lse = malloc(cap * sizeof *lse);
    oracle_set_num_threads(3);
    cr_assert_eq(oracle_attention(&e.s, &e.L, &e.t, out, lse), 0, "%s", oracle_last_error());
    cr_assert(memcmp(out, e.out, n * D * sizeof *out) == 0 && memcmp(lse, e.lse, n * sizeof *lse) == 0,
              "case %d: 1 and 3 threads differ", c);
    /* a shuffled sample with a repeat */
    int32_t rows[8];
    for (int i = 0; i < 7; i++) rows[i] = test_rng_range(&rng, 0, e.T - 1);
    rows[7] = rows[0];
    cr_assert_eq(oracle_attention_rows(&e.s, &e.L, &e.t, 8, rows, out, lse), 0, "%s", oracle_last_error());
    for (int i = 0; i < 8; i++) {
      cr_assert(memcmp(out + (size_t)i * hq * D, e.out + (size_t)rows[i] * hq * D, hq * D * sizeof *out) == 0 &&
                    memcmp(lse + (size_t)i * hq, e.lse + (size_t)rows[i] * hq, hq * sizeof *lse) == 0,
                "case %d: sampled row %d differs", c, rows[i]);
    }
    oracle_set_num_threads(0);
    free(out);
    free(lse);
    env_free(&e);
  }
}

/* ================================================================================================ */
/* inputs the oracle refuses                                                                          */
/* ================================================================================================ */

#define OUT_SENTINEL 12345.0

/* A small valid step (2 requests, bs 2; request 0 has 3 cached keys) to break one thing at a time. */
static void bad_base(env *e) {
  env_init(e, layer(2, 1, 2, UATTN_F32), 2, (int32_t[]){3, 0}, (int32_t[]){1, 2}, (int32_t[]){1, 1}, 2, 31);
  zero_keys_step(e, 0, true);
  zero_keys_step(e, 1, true);
}

/* write_cache and attention on a broken step: each that must fail returns -1 with a message; the caches
 * never change when write_cache fails, nor out/lse when attention does. */
static void expect_refused(env *e, const oracle_step *s, const char *why, bool write_fails, bool attn_fails) {
  const size_t bytes = e->cache_elems * 4; /* the base is f32 */
  void *kc = malloc(bytes), *vc = malloc(bytes);
  memcpy(kc, e->kc, bytes);
  memcpy(vc, e->vc, bytes);
  const size_t n = (size_t)e->T * 2;
  for (size_t i = 0; i < n * 2; i++) e->out[i] = OUT_SENTINEL;
  for (size_t i = 0; i < n; i++) e->lse[i] = OUT_SENTINEL;
  oracle_set_num_threads(0);
  const int w = oracle_write_cache(s, &e->L, &e->t);
  if (write_fails) {
    cr_assert(w == -1 && oracle_last_error()[0] != '\0', "%s: write_cache returned %d", why, w);
    cr_assert(memcmp(kc, e->kc, bytes) == 0 && memcmp(vc, e->vc, bytes) == 0, "%s: the caches changed", why);
  } else {
    cr_assert(w == 0, "%s: write_cache failed: %s", why, oracle_last_error());
  }
  const int a = oracle_attention(s, &e->L, &e->t, e->out, e->lse);
  if (attn_fails) {
    cr_assert(a == -1 && oracle_last_error()[0] != '\0', "%s: attention returned %d", why, a);
    for (size_t i = 0; i < n * 2; i++) cr_assert(e->out[i] == OUT_SENTINEL, "%s: out changed", why);
    for (size_t i = 0; i < n; i++) cr_assert(e->lse[i] == OUT_SENTINEL, "%s: lse changed", why);
  } else {
    cr_assert(a == 0, "%s: attention failed: %s", why, oracle_last_error());
  }
  free(kc);
  free(vc);
}

/* A fresh base, one statement that breaks it, then the verdicts. */
#define REFUSE_CASE(why, write_fails, attn_fails, ...)                                                                 \
  do {                                                                                                                 \
    env e_;                                                                                                            \
    bad_base(&e_);                                                                                                     \
    env *e = &e_;                                                                                                      \
    __VA_ARGS__;                                                                                                       \
    expect_refused(e, &e->s, why, write_fails, attn_fails);                                                            \
    env_free(&e_);                                                                                                     \
  } while (0)

Test(refuse, bad_inputs_fail_with_a_message_and_write_nothing) {
  {
    env e;
    bad_base(&e);
    env_run(&e); /* the base itself is fine */
    expect_refused(&e, NULL, "null step", true, true);
    env_free(&e);
  }
  REFUSE_CASE("Hq not a multiple of Hkv", true, true, e->L.num_kv_heads = 3);
  REFUSE_CASE("zero head_dim", true, true, e->L.head_dim = 0);
  REFUSE_CASE("bad dtype", true, true, e->L.dtype = (uattn_dtype)9);
  REFUSE_CASE("bad cache dtype", true, true, e->L.cache_dtype = (uattn_dtype)9);
  REFUSE_CASE("bad layout", true, true, e->L.kv_layout = (uattn_kv_layout)3);
  REFUSE_CASE("TILED on block size 2", true, true, e->L.kv_layout = UATTN_LAYOUT_TILED);
  REFUSE_CASE("bad attn_type", true, true, e->L.attn_type = 4);
  REFUSE_CASE("negative num_scheduled", true, true, e->ns[1] = -1);
  REFUSE_CASE("negative num_computed", true, true, e->nc[0] = -1);
  REFUSE_CASE("zero block size", true, true, e->s.block_size = 0);
  /* request 0's column 1 holds p = 2 (read) and p = 3 (written) */
  REFUSE_CASE("block id past num_blocks", true, true, e->bt[1] = e->nb);
  REFUSE_CASE("block table too short", true, true, e->s.block_table_stride = 1);
  REFUSE_CASE("null block table", true, true, e->s.block_table = NULL);
  REFUSE_CASE("null caches", true, true, e->t.key_cache = NULL; e->t.value_cache = NULL);
  REFUSE_CASE("null k", true, true, e->t.k = NULL);
  REFUSE_CASE("null q", false, true, e->t.q = NULL);
  /* attention reads every key from the cache, this step's as written: a broken block under them is both
   * functions' to refuse, two tokens written to one slot write_cache's */
  REFUSE_CASE("negative block id, written", true, true, e->bt[e->stride] = -1);
  REFUSE_CASE("two tokens on one slot", true, false, e->nc[1] = 2; e->bt[e->stride + 1] = e->bt[1]);
  /* ... and a bad block under cached keys only is attention's */
  REFUSE_CASE("negative block id, read only", false, true, e->bt[0] = -5);
}

/* TILED needs whole 16-key tiles and dim pairs: block sizes 8 and 24 and an odd head dim are refused by
 * write_cache and attention alike, with a message naming the layout, the caches and outputs untouched; the
 * same steps on NHD, and TILED on block 16 and 32 with an even head dim, are fine. */
Test(refuse, tiled_needs_whole_tiles_and_dim_pairs) {
  const struct {
    int32_t bs, D;
    bool ok;
  } cases[] = {{8, 2, false}, {24, 2, false}, {16, 3, false}, {32, 5, false}, {16, 2, true}, {32, 4, true}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    env e;
    uattn_layer L = layer(2, 1, cases[i].D, UATTN_F32);
    L.kv_layout = UATTN_LAYOUT_TILED;
    env_init(&e, L, 2, (int32_t[]){20, 0}, (int32_t[]){1, 3}, NULL, cases[i].bs, 32);
    const size_t bytes = e.cache_elems * 4, n = (size_t)e.T * 2;
    void *kc = malloc(bytes), *vc = malloc(bytes);
    memcpy(kc, e.kc, bytes);
    memcpy(vc, e.vc, bytes);
    for (size_t x = 0; x < n * (size_t)cases[i].D; x++) e.out[x] = OUT_SENTINEL;
    const int w = oracle_write_cache(&e.s, &e.L, &e.t);
    if (cases[i].ok) {
      cr_assert_eq(w, 0, "bs %d D %d: %s", cases[i].bs, cases[i].D, oracle_last_error());
      cr_assert_eq(oracle_attention(&e.s, &e.L, &e.t, e.out, e.lse), 0, "%s", oracle_last_error());
    } else {
      cr_assert_eq(w, -1, "bs %d D %d: write_cache accepted TILED", cases[i].bs, cases[i].D);
      cr_assert(strstr(oracle_last_error(), "TILED") != NULL, "%s", oracle_last_error());
      cr_assert(memcmp(kc, e.kc, bytes) == 0 && memcmp(vc, e.vc, bytes) == 0, "bs %d D %d: the caches changed",
                cases[i].bs, cases[i].D);
      cr_assert_eq(oracle_attention(&e.s, &e.L, &e.t, e.out, e.lse), -1, "bs %d D %d: attention accepted TILED",
                   cases[i].bs, cases[i].D);
      cr_assert(strstr(oracle_last_error(), "TILED") != NULL, "%s", oracle_last_error());
      for (size_t x = 0; x < n * (size_t)cases[i].D; x++)
        cr_assert(e.out[x] == OUT_SENTINEL, "bs %d D %d: out changed", cases[i].bs, cases[i].D);
      e.L.kv_layout = UATTN_LAYOUT_NHD;
      cr_assert_eq(oracle_write_cache(&e.s, &e.L, &e.t), 0, "NHD: %s", oracle_last_error());
      cr_assert_eq(oracle_attention(&e.s, &e.L, &e.t, e.out, e.lse), 0, "NHD: %s", oracle_last_error());
    }
    free(kc);
    free(vc);
    env_free(&e);
  }
}

Test(refuse, cross_and_row_selection) {
  {
    env e;
    bad_base(&e);
    e.L.attn_type = UATTN_ATTENTION_ENCODER_DECODER;
    e.t.cross = NULL;
    cr_assert_eq(oracle_attention(&e.s, &e.L, &e.t, e.out, e.lse), -1);
    e.t.cross = &e.cross;
    e.cbt[0] = e.nb + 4;
    cr_assert_eq(oracle_attention(&e.s, &e.L, &e.t, e.out, e.lse), -1);
    cr_assert(strstr(oracle_last_error(), "cross") != NULL, "%s", oracle_last_error());
    e.cbt[0] = 0;
    e.enc[1] = -1;
    cr_assert_eq(oracle_attention(&e.s, &e.L, &e.t, e.out, e.lse), -1);
    e.enc[1] = 1;
    cr_assert_eq(oracle_attention(&e.s, &e.L, &e.t, e.out, e.lse), 0, "%s", oracle_last_error());
    env_free(&e);
  }
  {
    env e;
    bad_base(&e);
    cr_assert_eq(oracle_attention_rows(&e.s, &e.L, &e.t, 1, (int32_t[]){3}, e.out, e.lse), -1);
    cr_assert_eq(oracle_attention_rows(&e.s, &e.L, &e.t, 1, (int32_t[]){-1}, e.out, e.lse), -1);
    cr_assert_eq(oracle_attention_rows(&e.s, &e.L, &e.t, 2, NULL, e.out, e.lse), -1);
    cr_assert_eq(oracle_attention(&e.s, &e.L, &e.t, NULL, e.lse), -1);
    cr_assert_eq(oracle_attention_rows(&e.s, &e.L, &e.t, 0, NULL, e.out, e.lse), 0);
    cr_assert_eq(oracle_attention(&e.s, &e.L, &e.t, e.out, NULL), 0, "lse is optional: %s", oracle_last_error());
    env_free(&e);
  }
}
