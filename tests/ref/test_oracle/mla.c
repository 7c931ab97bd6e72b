/* Multi-head latent attention in the oracle, by hand: values of another width than the keys (head_dim_v) in the
 * caches' indices, the cache update and the output's rows; latents whose first head_dim_v dims are their values
 * (kv_latent), read from the key cache alone with the key's scale; and the layers the oracle refuses. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/support.h"
#include "env.h"

/* Value rows are Dv long in every layout; a latent's value is its key's element. */
Test(mla, value_cache_index_by_hand) {
  uattn_layer L = layer(2, 2, 4, UATTN_F32);
  L.head_dim_v = 6;
  L.kv_layout = UATTN_LAYOUT_NHD;
  cr_assert_eq(oracle_cache_index(&L, 32, 17, 1, 3, false), (size_t)(17 * 2 + 1) * 4 + 3);
  cr_assert_eq(oracle_cache_index(&L, 32, 17, 1, 5, true), (size_t)(17 * 2 + 1) * 6 + 5);
  L.kv_layout = UATTN_LAYOUT_HND;
  cr_assert_eq(oracle_cache_index(&L, 32, 49, 1, 2, false), (size_t)((1 * 2 + 1) * 32 + 17) * 4 + 2);
  cr_assert_eq(oracle_cache_index(&L, 32, 49, 1, 2, true), (size_t)((1 * 2 + 1) * 32 + 17) * 6 + 2);
  /* TILED values [nb, bs/16, Hkv, 8, Dv, 2]: a (block, tile, head) group holds 16 * Dv values; slot 17 of bs 32
   * is key 1 of tile 1 of block 0, so group (0 * 2 + 1) * 2 + 1 = 3, key pair 0, odd key */
  L.kv_layout = UATTN_LAYOUT_TILED;
  cr_assert_eq(oracle_cache_index(&L, 32, 17, 1, 5, true), (size_t)3 * 16 * 6 + 0 * 12 + 5 * 2 + 1);
  /* slot 94: block 2, tile 1, key 14 (pair 7, even), head 1: group (2 * 2 + 1) * 2 + 1 = 11 */
  cr_assert_eq(oracle_cache_index(&L, 32, 94, 1, 4, true), (size_t)11 * 96 + 7 * 12 + 4 * 2);
  /* the keys keep their own width: pair 1 of key 14 of group 11 */
  cr_assert_eq(oracle_cache_index(&L, 32, 94, 1, 2, false), (size_t)11 * 64 + 1 * 32 + 14 * 2);
  /* a latent's value dim d is the key's dim d, in each of NHD and HND */
  L.head_dim_v = 3, L.kv_latent = true;
  for (int lay = UATTN_LAYOUT_NHD; lay <= UATTN_LAYOUT_HND; lay++) {
    L.kv_layout = (uattn_kv_layout)lay;
    for (int32_t d = 0; d < 3; d++)
      cr_assert_eq(oracle_cache_index(&L, 32, 49, 1, d, true), oracle_cache_index(&L, 32, 49, 1, d, false));
  }
}

/* Values 3 wide under keys 2 wide, two heads on one KV head: the one key's value is each head's output, rows of
 * 3; and the cache update writes the 3 value elements where the Dv-wide layout puts them. */
Test(mla, wider_values_one_key) {
  for (int lay = UATTN_LAYOUT_NHD; lay <= UATTN_LAYOUT_HND; lay++) {
    env e;
    uattn_layer L = layer(2, 1, 2, UATTN_F32);
    L.head_dim_v = 3, L.kv_layout = (uattn_kv_layout)lay;
    env_init(&e, L, 1, (int32_t[]){0}, (int32_t[]){1}, NULL, 4, 40);
    set_q(&e, 0, 0, (double[]){1, 2});
    set_q(&e, 0, 1, (double[]){-1, 0.5});
    set_kv(&e, 0, 0, (double[]){3, 4}, (double[]){7, -8, 9});
    env_run(&e);
    expect_out(&e, 0, 0, (double[]){7, -8, 9}, 0);
    expect_out(&e, 0, 1, (double[]){7, -8, 9}, 0);
    expect_lse(&e, 0, 0, 11, 0); /* 1 * 3 + 2 * 4, scale 1 */
    expect_lse(&e, 0, 1, -1, 0);
    const int64_t slot = slot_of(&e, false, 0, 0);
    const float want[3] = {7, -8, 9};
    for (int32_t d = 0; d < 3; d++) /* one KV head: slot * Dv + d in both layouts */
      cr_assert_eq(((const float *)e.vc)[(size_t)slot * 3 + (size_t)d], want[d], "layout %d: value dim %d", lay, d);
    env_free(&e);
  }
}

/* Values narrower than the keys over two keys of a 1:3 softmax: row 1's output is v0 / 4 + 3 v1 / 4, 2 wide. */
Test(mla, narrower_values_two_keys) {
  env e;
  uattn_layer L = layer(1, 1, 3, UATTN_F32);
  L.head_dim_v = 2;
  env_init(&e, L, 1, (int32_t[]){1}, (int32_t[]){1}, NULL, 4, 41);
  const double ln3 = (double)(float)log(3.0);
  set_q(&e, 0, 0, (double[]){ln3, 0, 0});
  set_cache(&e, false, 0, 0, 0, (double[]){0, 5, 5}, (double[]){4, 8});
  set_kv(&e, 0, 0, (double[]){1, 0, 0}, (double[]){8, -4});
  env_run(&e);
  const double w = exp(ln3) / (1 + exp(ln3));
  expect_out(&e, 0, 0, (double[]){4 * (1 - w) + 8 * w, 8 * (1 - w) - 4 * w}, 1e-14);
  expect_lse(&e, 0, 0, log1p(exp(ln3)), 1e-15);
  env_free(&e);
}

/* A latent of 4 dims whose first 2 are its value: one cached latent and this step's, scores 0 and ln 3; the
 * output is the weighted latents' first 2 dims, no v and no value cache; the cache update writes the key alone. */
Test(mla, latent_values_are_the_keys_first_dims) {
  for (int lay = UATTN_LAYOUT_NHD; lay <= UATTN_LAYOUT_HND; lay++) {
    env e;
    uattn_layer L = layer(2, 1, 4, UATTN_F32);
    L.head_dim_v = 2, L.kv_latent = true, L.kv_layout = (uattn_kv_layout)lay;
    env_init(&e, L, 1, (int32_t[]){1}, (int32_t[]){1}, NULL, 4, 42);
    e.t.v = NULL, e.t.value_cache = NULL;
    const double ln3 = (double)(float)log(3.0);
    set_q(&e, 0, 0, (double[]){0, 0, 0, 1}); /* head 0 reads dim 3: scores 0 and ln 3 */
    set_q(&e, 0, 1, (double[]){0, 0, 1, 0}); /* head 1 reads dim 2: scores 0 and 0 */
    set_cache(&e, false, 0, 0, 0, (double[]){2, -6, 0, 0}, NULL);
    set_kv(&e, 0, 0, (double[]){10, 6, 0, ln3}, NULL);
    env_run(&e);
    const double w = exp(ln3) / (1 + exp(ln3));
    expect_out(&e, 0, 0, (double[]){2 * (1 - w) + 10 * w, -6 * (1 - w) + 6 * w}, 1e-14);
    expect_lse(&e, 0, 0, log1p(exp(ln3)), 1e-15);
    expect_out(&e, 0, 1, (double[]){6, 0}, 1e-15);
    expect_lse(&e, 0, 1, log(2), 1e-15);
    const int64_t slot = slot_of(&e, false, 0, 1);
    const float want[4] = {10, 6, 0, (float)ln3};
    for (int32_t d = 0; d < 4; d++)
      cr_assert_eq(((const float *)e.kc)[slot_index(&e, slot, 0, d, false)], want[d], "layout %d: key dim %d", lay, d);
    env_free(&e);
  }
}

/* On an fp8 cache a latent's value is its code times k_scale (== v_scale), the step's own too. */
Test(mla, latent_fp8_reads_with_the_key_scale) {
  env e;
  uattn_layer L = layer(1, 1, 2, UATTN_F32);
  L.cache_dtype = UATTN_FP8_E4M3, L.head_dim_v = 1, L.kv_latent = true, L.k_scale = L.v_scale = 0.25f;
  env_init(&e, L, 1, (int32_t[]){0}, (int32_t[]){1}, NULL, 4, 43);
  e.t.v = NULL, e.t.value_cache = NULL;
  set_q(&e, 0, 0, (double[]){0, 0});
  set_kv(&e, 0, 0, (double[]){1.3, 0.5}, NULL); /* 1.3 / 0.25 = 5.2: e4m3 holds 5 (0.5 apart in [4, 8)) */
  env_run(&e);
  expect_out(&e, 0, 0, (double[]){5 * 0.25}, 0);
  expect_lse(&e, 0, 0, 0, 0);
  env_free(&e);
}

/* The layers a latent cannot be: each refused by both functions with a message, nothing written. */
Test(mla, refused_layers) {
  const struct {
    const char *why;
    int32_t dv;
    bool latent;
    uattn_kv_layout layout;
    uattn_dtype cache;
    float ks, vs;
    bool v, vc;
  } cases[] = {
      {"negative head_dim_v", -1, false, UATTN_LAYOUT_NHD, UATTN_F32, 1, 1, true, true},
      {"negative head_dim_v, latent", -2, true, UATTN_LAYOUT_NHD, UATTN_F32, 1, 1, false, false},
      {"latent head_dim_v 0", 0, true, UATTN_LAYOUT_NHD, UATTN_F32, 1, 1, false, false},
      {"latent head_dim_v past head_dim", 3, true, UATTN_LAYOUT_NHD, UATTN_F32, 1, 1, false, false},
      {"latent on TILED", 2, true, UATTN_LAYOUT_TILED, UATTN_F32, 1, 1, false, false},
      {"latent with a v", 1, true, UATTN_LAYOUT_NHD, UATTN_F32, 1, 1, true, false},
      {"latent with a value cache", 1, true, UATTN_LAYOUT_HND, UATTN_F32, 1, 1, false, true},
      {"latent fp8, scales apart", 1, true, UATTN_LAYOUT_NHD, UATTN_FP8_E5M2, 0.5f, 2.0f, false, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    env e;
    uattn_layer L = layer(2, 1, 2, UATTN_F32);
    env_init(&e, L, 1, (int32_t[]){20}, (int32_t[]){2}, NULL, 16, 44);
    set_kv(&e, 0, 0, (double[]){1, 2}, (double[]){3, 4});
    set_kv(&e, 1, 0, (double[]){1, 2}, (double[]){3, 4});
    e.L.head_dim_v = cases[i].dv, e.L.kv_latent = cases[i].latent, e.L.kv_layout = cases[i].layout;
    e.L.cache_dtype = cases[i].cache, e.L.k_scale = cases[i].ks, e.L.v_scale = cases[i].vs;
    if (!cases[i].v) e.t.v = NULL;
    if (!cases[i].vc) e.t.value_cache = NULL;
    const size_t bytes = e.cache_elems * 4;
    void *kc = malloc(bytes), *vc = malloc(bytes);
    memcpy(kc, e.kc, bytes);
    memcpy(vc, e.vc, bytes);
    for (size_t x = 0; x < (size_t)e.T * 2 * 2; x++) e.out[x] = 12345.0;
    cr_assert_eq(oracle_write_cache(&e.s, &e.L, &e.t), -1, "%s: write_cache accepted it", cases[i].why);
    cr_assert(oracle_last_error()[0] != '\0', "%s: no message", cases[i].why);
    cr_assert(memcmp(kc, e.kc, bytes) == 0 && memcmp(vc, e.vc, bytes) == 0, "%s: the caches changed", cases[i].why);
    cr_assert_eq(oracle_attention(&e.s, &e.L, &e.t, e.out, e.lse), -1, "%s: attention accepted it", cases[i].why);
    for (size_t x = 0; x < (size_t)e.T * 2 * 2; x++) cr_assert(e.out[x] == 12345.0, "%s: out changed", cases[i].why);
    free(kc);
    free(vc);
    env_free(&e);
  }
  /* the same step as a right latent layer is fine */
  env e;
  uattn_layer L = layer(2, 1, 2, UATTN_F32);
  L.head_dim_v = 2, L.kv_latent = true;
  env_init(&e, L, 1, (int32_t[]){0}, (int32_t[]){2}, NULL, 16, 45);
  e.t.v = NULL, e.t.value_cache = NULL;
  set_kv(&e, 0, 0, (double[]){1, 2}, NULL);
  set_kv(&e, 1, 0, (double[]){1, 2}, NULL);
  env_run(&e);
  env_free(&e);
}
