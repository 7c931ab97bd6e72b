/* The oracle's tiled, threaded loops against a plain re-statement written here (one row, one head, one key at
 * a time) on random steps with every feature on; row samples and thread counts change no bit. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/support.h"
#include "env.h"
/* ================================================================================================ */
/* a plain re-statement, against the oracle's tiled and threaded loops                               */
/* ================================================================================================ */

/* Key (or value) j of request r as the cache holds it after the step: every key, this step's too. A kv_latent
 * layer's value dim d is its key's dim d. */
static double key_elem(const env *e, bool v, int32_t r, int32_t j, int32_t g, int32_t d) {
  const bool cross = e->L.attn_type == UATTN_ATTENTION_ENCODER_DECODER;
  if (e->L.kv_latent) v = false;
  const size_t at = slot_index(e, slot_of(e, cross, r, j), g, d, v);
  return oracle_load(v ? e->t.value_cache : e->t.key_cache, e->L.cache_dtype, at);
}

/* docs/design.md's semantics, one (row, head, key) at a time. */
static void plain_attention(const env *e, double *out, double *lse) {
  const uattn_layer *L = &e->L;
  const int32_t Hq = L->num_q_heads, D = L->head_dim, Dv = oracle_value_dim(L), group = Hq / L->num_kv_heads;
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
        double *o = out + ((size_t)row * (size_t)Hq + (size_t)h) * (size_t)Dv;
        double z = 0;
        for (int32_t d = 0; d < Dv; d++) o[d] = 0;
        if (m != -INFINITY) {
          for (int32_t j = lo; j < hi; j++) {
            const double w = exp(logit[j - lo] - m);
            z += w;
            for (int32_t d = 0; d < Dv; d++) o[d] += w * key_elem(e, true, r, j, g, d);
          }
          if (L->sinks) z += exp((double)L->sinks[h] - m);
        }
        for (int32_t d = 0; d < Dv; d++) o[d] = z == 0 ? 0 : o[d] / z;
        lse[(size_t)row * (size_t)Hq + (size_t)h] = z == 0 ? m : m + log(z);
      }
    }
  }
  free(logit);
}

/* A random step: up to 6 requests mixing decodes, drafts, chunked prefills, fresh prefills and empty ones;
 * random heads, head_dim (not only multiples of 16), dtypes, layout (TILED where the block size and head dim
 * allow it), window, cap, ALiBi, sinks, type; with mla, a random head_dim_v and kv_latent half the time. */
static void random_env(env *e, test_rng *rng, int32_t max_len, float *sinks, float *slopes, bool mla) {
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
  if (mla) { /* drawn after everything else, so that the other steps' draws stay what they were */
    L.kv_latent = test_rng_range(rng, 0, 1);
    L.head_dim_v = L.kv_latent ? test_rng_range(rng, 1, D) : test_rng_range(rng, 1, 40);
    if (L.kv_latent && L.kv_layout == UATTN_LAYOUT_TILED) L.kv_layout = UATTN_LAYOUT_HND;
  }
  const int32_t W = D > oracle_value_dim(&L) ? D : oracle_value_dim(&L); /* the wider of keys and values */
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
  if (L.kv_latent) e->t.v = NULL, e->t.value_cache = NULL; /* no values of its own */
  /* history in the caches, this step's q/k/v; NaN in the caches wherever nothing was placed */
  double x[64], y[64];
  for (int32_t r = 0; r < R; r++) {
    const bool cross = L.attn_type == UATTN_ATTENTION_ENCODER_DECODER;
    for (int32_t j = 0; j < (cross ? enc[r] : nc[r]); j++)
      for (int32_t g = 0; g < hkv; g++) {
        for (int32_t d = 0; d < W; d++) x[d] = 2 * test_rng_unit(rng) - 1, y[d] = 4 * test_rng_unit(rng) - 2;
        set_cache(e, cross, r, j, g, x, y);
      }
  }
  for (int32_t row = 0; row < e->T; row++) {
    for (int32_t g = 0; g < hkv; g++) {
      for (int32_t d = 0; d < W; d++) x[d] = 2 * test_rng_unit(rng) - 1, y[d] = 4 * test_rng_unit(rng) - 2;
      set_kv(e, row, g, x, y);
    }
    for (int32_t h = 0; h < L.num_q_heads; h++) {
      for (int32_t d = 0; d < D; d++) x[d] = 3 * test_rng_unit(rng) - 1.5;
      set_q(e, row, h, x);
    }
  }
}

static void compare_with_plain(const env *e, int case_no) {
  const size_t n = (size_t)e->T * (size_t)e->L.num_q_heads, Dv = (size_t)oracle_value_dim(&e->L);
  double *out = malloc((n * Dv + 1) * sizeof *out), *lse = malloc((n + 1) * sizeof *lse);
  plain_attention(e, out, lse);
  for (size_t i = 0; i < n * Dv; i++)
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
static void random_steps_against_plain(uint64_t seed, int num_cases, int32_t max_len, bool mla) {
  test_rng rng = {seed};
  float sinks[16], slopes[16];
  for (int c = 0; c < num_cases; c++) {
    env e;
    random_env(&e, &rng, max_len, sinks, slopes, mla);
    env_run(&e);
    compare_with_plain(&e, c);
    env_free(&e);
  }
}

Test(plain, random_steps_small) { random_steps_against_plain(2024, 150, 20, false); }

Test(plain, random_steps_past_tiles_and_key_blocks) {
  /* long enough that rows span several 16-item tiles, 32-key blocks and 1024-item units */
  random_steps_against_plain(77, 6, 300, false);
}

/* Values of another width than the keys (head_dim_v) and latents whose first dims are their values (kv_latent). */
Test(plain, random_mla_steps) {
  random_steps_against_plain(58, 150, 20, true);
  random_steps_against_plain(59, 6, 300, true);
}

Test(plain, row_samples_and_thread_counts_change_no_bit) {
  test_rng rng = {5};
  float sinks[16], slopes[16];
  for (int c = 0; c < 10; c++) {
    env e;
    random_env(&e, &rng, 120, sinks, slopes, false);
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
