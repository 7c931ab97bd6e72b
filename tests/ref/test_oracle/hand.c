/* The oracle on steps a reader can check by hand: one key, equal scores, a 1:3 softmax, causal rows, windows,
 * sinks, soft cap, ALiBi, GQA, encoder and cross masks, every cache dtype and layout. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/support.h"
#include "env.h"
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
